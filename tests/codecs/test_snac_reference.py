"""SNAC facts checked against outside references, not against this project's own code: the
installed ``snac`` package (its ``SNAC.encode``/``SNAC.decode`` and ``NoiseBlock``), and the
token layout as the Orpheus and Maya1 reference decoders write it (as literals here)."""

import copy

import numpy as np
import pytest
import torch
from snac import SNAC
from snac.layers import NoiseBlock

from livekit.plugins.veena.codecs import snac_noise
from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.codecs.snac import SNAC_24KHZ_CONFIG, SnacCodec
from livekit.plugins.veena.codecs.snac_noise import KeyedNoiseBlock, keyed_normal
from livekit.plugins.veena.models.profiles import ORPHEUS, VEENA
from livekit.plugins.veena.pipeline.parsing import SnacFramer, TokenTable

# hubertsiuzdak/snac_24khz config.json, as published on the model hub
HUB_SNAC_24KHZ = {
    "sampling_rate": 24000, "encoder_dim": 48, "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 1024, "decoder_rates": [8, 8, 4, 2], "attn_window_size": None,
    "codebook_size": 4096, "codebook_dim": 8, "vq_strides": [4, 2, 1], "noise": True,
    "depthwise": True,
}
AUDIO_BASE = 128266  # Orpheus and Maya1 reference code: <custom_token_10> = 128256 + 10


def _interleave_like_the_references(c0, c1, c2) -> list[int]:
    """One frame j is [c0[j], c1[2j], c2[4j], c2[4j+1], c1[2j+1], c2[4j+2], c2[4j+3]], the
    code at position p offset by AUDIO_BASE + p * 4096 (Orpheus' ``convert_to_audio``,
    Maya1's ``unpack_snac_from_7``), written out here without the project's tables."""
    ids = []
    for j in range(len(c0)):
        codes = [c0[j], c1[2 * j], c2[4 * j], c2[4 * j + 1], c1[2 * j + 1], c2[4 * j + 2],
                 c2[4 * j + 3]]
        ids += [AUDIO_BASE + p * 4096 + int(c) for p, c in enumerate(codes)]
    return ids


@pytest.fixture(scope="module")
def reference_snac():
    torch.manual_seed(11)
    return SNAC(**HUB_SNAC_24KHZ).eval()


def test_config_is_the_hub_config():
    assert SNAC_24KHZ_CONFIG == HUB_SNAC_24KHZ


@pytest.mark.parametrize("profile", [VEENA, ORPHEUS], ids=lambda p: p.name)
def test_profile_token_layout_is_the_reference_layout(profile):
    assert profile.audio_token_base == AUDIO_BASE
    assert profile.tokens_per_frame == 7 and profile.codebook_size == 4096
    assert 128258 in profile.stop_token_ids  # END_OF_SPEECH in both reference decoders


@torch.inference_mode()
def test_round_trip_through_snac_matches_snac_decode(reference_snac):
    """A clip encoded by ``SNAC.encode``, written as the references write tokens, parsed by
    our framer and decoded by our codec (noise off) is ``SNAC.decode`` of the same codes."""
    frames = 12
    t = torch.arange(frames * 2048) / 24000
    clip = (0.3 * torch.sin(2 * torch.pi * 220 * t) + 0.05 * torch.randn(len(t),
            generator=torch.Generator().manual_seed(3)))[None, None]
    c0, c1, c2 = reference_snac.encode(clip)
    assert (c0.shape[-1], c1.shape[-1], c2.shape[-1]) == (frames, 2 * frames, 4 * frames)

    ids = _interleave_like_the_references(c0[0].tolist(), c1[0].tolist(), c2[0].tolist())
    framer = SnacFramer(VEENA, TokenTable.for_snac(VEENA))
    parsed = np.stack(framer.feed(ids + [128258]))
    assert parsed.shape == (frames, 7) and framer.stats.stopped

    ours = SnacCodec(copy.deepcopy(reference_snac), noise=False)
    (got,) = ours.decode([CodecInput(parsed, 0, 5)])

    silent = copy.deepcopy(reference_snac)  # the reference with its noise switched off
    for module in silent.modules():
        if isinstance(module, NoiseBlock):
            module.forward = lambda x: x
    want = silent.decode([c0, c1, c2])[0, 0].numpy()
    assert got.shape == want.shape == (frames * 2048,)
    rel = np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want**2))
    assert rel < 1e-6, rel


@torch.inference_mode()
def test_keyed_noise_enters_as_snac_noise_block(monkeypatch, reference_snac):
    """With ``torch.randn`` pinned to return our keyed draw, snac's own NoiseBlock computes
    exactly what our keyed block computes: same place, same [B, 1, T] broadcast."""

    block = next(m for m in reference_snac.decoder.modules() if isinstance(m, NoiseBlock))
    keys = snac_noise.NoiseKeys()
    keys.seeds = torch.tensor([3, 99])
    keys.start_steps = torch.tensor([0, 40])
    keys.steps = 4
    keyed = KeyedNoiseBlock(block, salt=7919, keys=keys)
    x = torch.randn(2, block.linear.in_channels, 64, generator=torch.Generator().manual_seed(1))
    got = keyed(x)

    per_step = 64 // keys.steps
    steps = keys.start_steps[:, None] * per_step + torch.arange(64)
    draw = keyed_normal(keys.seeds, 7919, steps)[:, None, :]
    monkeypatch.setattr(torch, "randn", lambda shape, **kw: draw.reshape(shape))
    want = block(x)
    assert torch.equal(got, want)


def test_keyed_noise_is_standard_normal():
    """Like ``torch.randn``: mean 0, standard deviation 1, Gaussian tails."""

    draw = keyed_normal(torch.tensor([1, 2, 3, 4]), 7919, torch.arange(50_000)[None].expand(4, -1))
    x = draw.double().flatten()
    assert abs(x.mean().item()) < 0.01 and abs(x.std().item() - 1) < 0.01
    assert abs((x.abs() < 1).double().mean().item() - 0.6827) < 0.005
    assert abs((x.abs() < 2).double().mean().item() - 0.9545) < 0.003
    # another seed, salt or step: independent draws
    other = keyed_normal(torch.tensor([5]), 7919, torch.arange(50_000)[None]).double().flatten()
    assert abs(np.corrcoef(x[:50_000].numpy(), other.numpy())[0, 1]) < 0.02
