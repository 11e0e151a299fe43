"""Windowed SNAC decode + stitching against a one-pass decode of the same codes.

Measured here (random-init SNAC 24 kHz, keyed noise on, 48 random frames, L=R=2, N=8, first
window 2, 10 ms crossfade): relative RMS error about 6e-5 and max |error| about 5e-4 over the
whole signal. The bounds below leave a margin of about 10x.
"""

import numpy as np

from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.pipeline.pacing import window_sizes
from livekit.plugins.veena.pipeline.stitching import Stitcher, crossfade, to_int16
from livekit.plugins.veena.pipeline.windowing import WindowOptions

from ..helpers import decode_windows, every_size_windows, windowed_decode

SPF = 2048


def test_windowed_matches_one_pass(snac_codec):
    frames = np.random.default_rng(5).integers(0, 4096, (48, 7))
    (one,) = snac_codec.decode([CodecInput(frames, 0, 11)])
    win, windows = windowed_decode(snac_codec, frames, WindowOptions(first=2, new=8, left=2, right=2), 11, 240)
    assert len(win) == len(frames) * SPF
    err = win - one
    rel_rms = np.sqrt(np.mean(err**2)) / np.sqrt(np.mean(one**2))
    assert rel_rms < 1e-3, rel_rms
    seams = [w.keep_start * SPF for w in windows[1:]]
    seam_err = max(np.abs(err[s - 256 : s + 256]).max() for s in seams)
    assert seam_err < 5e-3, seam_err
    # no jump at a seam larger than the signal's own sample-to-sample range
    own_step = np.abs(np.diff(one)).max()
    for s in seams:
        assert np.abs(np.diff(win[s - 256 : s + 256])).max() <= own_step * 1.01


def test_every_listener_paced_size_matches_one_pass(snac_codec):
    """Each window size the listener-paced planner can choose (2 .. 32 new frames), within
    the bounds above."""
    opts = WindowOptions(first=2, new=8, left=2, right=2)
    frames = np.random.default_rng(6).integers(0, 4096, (70, 7))
    (one,) = snac_codec.decode([CodecInput(frames, 0, 11)])
    windows = every_size_windows(opts, window_sizes(2, 32), len(frames))
    win = decode_windows(snac_codec, frames, windows, 11, 240)
    err = win - one
    assert np.sqrt(np.mean(err**2)) / np.sqrt(np.mean(one**2)) < 1e-3
    seams = [w.keep_start * SPF for w in windows[1:]]
    assert max(np.abs(err[s - 256 : s + 256]).max() for s in seams) < 5e-3


def test_classic_context_free_windows_are_worse(snac_codec):
    """Without right context the seams are clearly wrong: the bound above is meaningful."""
    frames = np.random.default_rng(5).integers(0, 4096, (24, 7))
    (one,) = snac_codec.decode([CodecInput(frames, 0, 11)])
    win, _ = windowed_decode(snac_codec, frames, WindowOptions(first=2, new=8, left=2, right=0), 11, 0)
    rel_rms = np.sqrt(np.mean((win - one) ** 2)) / np.sqrt(np.mean(one**2))
    assert rel_rms > 1e-2


def test_crossfade_and_int16():
    tail, head = np.ones(4, np.float32), np.zeros(6, np.float32)
    mixed = crossfade(tail, head)
    assert len(mixed) == 6 and np.all(np.diff(mixed[:5]) < 0) and mixed[5] == 0
    pcm = to_int16(np.array([-2.0, -1.0, 0.0, 0.5, 1.0, 3.0]))
    assert pcm.dtype == np.int16
    assert list(pcm) == [-32767, -32767, 0, 16384, 32767, 32767]
    # rounded, not truncated toward zero: 0.9 and 1.9 of a step are 1 and 2 steps
    lsb = 1 / 32767
    assert list(to_int16(np.array([0.9, 1.9, -0.9, -1.6, 0.4]) * lsb)) == [1, 2, -1, -2, 0]
    assert list(to_int16(np.array([0.9, -0.9], np.float32) * np.float32(lsb))) == [1, -1]


def test_stitcher_rejects_gaps():
    import pytest

    from livekit.plugins.veena.pipeline.windowing import Window

    s = Stitcher(SPF, 0)
    with pytest.raises(ValueError):
        s.push(Window(2, 4, 2, 4), np.zeros(2 * SPF, np.float32))


def test_exact_stitcher_passes_kept_samples_through():
    """A streaming codec's windows decode to their kept samples alone: nothing is faded or
    held back, and a wrong length or a gap is refused as in the windowed case."""
    import pytest

    from livekit.plugins.veena.pipeline.windowing import Window

    s = Stitcher(SPF, 240, exact=True)
    first = np.linspace(-1, 1, 1 * SPF, dtype=np.float32)
    assert np.array_equal(s.push(Window(0, 4, 0, 1), first), first)
    second = np.full(2 * SPF, 0.5, np.float32)
    assert np.array_equal(s.push(Window(1, 6, 1, 3), second), second)
    assert s.emitted == 3 * SPF and len(s.finish()) == 0
    with pytest.raises(ValueError, match="decoded to"):
        s.push(Window(3, 7, 3, 4), np.zeros(4 * SPF, np.float32))  # the whole window's length
    with pytest.raises(ValueError, match="order"):
        s.push(Window(5, 9, 5, 6), np.zeros(SPF, np.float32))


