"""NeuCodec as a pipeline codec: its tiny checkpoint loads through the published layout,
windows decode alone or batched alike, the reference's codes as left context are decoded
but not returned, and bad checkpoints or codes are refused with the tensor named."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.codecs.neucodec import NeuCodecCodec, write_tiny_checkpoint
from livekit.plugins.veena.codecs.neucodec_model import CONFIG_FILE, NeuCodecConfig


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("neucodec"), seed=3)


@pytest.fixture(scope="module")
def codec(tiny_dir):
    return NeuCodecCodec.load(str(tiny_dir))


def window(codes, context=0):
    return CodecInput(codes=np.asarray(codes, np.int64), start_step=0, seed=0,
                      context_steps=context)


def test_tiny_checkpoint_decodes_24khz_hop_480(codec):
    assert (codec.name, codec.sample_rate, codec.samples_per_step) == ("neucodec", 24000, 480)
    codes = np.random.default_rng(0).integers(0, 65536, 12)
    (audio,) = codec.decode([window(codes)])
    assert audio.shape == (12 * 480,) and audio.dtype == np.float32
    assert np.isfinite(audio).all() and np.abs(audio).max() > 0


def test_a_window_decodes_the_same_alone_or_batched(codec):
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 65536, 9), rng.integers(0, 65536, 9)
    alone = codec.decode([window(a)])[0]
    batched = codec.decode([window(b), window(a)])[1]
    np.testing.assert_allclose(batched, alone, rtol=0, atol=1e-5 * np.abs(alone).max())


def test_context_steps_are_decoded_but_not_returned(codec):
    codes = np.random.default_rng(2).integers(0, 65536, 10)
    whole = codec.decode([window(codes)])[0]
    (tail,) = codec.decode([window(codes, context=4)])
    assert tail.shape == (6 * 480,)
    np.testing.assert_array_equal(tail, whole[4 * 480:])
    (alone,) = codec.decode([window(codes[4:])])  # the context shapes the audio
    assert np.abs(alone - tail).max() > 1e-3 * np.abs(tail).max()


def test_codes_out_of_range_are_refused(codec):
    with pytest.raises(ValueError, match="0..65535"):
        codec.decode([window([0, 65536])])
    with pytest.raises(ValueError, match="0..65535"):
        codec.decode([window([-1, 3])])


def test_a_checkpoint_of_another_shape_names_the_tensor(tiny_dir, tmp_path):
    write_tiny_checkpoint(tmp_path, config=NeuCodecConfig(hidden_dim=64, depth=2, heads=4,
                                                          vq_dim=48))
    (tmp_path / CONFIG_FILE).write_text((tiny_dir / CONFIG_FILE).read_text())
    with pytest.raises(ValueError,
                       match=r"project_out.weight has shape \(48, 8\), expected \(32, 8\)"):
        NeuCodecCodec.load(str(tmp_path))


def test_a_checkpoint_missing_a_tensor_or_the_file_is_refused(tiny_dir, tmp_path):
    with pytest.raises(ValueError, match="no NeuCodec checkpoint"):
        NeuCodecCodec.load(str(tmp_path))
    state = torch.load(tiny_dir / "pytorch_model.bin", weights_only=True)
    del state["generator.backbone.transformers.1.mlp.fc2.weight"]
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / CONFIG_FILE).write_text((tiny_dir / CONFIG_FILE).read_text())
    with pytest.raises(ValueError, match="lacks generator.backbone.transformers.1.mlp.fc2"):
        NeuCodecCodec.load(str(tmp_path))


@pytest.mark.parametrize("bad", [{"depth": 0}, {"heads": True}, {"hidden_dim": 48},
                                 {"levels": "4444"}, {"colour": 1}])
def test_a_bad_size_file_is_refused(tiny_dir, tmp_path, bad):
    sizes = {**json.loads((tiny_dir / CONFIG_FILE).read_text()), **bad}
    (tmp_path / CONFIG_FILE).write_text(json.dumps(sizes))
    (tmp_path / "pytorch_model.bin").write_bytes((tiny_dir / "pytorch_model.bin").read_bytes())
    with pytest.raises(ValueError, match=CONFIG_FILE):
        NeuCodecCodec.load(str(tmp_path))


def test_tensors_the_decoder_does_not_use_are_ignored_with_a_warning(tiny_dir, tmp_path, caplog):
    """The reference loads non-strictly; a published checkpoint may carry more (e.g. a
    rotary embedding's saved frequencies)."""
    state = torch.load(tiny_dir / "pytorch_model.bin", weights_only=True)
    state["generator.backbone.transformers.0.att.rotary_embed.freqs"] = torch.zeros(8)
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / CONFIG_FILE).write_text((tiny_dir / CONFIG_FILE).read_text())
    codes = np.arange(6)
    with caplog.at_level("WARNING"):
        loaded = NeuCodecCodec.load(str(tmp_path))
    assert "does not use" in caplog.text
    np.testing.assert_array_equal(loaded.decode([window(codes)])[0],
                                  NeuCodecCodec.load(str(tiny_dir)).decode([window(codes)])[0])
