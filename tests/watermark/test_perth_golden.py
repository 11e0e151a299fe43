"""The port of Perth's implicit watermark writes the samples Perth's own
``PerthImplicitWatermarker.apply_watermark`` wrote (``tests/golden/make_perth_golden.py``:
resemble-perth 1.0.1 with torchaudio and librosa, in a side environment), on its published
weights, and without importing ``perth``."""

import sys
from pathlib import Path

import numpy as np
import pytest

from livekit.plugins.veena.watermark.perth import PerthConfig

GOLDEN = np.load(Path(__file__).resolve().parents[1] / "golden" / "perth" / "golden.npz")
RATE = 24000
TOLERANCE = 1e-6
"""Relative RMS and largest difference allowed. Here the port is bit-exact (0.0 on both, with
torch 2.13 CPU against torch 2.11 and the same soxr 1.1.0); the margin is float32 rounding
where another FFT backend sums in another order (the watermark changes the clip by ~0.2 RMS)."""


def _rel_rms(got, want):
    return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want ** 2)))


@pytest.mark.parametrize("clip", ["voiced", "odd"])
def test_the_port_writes_perths_samples(perth, clip):
    want = GOLDEN[f"{clip}_watermarked"]
    got = perth.apply(GOLDEN[f"{clip}_input"], RATE)
    assert got.dtype == np.float32 and got.shape == want.shape  # odd: Perth drops a part-hop
    assert _rel_rms(got, want) <= TOLERANCE
    assert np.abs(got - want).max() <= TOLERANCE
    # and it is a watermark: Perth's own detector told the clips apart
    assert GOLDEN[f"{clip}_detect_marked"] > 0.99 > 0.01 > GOLDEN[f"{clip}_detect_clean"]


def test_perth_itself_is_never_imported(perth):
    perth.apply(GOLDEN["voiced_input"], RATE)
    assert "perth" not in sys.modules and "torchaudio" not in sys.modules


def test_the_grid_aligns_blocks_with_perths_hops(perth):
    assert perth.config.subband == 128 and perth.config.sample_rate == 32000
    assert perth.grid(24000) == 240 and perth.grid(16000) == 160 and perth.grid(32000) == 320


def test_hyperparameters_are_checked():
    good = dict(sample_rate=32000, n_fft=2048, hop_size=320, window_size=2048,
                stft_magnitude_min=1e-9, max_wmark_freq=2000, hidden_size=256, window_fn="hann")
    assert PerthConfig.from_mapping(good).subband == 128
    for bad in ({"window_fn": "hamm"}, {"hop_size": 0}, {"n_fft": "2048"},
                {"stft_magnitude_min": 0.0}, {"max_wmark_freq": 20000}):
        with pytest.raises(ValueError):
            PerthConfig.from_mapping({**good, **bad})