def test_chunk_joiner_crossfades_each_seam_and_keeps_float():
    from livekit.plugins.veena.pipeline.stitching import ChunkJoiner

    fade = 8
    joiner = ChunkJoiner(fade)
    a = np.full(100, 0.5, dtype=np.float32)
    b = np.full(60, -0.25, dtype=np.float32)
    out = [joiner.push(a[:30]), joiner.push(a[30:], last=True)]
    assert len(out[0]) == 30  # within a chunk nothing is held back
    joiner.end_chunk()
    out += [joiner.push(b, last=True), joiner.finish()]
    audio = np.concatenate(out)
    assert audio.dtype == np.float32 and all(o.dtype == np.float32 for o in out)
    assert len(audio) == len(a) + len(b) - fade  # one crossfade, no gap
    assert np.allclose(audio[: len(a) - fade], 0.5) and np.allclose(audio[len(a):], -0.25)
    seam = audio[len(a) - fade : len(a)]
    assert np.all(np.diff(seam) < 0) and 0.5 > seam[0] and seam[-1] > -0.25  # a ramp, no step
    assert len(joiner.finish()) == 0  # nothing is held after finish


def test_chunk_joiner_holds_nothing_back_within_a_chunk():
    """At exactly real time the listener needs every sample the moment it exists: a push
    that is not its chunk's last comes out whole, at once (holding each push's tail made
    every stream run dry 15 ms early at its first seam)."""
    from livekit.plugins.veena.pipeline.stitching import ChunkJoiner

    joiner = ChunkJoiner(8)
    pushes = [np.full(n, 0.1 * k, np.float32) for k, n in enumerate((30, 40, 50), 1)]
    assert [len(joiner.push(p)) for p in pushes] == [30, 40, 50]
    assert len(joiner.push(np.ones(20, np.float32), last=True)) == 12  # the seam's tail held
    joiner.end_chunk()
    assert len(joiner.finish()) == 8


def test_chunk_joiner_short_chunks_and_no_crossfade():
    from livekit.plugins.veena.pipeline.stitching import ChunkJoiner

    joiner = ChunkJoiner(0)
    parts = [joiner.push(np.ones(5, np.float32), last=True)]
    joiner.end_chunk()
    parts.append(joiner.push(np.zeros(3, np.float32), last=True))
    assert len(np.concatenate(parts + [joiner.finish()])) == 8
    joiner = ChunkJoiner(16)  # chunks shorter than the crossfade still add up
    total = 0
    for n in (4, 7, 30):
        total += len(joiner.push(np.full(n, 0.1, np.float32), last=True))
        joiner.end_chunk()
    total += len(joiner.finish())
    assert total == 4 + 7 + 30 - 4 - 7  # each short chunk fades entirely into the next


def test_a_chunk_whose_first_audio_is_shorter_than_the_held_tail_keeps_order_and_fade():
    """A crossfade longer than a chunk's first push (``chunk_crossfade_ms`` past one
    window's audio, or a short chunk): the rest of the tail was faded again from the top
    (the earlier chunk's share jumped from 0 back to 1: a click), and a chunk shorter than
    the tail had the earlier chunk's samples played after it."""
    from livekit.plugins.veena.pipeline.stitching import ChunkJoiner

    joiner = ChunkJoiner(2400)
    out = [joiner.push(np.ones(6144, np.float32), last=True)]
    joiner.end_chunk()
    out += [joiner.push(np.zeros(2048, np.float32)),
            joiner.push(np.zeros(4096, np.float32), last=True)]
    assert joiner.end_chunk() == 2048  # the seam is as long as the first push
    share = np.concatenate(out + [joiner.finish()])  # the first chunk's share of each sample
    assert len(share) == 6144 + 6144 - 2048
    assert np.all(np.diff(share) <= 0), "the earlier chunk's share never rises again"
    assert share[6144 - 2048 - 1] == 1.0 and share[6144] == 0.0

    joiner = ChunkJoiner(8)  # a 3-sample chunk between two longer ones
    a, b, c = np.arange(1, 21, dtype=np.float32), np.full(3, 100, np.float32), np.zeros(50, np.float32)
    out = [joiner.push(a, last=True)]
    joiner.end_chunk()
    out.append(joiner.push(b, last=True))
    assert joiner.end_chunk() == 3
    out += [joiner.push(c, last=True), joiner.finish()]
    audio = np.concatenate(out)
    assert len(audio) == 20 + 3 + 50 - 3 - 3
    assert np.array_equal(audio[:17], a[:17])  # a's samples all come before b's mix
    assert np.all(audio[20:] == 0)
