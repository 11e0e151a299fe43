"""Join decoded windows into one gap-free PCM stream.

Each window contributes only its kept samples. At every seam the previous window's samples
just past its kept region (decoded from its right context) are held back and crossfaded with
the start of the next window's kept region, so a seam never jumps. The total length is
exactly steps x samples_per_step. Pure and synchronous.
"""

from __future__ import annotations

import functools

import numpy as np

from .windowing import Window


def to_int16(audio: np.ndarray) -> np.ndarray:
    """Float [-1, 1] to int16 PCM, rounded to the nearest step (a cast alone truncates
    toward zero: twice the quantisation error, and crossover distortion on quiet audio),
    clipping instead of wrapping."""
    scaled = np.clip(audio, -1.0, 1.0) * 32767.0
    return np.rint(scaled, out=scaled).astype(np.int16)


@functools.lru_cache(maxsize=16)
def _fades(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The fade-in and fade-out weights of an ``n``-sample seam (a stream's seams have a
    few lengths in all; computed once, not per window)."""
    fade_in = np.arange(1, n + 1, dtype=np.float32) / (n + 1)
    fade_out = 1.0 - fade_in
    fade_in.flags.writeable = fade_out.flags.writeable = False
    return fade_in, fade_out


def crossfade(tail: np.ndarray, head: np.ndarray) -> np.ndarray:
    """Linear (constant-gain) fade from ``tail`` into ``head``: both decode the same instant."""
    n = min(len(tail), len(head))
    if n == 0:
        return head
    fade_in, fade_out = _fades(n)
    mixed = head.copy()
    seam = mixed[:n]
    seam *= fade_in  # in place: one temporary per seam instead of four
    seam += tail[:n] * fade_out
    return mixed


class Stitcher:
    def __init__(self, samples_per_step: int, crossfade_samples: int, *,
                 exact: bool = False) -> None:
        """``exact``: windows decode to their kept samples alone, already the one-pass
        audio (a streaming codec): there is no seam to fade."""
        self.spp = samples_per_step
        self.exact = exact
        self.crossfade = 0 if exact else max(0, crossfade_samples)
        self._tail = np.zeros(0, dtype=np.float32)
        self.emitted = 0

    def push(self, window: Window, audio: np.ndarray) -> np.ndarray:
        """Add one window's decoded audio; return the samples now final."""
        spp = self.spp
        if window.keep_start * spp != self.emitted:
            raise ValueError("windows must arrive in order without gaps")
        if self.exact:
            return self._push_exact(window, audio)
        if len(audio) != window.steps * spp:
            raise ValueError(f"window of {window.steps} steps decoded to {len(audio)} samples")
        lo = (window.keep_start - window.start) * spp
        hi = (window.keep_end - window.start) * spp
        kept = crossfade(self._tail, audio[lo:hi].astype(np.float32, copy=False))
        self._tail = audio[hi : hi + self.crossfade].astype(np.float32, copy=True)
        self.emitted += hi - lo
        return kept

    def _push_exact(self, window: Window, audio: np.ndarray) -> np.ndarray:
        kept = (window.keep_end - window.keep_start) * self.spp
        if len(audio) != kept:
            raise ValueError(f"window keeping {kept} samples decoded to {len(audio)}")
        self.emitted += kept
        return audio.astype(np.float32, copy=False)

    def finish(self) -> np.ndarray:
        """The stream ended; the held-back tail belongs to no kept step and is dropped."""
        self._tail = np.zeros(0, dtype=np.float32)
        return self._tail


class ChunkJoiner:
    """Joins the (float) audio of consecutive text chunks of one turn with a short crossfade.

    A chunk's audio passes straight through, except the last ``crossfade`` samples of its
    last push (``last``), which are held back and faded into the first samples of the next
    chunk, so the seam between two requests has no click and no gap. Nothing else is held:
    at exactly real time every held sample would be a sample the listener runs dry without
    (holding the tail of every push cost each stream 15 ms of gap at its first seam).
    ``finish`` releases the held samples of the last chunk. Audio stays float: it is
    rounded to int16 once, at the plugin or server edge.
    """

    def __init__(self, crossfade_samples: int) -> None:
        self.crossfade = max(0, crossfade_samples)
        self._held = np.zeros(0, dtype=np.float32)
        self._fade_in = np.zeros(0, dtype=np.float32)  # held tail awaiting the next chunk
        self._overlap = 0

    def push(self, pcm: np.ndarray, last: bool = False) -> np.ndarray:
        """``last``: the chunk's last audio (its tail is held for the next chunk's seam; a
        last push shorter than the crossfade holds all of itself). A chunk whose last audio
        came unflagged (a window with no right context can be handed on before its request
        is known to have ended) joins the next one without a crossfade.

        A seam is made whole at the chunk's first audio: where that is shorter than the held
        tail, the seam is as long as it (the tail's start plays as it was), so no sample of
        one chunk plays after the next one's and no fade starts over."""
        audio = pcm.astype(np.float32, copy=False)
        lead = 0  # the earlier chunk's samples at the front, never held for the next seam
        if len(self._fade_in) and len(audio):
            tail = self._fade_in
            n = min(len(tail), len(audio))
            lead = len(tail) - n
            audio = np.concatenate([tail[:lead], crossfade(tail[lead:], audio[:n]), audio[n:]])
            self._fade_in = np.zeros(0, dtype=np.float32)
            self._overlap = n
        if len(self._held):
            audio = np.concatenate([self._held, audio])
        cut = max(lead, len(audio) - self.crossfade) if last else len(audio)
        self._held = audio[cut:]
        return audio[:cut]

    def end_chunk(self) -> int:
        """The current chunk is complete: its held tail fades into the next chunk. Returns
        how many of its samples overlapped the chunk before it (its seam's length)."""
        self._fade_in = np.concatenate([self._fade_in, self._held])
        self._held = np.zeros(0, dtype=np.float32)
        overlap, self._overlap = self._overlap, 0
        return overlap

    def finish(self) -> np.ndarray:
        rest = np.concatenate([self._fade_in, self._held])
        self._fade_in = self._held = np.zeros(0, dtype=np.float32)
        return rest
