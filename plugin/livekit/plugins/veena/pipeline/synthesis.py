"""One text's audio stream: its pieces (split where the text would not fit the model
context) run one after another as ``RequestRun``s. ``play`` pushes their float audio to a
sink as each window is decoded (the turn's hot path: no task wakes per window); iterating
gives the same audio as ``AudioChunk``s.

Audio stays float32 in [-1, 1] through the whole pipeline and the turn; it is rounded to
int16 once, at the edge (the LiveKit plugin, the server, a WAV file). The pipeline's output
watermark, where it has one, is applied here, after the stitcher: one stream per synthesis,
across its pieces, so that every surface carries it and every sample is marked once (on the
codec's thread; a failure drops what it still held).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

import numpy as np

from .adapters import Adapter
from .engine import EngineClosedError
from .engine_options import SamplingOptions
from .gc_heap import full_collections
from .guards import GuardLog
from .request_run import RequestRun
from .run_host import RunHost
from .stitching import to_int16
from .tasks import settle
from .timings import Timings
from ..watermark import WatermarkStream

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


class _Watermarking:
    """Hands ``sink`` a synthesis's audio watermarked (``stream``), in order, the watermark run
    on the codec's thread (``run_on_codec_thread``): its torch work stays off the event loop and
    on the one thread that has an OpenMP team (``codecs.torch_threads``). One call is in flight
    at a time; audio that arrives meanwhile goes with the next. ``ended`` completes once the
    final audio went to ``sink`` (or with what failed)."""

    def __init__(self, stream: WatermarkStream, run_on_codec_thread: Callable,
                 sink: Callable[[np.ndarray, bool], None]) -> None:
        self._stream, self._run, self._sink = stream, run_on_codec_thread, sink
        self._queued: list[np.ndarray] = []
        self._final = False
        self._busy = False
        self.ended: asyncio.Future = asyncio.get_running_loop().create_future()

    def __call__(self, pcm: np.ndarray, final: bool) -> None:
        """From a decode's completion, on the loop."""
        if len(pcm):
            self._queued.append(pcm)
        self._final = self._final or final
        self._next()

    def close(self) -> None:
        """Nothing more reaches ``sink`` (the synthesis failed or was cancelled)."""
        if not self.ended.done():
            self.ended.cancel()
        elif not self.ended.cancelled():
            self.ended.exception()  # seen: the synthesis raised its own failure first

    def _next(self) -> None:
        if self._busy or self.ended.done() or not (self._queued or self._final):
            return
        pcm = (np.concatenate(self._queued) if self._queued
               else np.zeros(0, dtype=np.float32))
        final, self._queued = self._final, []
        self._busy = True
        work = self._run(functools.partial(self._mark, pcm, final))
        work.add_done_callback(functools.partial(self._marked, final))

    def _mark(self, pcm: np.ndarray, final: bool) -> np.ndarray:  # on the codec's thread
        out = self._stream.push(pcm)
        return np.concatenate([out, self._stream.finish()]) if final else out

    def _marked(self, final: bool, work: asyncio.Future) -> None:
        self._busy = False
        if self.ended.done():
            return
        try:
            if work.cancelled():  # the scheduler closed under the synthesis
                raise EngineClosedError("the pipeline closed under a watermarked synthesis")
            out = work.result()
            if len(out) or final:
                self._sink(out, final)
            if final:
                self.ended.set_result(None)
            else:
                self._next()
        except Exception as e:  # the synthesis ends with it, in order
            self.ended.set_exception(e)


