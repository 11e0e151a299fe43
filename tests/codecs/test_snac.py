"""SNAC codec: real architecture (random weights) loaded through from_pretrained."""

import numpy as np

from livekit.plugins.veena.codecs.base import CodecInput


def _frames(n, seed=0):
    return np.random.default_rng(seed).integers(0, 4096, (n, 7))


def test_samples_per_frame(snac_codec):
    assert snac_codec.sample_rate == 24000
    assert snac_codec.samples_per_step == 2048
    (audio,) = snac_codec.decode([CodecInput(_frames(5), 0, 1)])
    assert audio.shape == (5 * 2048,) and audio.dtype == np.float32


def test_noise_is_keyed_not_random(snac_codec):
    frames = _frames(6)
    a, = snac_codec.decode([CodecInput(frames, 0, 7)])
    b, = snac_codec.decode([CodecInput(frames, 0, 7)])
    c, = snac_codec.decode([CodecInput(frames, 0, 8)])
    assert np.array_equal(a, b), "same codes and seed must decode identically"
    assert np.abs(a - c).max() > 1e-4, "another seed draws other noise"


def test_window_decodes_the_same_alone_or_batched(snac_codec):
    f1, f2 = _frames(12, 1), _frames(12, 2)
    alone, = snac_codec.decode([CodecInput(f1, 8, 3)])
    batched = snac_codec.decode([CodecInput(f2, 0, 9), CodecInput(f1, 8, 3)])
    assert np.abs(batched[1] - alone).max() < 1e-5
