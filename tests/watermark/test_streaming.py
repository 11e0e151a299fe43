"""A stream's watermark equals the whole clip's: blocks of any size, once per sample, the
length kept, the tail released at the end."""

import sys
from pathlib import Path

import numpy as np
import pytest

from livekit.plugins.veena.watermark import WatermarkStream

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
from make_perth_golden import speech_like  # noqa: E402

RATE = 24000
TOLERANCE = 2e-6
"""Relative RMS against the whole clip: at the default 0.2 s of context the difference is
the float rounding of windows summed in another order (5.5e-7 at worst measured; 8e-6 at
0.18 s)."""


@pytest.fixture(scope="module")
def clip():
    return np.concatenate([speech_like(1.2, 0, seed) for seed in (3, 4, 5)])  # 3.6 s


def _streamed(perth, audio, sizes, **kw):
    stream = WatermarkStream(perth, RATE, **kw)
    out, i = [], 0
    for n in sizes:
        out.append(stream.push(audio[i:i + n]))
        i += n
    out.append(stream.push(audio[i:]))
    out.append(stream.finish())
    return np.concatenate(out), stream


def _rel_rms(got, want):
    return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want ** 2)))


@pytest.mark.parametrize("sizes", [
    [480] * 10 + [4800] * 10,  # steps and windows
    list(np.random.default_rng(0).integers(1, 9000, 40)),  # anything
    [86400],  # one push
])
def test_streamed_blocks_equal_the_whole_clip(perth, clip, sizes):
    whole = perth.apply(clip, RATE)
    got, stream = _streamed(perth, clip, sizes)
    assert len(got) == len(clip) == len(whole)
    assert _rel_rms(got, whole) <= TOLERANCE
    assert _rel_rms(got, clip) > 0.05  # it was watermarked, every part of it
    assert _rel_rms(got[-4800:], clip[-4800:]) > 0.05


def test_too_little_context_is_not_equal(perth, clip):
    """The test can fail: 0.05 s of context each side leaves seams, 0.15 s small ones."""
    whole = perth.apply(clip, RATE)
    assert _rel_rms(_streamed(perth, clip, [2400] * 36, context_s=0.05)[0], whole) > 1e-3
    assert _rel_rms(_streamed(perth, clip, [2400] * 36, context_s=0.15)[0], whole) > TOLERANCE


def test_it_holds_back_the_context_and_releases_it_at_the_end(perth, clip):
    stream = WatermarkStream(perth, RATE)
    assert stream.holdback == 4800  # 0.2 s
    first = stream.push(clip[:9600])
    assert len(first) == 9600 - 4800
    assert len(stream.push(clip[9600:10000])) == 0  # under the 0.1 s block: it waits
    rest = stream.finish()
    assert len(first) + len(rest) == 10000
    assert len(stream.finish()) == 0


def test_a_length_off_the_grid_keeps_every_sample(perth, clip):
    """Perth's whole clip drops the last part-hop; the stream keeps it, zero-padded to a
    hop. They agree up to where the whole clip's cut end reaches back (0.2 s: the resampler
    and the STFT there saw a clip that ends, the stream one that goes on)."""
    audio = clip[:24000 + 77]
    whole = perth.apply(audio, RATE)
    assert len(whole) == 24000
    got, _ = _streamed(perth, audio, [1000] * 24)
    assert len(got) == len(audio)
    assert _rel_rms(got[:24000 - 4800], whole[:24000 - 4800]) <= TOLERANCE
    assert _rel_rms(got[-77:], audio[-77:]) > 0.01  # the part-hop is watermarked too


def test_the_cost_is_bounded(perth, clip):
    """Each sample is watermarked in one block; the windows around the blocks cost at most
    (min block + 2 contexts) / min block of the whole clip's work."""
    _, stream = _streamed(perth, clip, [480] * 180)
    assert stream.watermarked <= len(clip) * (0.1 + 2 * 0.2) / 0.1