class Synthesis:
    """One request's audio stream: iterate for chunks; ``timings`` fill in as it runs."""

    def __init__(self, pipeline: RunHost, pieces: list[str], voice: str,
                 sampling: SamplingOptions, seed: int, request_id: str,
                 speaker_globals: tuple[int, ...] | None,
                 adapter: Adapter | None = None,
                 guard_log: GuardLog | None = None) -> None:
        self._p = pipeline
        self._pieces = pieces
        self.voice = voice
        self.sampling = sampling
        self.seed = seed
        self.request_id = request_id
        self.speaker_globals = speaker_globals
        """Speaker tokens this request used (captured by its first piece, or given)."""
        self.adapter = adapter
        """The LoRA adapter every engine request of this synthesis carries."""
        self.guard_log = guard_log or GuardLog()
        """Where its guards report (its turn's, shared by the turn's chunks)."""
        self.globals_captured = asyncio.Event()
        """Set as soon as ``speaker_globals`` is known (at once where there is nothing to
        capture: a family without speaker tokens, or a continuation)."""
        if speaker_globals is not None or not pipeline.family.captures_speaker_globals:
            self.globals_captured.set()
        self.timings = Timings()
        self.vllm_request_ids: list[str] = []
        self.tracks: list = []
        """Per piece: the codec steps parsed from the engine (kept for inspection)."""
        marker = pipeline.watermarker
        self._watermark = (WatermarkStream(marker, pipeline.sample_rate)
                           if marker is not None else None)
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
        parts: list[np.ndarray] = []
        await self.play(lambda pcm, final: parts.append(pcm))
        return to_int16(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int16)

    async def play(self, sink: Callable[[np.ndarray, bool], None]) -> None:
        """Push the audio to ``sink(samples, final)`` as it is decoded, from the decode's
        completion (never empty except a final call with nothing left); return at the end.
        Raises what ended it, after the audio before the failure; cancelled, the running
        piece's requests end."""
        with full_collections.streaming():  # no full collection while it plays
            await self._play(sink)

    @property
    def held_back_samples(self) -> int:
        """Samples the watermark holds back while it streams (the listener is that much
        behind what was decoded)."""
        return self._watermark.holdback if self._watermark is not None else 0

    async def _play(self, sink: Callable[[np.ndarray, bool], None]) -> None:
        rate, timings = self._p.sample_rate, self.timings

        def deliver(pcm: np.ndarray, final: bool) -> None:
            if len(pcm):
                if timings.first_audio is None:
                    timings.first_audio = time.perf_counter()
                timings.audio_seconds += len(pcm) / rate
            if len(pcm) or final:
                sink(pcm, final)

        marking = None
        if self._watermark is not None:  # once per sample, across the pieces
            marking = _Watermarking(self._watermark, self._p.scheduler.run_on_codec_thread,
                                    deliver)
            deliver = marking
        try:
            await self._play_pieces(deliver)
            if marking is not None:
                await marking.ended
        finally:
            if marking is not None:
                marking.close()
        timings.finished = time.perf_counter()
        logger.info(
            "synthesis done",
            extra={"request_id": self.request_id, "first_audio_ms": timings.first_audio_ms,
                   "audio_s": round(timings.audio_seconds, 3),
                   "rtf": timings.real_time_factor, "tokens": timings.tokens},
        )

    async def _play_pieces(self, deliver: Callable[[np.ndarray, bool], None]) -> None:
        for i, piece in enumerate(self._pieces):
            last_piece = i == len(self._pieces) - 1

            def piece_sink(pcm: np.ndarray, done: bool, last_piece: bool = last_piece) -> None:
                deliver(pcm, done and last_piece)

            self._run = RequestRun(self._p, self, piece, i)
            try:
                await self._run.play(piece_sink)
            finally:  # the track it ended with (a retry starts a new one)
                self.tracks.append(self._run.track)

    async def _chunks(self) -> AsyncIterator[AudioChunk]:
        """``play`` as an iterator: its pushes queue here until the reader takes them."""
        loop = asyncio.get_running_loop()
        rate, ready, sequence = self._p.sample_rate, collections.deque(), itertools.count()
        reader: list[asyncio.Future] = []

        def wake(*_) -> None:
            if reader and not reader[0].done():
                reader[0].set_result(None)

        def sink(pcm: np.ndarray, final: bool) -> None:
            ready.append(AudioChunk(pcm, rate, next(sequence), final))
            wake()

        # it plays until the reader has taken its last chunk, not until its last decode
        with full_collections.streaming():
            player = asyncio.create_task(self._play(sink),
                                         name=f"veena-synthesis-{self.request_id}")
            player.add_done_callback(wake)
            try:
                while True:
                    while ready:
                        yield ready.popleft()
                    if player.done():
                        break
                    reader[:] = [loop.create_future()]
                    await reader[0]
                player.result()  # what ended it, after the audio before it
            finally:
                if not player.done():
                    player.cancel()
                await settle([player])
