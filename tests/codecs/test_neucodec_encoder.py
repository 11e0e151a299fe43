"""NeuCodec's reference-clip encoder refuses what is not a clip it can encode, and a
checkpoint without its encoder tensors, with a clear ValueError; a tiny checkpoint written
with its encoder clones and decodes (equality with the official encoder:
``test_neucodec_golden``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.codecs.neucodec import NeuCodecCodec, write_tiny_checkpoint
from livekit.plugins.veena.codecs.neucodec_encoder import NeuCodecEncoder, kaiser_sinc_taps

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "neucodec"


@pytest.fixture(scope="module")
def encoder():
    return NeuCodecEncoder.load(str(GOLDEN))


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * 16000)) / 16000
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def test_codes_come_50_per_second_as_a_list_too(encoder):
    codes = encoder.encode_reference(tone(1.5), 16000)
    assert codes.shape == (75,) and codes.min() >= 0 and codes.max() < 65536
    assert encoder.encode(tone(1.5)) == codes.tolist()


@pytest.mark.parametrize("wav, rate, match", [
    (tone(2), 24000, "16000 Hz"),
    (tone(2), True, "16000 Hz"),
    (np.stack([tone(2), tone(2)]), 16000, "mono"),
    ((tone(2) * 1000).astype(np.int16), 16000, "float"),
    (tone(0.5), 16000, "1-30 s"),
    (tone(31), 16000, "1-30 s"),
    (np.zeros(32000, np.float32), 16000, "silent"),
    (np.where(np.arange(32000) == 7, np.nan, tone(2)).astype(np.float32), 16000, "NaN"),
])
def test_a_clip_it_cannot_encode_is_refused(encoder, wav, rate, match):
    with pytest.raises(ValueError, match=match):
        encoder.encode_reference(wav, rate)


def test_a_checkpoint_without_the_encoder_is_refused(tmp_path):
    state = torch.load(GOLDEN / "pytorch_model.bin", weights_only=True)
    torch.save({k: v for k, v in state.items() if not k.startswith("SemanticEncoder_module.")},
               tmp_path / "pytorch_model.bin")
    shutil.copytree(GOLDEN / "w2v-bert-2.0", tmp_path / "w2v-bert-2.0")
    with pytest.raises(ValueError, match="SemanticEncoder_module.final_conv.weight"):
        NeuCodecEncoder.load(str(tmp_path))


def test_the_published_filter_taps_are_the_kaiser_sinc_filter():
    state = torch.load(GOLDEN / "pytorch_model.bin", weights_only=True)
    filters = [v for k, v in state.items() if k.endswith(".filter")]
    assert len(filters) > 10
    for taps in filters:
        torch.testing.assert_close(taps.float(), kaiser_sinc_taps(), rtol=0, atol=1e-7)


def test_a_tiny_checkpoint_with_its_encoder_clones_and_decodes(tmp_path):
    write_tiny_checkpoint(tmp_path, seed=5, encoder=True)
    codes = NeuCodecEncoder.load(str(tmp_path)).encode_reference(tone(2.0), 16000)
    assert codes.shape == (100,) and codes.min() >= 0 and codes.max() < 65536
    codec = NeuCodecCodec.load(str(tmp_path))
    (audio,) = codec.decode([CodecInput(codes=codes, start_step=0, seed=0)])
    assert audio.shape == (100 * 480,) and np.isfinite(audio).all()
