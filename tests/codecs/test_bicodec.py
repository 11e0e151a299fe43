"""BiCodec decoder: the official layout with random weights, loaded through the real path.

Measured here (random init, 200 tokens, N=50 new tokens per window): with left/right context
L=8/R=8 the relative RMS error against one pass is 4e-2, L=24/R=12 5e-3, L=40/R=20 5e-6
(the default), L=56/R=24 1e-6. The bounds below leave margin over the default.
"""

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import save_file

from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.codecs.bicodec import BiCodecCodec
from livekit.plugins.veena.codecs.bicodec_model import DEFAULT_CONFIG
from livekit.plugins.veena.pipeline.pacing import window_sizes
from livekit.plugins.veena.pipeline.windowing import WindowOptions

from ..helpers import decode_windows, every_size_windows, windowed_decode


@pytest.fixture(scope="session")
def bicodec_dir(tmp_path_factory):
    """The official layout: config.yaml (audio_tokenizer section) + model.safetensors, with
    old-style weight-norm names and encoder-side tensors a real checkpoint also holds."""
    d = tmp_path_factory.mktemp("BiCodec")
    torch.set_num_threads(2)
    state = BiCodecCodec.random(seed=3).model.state_dict()
    renamed = {k.replace(".parametrizations.weight.original0", ".weight_g")
                .replace(".parametrizations.weight.original1", ".weight_v"): v.contiguous()
               for k, v in state.items()}
    renamed["encoder.vocos_backbone.embed.weight"] = torch.zeros(4, 4, 7)
    renamed["speaker_encoder.speaker_encoder.fc.weight"] = torch.zeros(2, 2)
    save_file(renamed, str(d / "model.safetensors"))
    (d / "config.yaml").write_text(yaml.safe_dump({"audio_tokenizer": {
        **DEFAULT_CONFIG, "mel_params": {"sample_rate": 16000}}}))
    return d


@pytest.fixture(scope="session")
def bicodec(bicodec_dir):
    return BiCodecCodec.load(str(bicodec_dir))


def _tokens(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 8192, n), rng.integers(0, 4096, 32)


def test_loads_official_layout_and_shapes(bicodec, bicodec_dir):
    ref = BiCodecCodec.random(seed=3)
    sem, glob = _tokens(25)
    (a,) = bicodec.decode([CodecInput(sem, 0, 0, glob)])
    (b,) = ref.decode([CodecInput(sem, 0, 0, glob)])
    assert a.shape == (25 * 320,) and bicodec.sample_rate == 16000
    saved, loaded = ref.model.state_dict(), bicodec.model.state_dict()
    assert loaded.keys() == saved.keys()
    assert all(torch.equal(loaded[k], v) for k, v in saved.items()), "the saved weights, exactly"
    # the same weights in two instances: the audio agrees to float noise (oneDNN may pick
    # another algorithm for one of them, ~1e-6 here; a weight loaded wrong is ~1e-2)
    assert np.allclose(a, b, atol=1e-5)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert 38e6 < count(bicodec.model.prenet) < 41e6
    assert 51e6 < count(bicodec.model.decoder) < 54e6


def test_missing_decoder_tensors_fail_loudly(tmp_path, bicodec_dir):
    (tmp_path / "config.yaml").write_text((bicodec_dir / "config.yaml").read_text())
    save_file({"quantizer.codebook.weight": torch.zeros(8192, 8)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="lacks decoder tensors"):
        BiCodecCodec.load(str(tmp_path))


def test_receptive_field_is_bounded(bicodec):
    """Changing one token moves the audio only within its reach (prenet +-56 tokens of
    convolutions at 50 Hz, plus the wave generator's +-3141 samples)."""
    sem, glob = _tokens(160, 1)
    (a,) = bicodec.decode([CodecInput(sem, 0, 0, glob)])
    sem2 = sem.copy()
    sem2[80] = (sem2[80] + 1234) % 8192
    (b,) = bicodec.decode([CodecInput(sem2, 0, 0, glob)])
    changed = np.flatnonzero(np.abs(a - b) > 1e-7)
    reach = 56 * 320 + 3141
    assert changed.min() >= 80 * 320 - reach and changed.max() < 81 * 320 + reach


def test_speaker_globals_change_the_voice(bicodec):
    sem, glob = _tokens(20, 2)
    (a,) = bicodec.decode([CodecInput(sem, 0, 0, glob)])
    (b,) = bicodec.decode([CodecInput(sem, 0, 0, (glob + 7) % 4096)])
    assert np.abs(a - b).max() > 1e-4


@pytest.mark.slow  # a full-size BiCodec decode, many times
def test_windowed_matches_one_pass(bicodec):
    sem, glob = _tokens(150, 4)
    (one,) = bicodec.decode([CodecInput(sem, 0, 0, glob)])
    got, windows = windowed_decode(bicodec, sem, WindowOptions(first=10, new=50, left=40, right=20),
                                   0, 160, glob)
    assert len(got) == 150 * 320
    err = got - one
    assert np.sqrt(np.mean(err**2)) / np.sqrt(np.mean(one**2)) < 1e-4
    assert np.abs(err).max() < 1e-4
    # batched windows decode as alone
    w = windows[2]
    alone = bicodec.decode([CodecInput(sem[w.start:w.end], w.start, 0, glob)])[0]
    both = bicodec.decode([CodecInput(sem[w.start:w.end], w.start, 0, glob),
                           CodecInput(sem[w.start:w.end], w.start, 0, (glob + 1) % 4096)])[0]
    assert np.abs(alone - both).max() < 1e-5


@pytest.mark.slow  # a full-size BiCodec decode, many times
def test_every_listener_paced_size_matches_one_pass(bicodec):
    """Each window size the listener-paced planner can choose (10 .. 160 new tokens)."""
    opts = WindowOptions(first=10, new=50, left=40, right=20)
    sem, glob = _tokens(340, 5)
    (one,) = bicodec.decode([CodecInput(sem, 0, 0, glob)])
    windows = every_size_windows(opts, window_sizes(10, 160), len(sem))
    err = decode_windows(bicodec, sem, windows, 0, 160, glob) - one
    assert np.sqrt(np.mean(err**2)) / np.sqrt(np.mean(one**2)) < 1e-4
    assert np.abs(err).max() < 1e-4
