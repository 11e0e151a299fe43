"""One text's audio stream: its pieces (split where the text would not fit the model
context) run one after another as ``RequestRun``s and come out as float ``AudioChunk``s.

Audio stays float32 in [-1, 1] through the whole pipeline and the turn; it is rounded to
int16 once, at the edge (the LiveKit plugin, the server, a WAV file).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator

import numpy as np

from .engine_options import SamplingOptions
from .gc_heap import full_collections
from .request_run import RequestRun, RunHost
from .stitching import to_int16
from .timings import Timings

logger = logging.getLogger(__name__)


class EmptyTextError(ValueError):
    """Nothing to speak: empty or whitespace-only text."""


@dataclass(frozen=True)
class AudioChunk:
    pcm: np.ndarray
    """float32 mono samples in [-1, 1]."""
    sample_rate: int
    sequence: int
    final: bool

    @property
    def duration(self) -> float:
        return len(self.pcm) / self.sample_rate


class Synthesis:
    """One request's audio stream: iterate for chunks; ``timings`` fill in as it runs."""

    def __init__(self, pipeline: RunHost, pieces: list[str], voice: str,
                 sampling: SamplingOptions, seed: int, request_id: str,
                 speaker_globals: tuple[int, ...] | None) -> None:
        self._p = pipeline
        self._pieces = pieces
        self.voice = voice
        self.sampling = sampling
        self.seed = seed
        self.request_id = request_id
        self.speaker_globals = speaker_globals
        """Speaker tokens this request used (captured by its first piece, or given)."""
        self.globals_captured = asyncio.Event()
        """Set as soon as ``speaker_globals`` is known (at once where there is nothing to
        capture: a family without speaker tokens, or a continuation)."""
        if speaker_globals is not None or not pipeline.family.has_speaker_globals:
            self.globals_captured.set()
        self.timings = Timings()
        self.vllm_request_ids: list[str] = []
        self.tracks: list = []
        """Per piece: the codec steps parsed from the engine (kept for inspection)."""
        self._run: RequestRun | None = None
        self._created = time.monotonic()
        self._iter: AsyncIterator[AudioChunk] | None = None

    def captured(self, speaker_globals: tuple[int, ...]) -> None:
        self.speaker_globals = speaker_globals
        self.globals_captured.set()

    def progress_at(self) -> float:
        """When this synthesis last moved forward (see ``RequestRun.progress_at``)."""
        return self._run.progress_at() if self._run is not None else self._created

    @property
    def pieces(self) -> list[str]:
        """The text, split where it would not fit the model context in one request."""
        return list(self._pieces)

    def __aiter__(self) -> AsyncIterator[AudioChunk]:
        if self._iter is None:
            self._iter = self._chunks()
        return self._iter

    async def aclose(self) -> None:
        if self._iter is not None:
            await self._iter.aclose()  # type: ignore[attr-defined]

    async def collect(self) -> np.ndarray:
        """The whole synthesis as int16 PCM (an edge: rounded once, here)."""
        parts = [c.pcm async for c in self]
        return to_int16(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int16)

    async def _chunks(self) -> AsyncIterator[AudioChunk]:
        seq = 0
        rate = self._p.sample_rate
        with full_collections.streaming():  # no full collection while it plays
            for i, piece in enumerate(self._pieces):
                last_piece = i == len(self._pieces) - 1
                self._run = RequestRun(self._p, self, piece, i)
                self.tracks.append(self._run.track)
                async with contextlib.aclosing(self._run.audio()) as piece_audio:
                    async for pcm, done in piece_audio:
                        final = done and last_piece
                        if len(pcm) or final:
                            if len(pcm) and self.timings.first_audio is None:
                                self.timings.first_audio = time.perf_counter()
                            self.timings.audio_seconds += len(pcm) / rate
                            yield AudioChunk(pcm, rate, seq, final)
                            seq += 1
        self.timings.finished = time.perf_counter()
        logger.info(
            "synthesis done",
            extra={"request_id": self.request_id, "first_audio_ms": self.timings.first_audio_ms,
                   "audio_s": round(self.timings.audio_seconds, 3),
                   "rtf": self.timings.real_time_factor, "tokens": self.timings.tokens},
        )
