"""One spoken turn: text chunks in, one continuous int16 stream out.

The first chunk is a first request; later chunks are continuations that keep the voice
(SNAC: the same speaker prompt and seed; BiCodec: the first chunk's captured 32 globals).
At most ``max_chunks_in_flight`` chunks generate at once, so chunk k+1 generates while chunk
k plays, and consecutive chunks are joined with a crossfade. A chunk's audio is kept while an
earlier one plays; the chunk playing hands each window on as its decode completes, so a
window reaches the listener without waking any task (neither the turn's nor the chunk's).
The turn owns every request it starts: closing it aborts them all. Used by the in-process
plugin and by the server.

Each chunk's text passes one gate as the turn accepts it: tags the profile does not perform
are removed (the model would read ``<happy>`` aloud, and user text must not inject special
tokens), and the words reported for transcripts carry no tag at all.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import AsyncIterable, Callable, Mapping

import numpy as np

from ..log import logger
from .engine_options import SamplingOptions, draw_seed
from .adapters import Adapter
from .guards import GuardLog
from .pipeline import EmptyTextError, Pipeline
from .stitching import ChunkJoiner
from .tags import spoken_text, strip_unknown_tags
from .tasks import settle

_unknown_tags_removed = 0
_removed_listeners: list[Callable[[int], None]] = []


def unknown_tags_removed() -> int:
    """Tags removed from turns' text in this process because their profile does not perform
    them (process-wide and monotonic: the server exports it as a Prometheus counter)."""
    return _unknown_tags_removed


def add_removed_tags_listener(listener: Callable[[int], None]) -> Callable[[], None]:
    """``listener(n)`` hears each removal as it is counted (the server's metrics, which may
    live in files shared by several processes); the returned call stops it."""
    _removed_listeners.append(listener)
    return lambda: _removed_listeners.remove(listener)


def _count_removed(n: int) -> None:
    global _unknown_tags_removed
    _unknown_tags_removed += n
    for listener in list(_removed_listeners):
        listener(n)


class TurnTimeout(TimeoutError):
    """The turn made no progress for its timeout (see ``Synthesis.progress_at``)."""


class TurnError(RuntimeError):
    """The turn cannot continue (e.g. the first chunk never produced its globals)."""


@dataclass(frozen=True)
class TurnOptions:
    voice: str
    sampling: SamplingOptions
    seed: int | None = None
    """None: the turn draws one seed and keeps it for all its chunks."""
    speaker_globals: tuple[int, ...] | None = None
    """BiCodec: reuse these globals from the first chunk on (e.g. one voice for a call)."""
    adapter: str | None = None
    """The LoRA adapter (a registered name) every chunk of the turn is generated with."""
    text_normalization: str | None = None
    """``auto`` or ``off`` (``normalization``); None: the pipeline's default."""
    pronunciations: Mapping[str, str] | None = None
    """Whole words spoken another way, beside the pipeline's own."""
    chunk_crossfade_ms: float = 15.0
    max_chunks_in_flight: int = 2
    timeout: float = 10.0
    """Fail when the running chunk makes no progress for this long. Engine start-up and
    queueing behind other requests do not count: they are bounded separately."""
    startup_timeout: float | None = None
    """How long to wait for the engine to start (None: ``EngineOptions.startup_timeout_s``)."""


async def _until(event: asyncio.Event, task: asyncio.Task) -> None:
    """Return when ``event`` is set or ``task`` has ended, whichever comes first."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


class _ChunkAudio:
    """One chunk's audio on its way to the listener: kept while an earlier chunk plays,
    handed straight to the turn's sink once it is the one playing, then its end (or the
    failure that ended it, delivered where the listener reaches this chunk)."""

    def __init__(self) -> None:
        self._kept: list[tuple[np.ndarray, bool]] = []
        self._sink: Callable[[np.ndarray, bool], None] | None = None
        self.samples = 0
        self.error: BaseException | None = None
        self._ended = asyncio.get_running_loop().create_future()

    @property
    def ended(self) -> bool:
        return self._ended.done()

    def put(self, pcm: np.ndarray, last: bool) -> None:
        """``last``: the chunk's last audio."""
        if self._sink is None:
            self._kept.append((pcm, last))
        else:
            self._pass(pcm, last)

    def _pass(self, pcm: np.ndarray, last: bool) -> None:
        self.samples += len(pcm)
        self._sink(pcm, last)

    def end(self, error: BaseException | None = None) -> None:
        if not self.ended:
            self.error = error
            self._ended.set_result(None)

    def play(self, sink: Callable[[np.ndarray, bool], None]) -> None:
        """This chunk is the one playing: what was kept goes to ``sink`` now, the rest as
        it comes."""
        kept, self._kept = self._kept, []
        self._sink = sink
        for pcm, last in kept:
            self._pass(pcm, last)

    async def wait_end(self, timeout: float) -> None:
        """Until the chunk ends or ``timeout`` passes (no cancellation of the waiting task:
        the turn's task being cancelled is what stops its audio)."""
        if not self.ended:
            await asyncio.wait((self._ended,), timeout=timeout)


class Turn:
    def __init__(self, pipeline: Pipeline, options: TurnOptions) -> None:
        self._p = pipeline
        self._opts = options
        self.seed = options.seed if options.seed is not None else draw_seed()
        self.speaker_globals: tuple[int, ...] | None = options.speaker_globals
        self._first_syn = None
        self._first_started = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._syns: dict[int, object] = {}
        self._chunk_started: dict[int, float] = {}
        self._slots = asyncio.Semaphore(options.max_chunks_in_flight)
        self.audio_pushed = False
        self.guard_log = GuardLog()
        """The guards that fired in this turn (each warns once per turn)."""
        self.request_ids: list[str] = []
        self.chunk_globals: list[tuple[int, ...] | None] = []
        """Per finished chunk, the BiCodec globals it was decoded with (None for SNAC)."""
        self.on_request_started: Callable[[], None] = lambda: None
        self.on_speaker_globals: Callable[[tuple[int, ...]], None] = lambda g: None
        """Called once when the turn has captured its speaker globals (not when given)."""
        self.on_chunk_spoken: Callable[[str, float, float, list[int] | None], None] = (
            lambda text, a, b, lengths: None)
        """Called after each chunk's audio with its text as written, its span in the turn's
        audio (seconds from the turn's first sample: exact chunk boundaries for transcripts)
        and, where it was normalised, each word's length as read (else None)."""
        self._texts: dict[int, str] = {}
        self._spoken_lengths: dict[int, asyncio.Future] = {}
        """Per normalised chunk, its words' spoken lengths (computed after its text)."""
        self._request_ids: dict[int, str] = {}
        self._tags_warned = False
        self._first_index: int | None = None
        """The first chunk with text: it starts the voice that later chunks continue."""
        self._adapter: Adapter | None = None
        """The LoRA adapter the turn holds while it speaks."""

    def _learn_globals(self, speaker_globals: tuple[int, ...] | None) -> None:
        if self.speaker_globals is None and speaker_globals is not None:
            self.speaker_globals = speaker_globals
            self.on_speaker_globals(speaker_globals)

    def _accept(self, text: str, index: int) -> str:
        """The chunk's text as the model reads it: tags the profile does not perform are
        removed and counted; the first removal of the turn logs one warning."""
        profile = self._p.profile
        known = getattr(profile, "tags", ())  # a profile of a family of its own may have none
        clean, removed = strip_unknown_tags(text, known)
        if removed:
            _count_removed(len(removed))
            if not self._tags_warned:
                self._tags_warned = True
                logger.warning(
                    "removed tags the model does not perform (later ones in this turn are "
                    "removed silently)",
                    extra={"request_id": self._request_ids[index], "removed_tags": removed,
                           "profile": profile.name, "known_tags": list(known)})
        return clean

    async def _prefetch(self, text: str, index: int, out: _ChunkAudio) -> None:
        """Generate one chunk into ``out`` (float arrays, then its end)."""
        try:
            if not text.strip():  # nothing left to say once its tags were removed
                out.end()
                return
            # as the model must read it (the transcript keeps the text as written, its words
            # timed by what they were read as)
            written = text
            text = await self._p.normalized(text, self._request_ids[index],
                                            self._opts.text_normalization,
                                            self._opts.pronunciations)
            if text != written:
                self._spoken_lengths[index] = self._p.spoken_lengths(
                    spoken_text(written).split(), self._opts.pronunciations)
            if (index != self._first_index and self.speaker_globals is None
                    and self._p.family.captures_speaker_globals):
                await self._await_first_globals()
            sampling = self._opts.sampling
            if index != self._first_index and any(not t.done() for t in self._tasks[:index]):
                sampling = self._p.sampling.queued(sampling)  # its audio waits behind theirs
            syn = self._p.synthesize(text, voice=self._opts.voice, sampling=sampling,
                                     seed=self.seed, request_id=self._request_ids.get(index),
                                     speaker_globals=self.speaker_globals,
                                     adapter=self._adapter, guard_log=self.guard_log)
            self._syns[index] = syn
            if index == self._first_index:
                self._first_syn = syn
                self._first_started.set()
            self.request_ids.append(syn.request_id)
            self.on_request_started()

            def put(pcm: np.ndarray, final: bool) -> None:  # from the decode's completion
                self._learn_globals(syn.speaker_globals)
                if len(pcm):
                    out.put(pcm, final)

            await syn.play(put)
            self.chunk_globals.append(syn.speaker_globals)
            out.end()
        except EmptyTextError:
            out.end()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # delivered in order, where the listener reaches this chunk
            out.end(e)
        finally:
            self._slots.release()

    async def _await_first_globals(self) -> None:
        """Wait until the first chunk with text has captured its globals, or has ended
        without them."""
        first_task = self._tasks[self._first_index]
        await _until(self._first_started, first_task)
        if self._first_syn is not None:
            await _until(self._first_syn.globals_captured, first_task)
            self._learn_globals(self._first_syn.speaker_globals)
        if self.speaker_globals is None:
            raise TurnError("the first chunk ended before its 32 global tokens were captured")

    async def speak(self, chunks: AsyncIterable[str], push: Callable[[np.ndarray], None]) -> None:
        """Synthesize ``chunks`` in order and ``push`` float audio, crossfading the seams
        (the caller rounds it to int16 at its edge)."""
        order: asyncio.Queue[_ChunkAudio | None] = asyncio.Queue()

        async def schedule() -> None:
            index = 0
            try:
                async for text in chunks:
                    await self._slots.acquire()
                    audio = _ChunkAudio()
                    self._chunk_started[index] = time.monotonic()
                    self._request_ids[index] = self._p.engine.new_request_id()
                    text = self._accept(text, index)
                    if self._first_index is None and text.strip():
                        self._first_index = index
                    self._texts[index] = spoken_text(text)
                    self._tasks.append(asyncio.create_task(self._prefetch(text, index, audio),
                                                           name=f"veena-chunk-{index}"))
                    order.put_nowait(audio)
                    index += 1
            except Exception as e:  # the text source failed: after the chunks it gave
                failed = _ChunkAudio()
                failed.end(e)
                order.put_nowait(failed)
            order.put_nowait(None)

        await self._p.start(self._opts.startup_timeout)
        if self._opts.adapter is not None:  # every chunk speaks with the adapter it began
            self._adapter = self._p.adapter(self._opts.adapter)  # with, removed or not
            self._p.engine.adapters.hold(self._adapter)
        joiner = ChunkJoiner(int(self._opts.chunk_crossfade_ms * self._p.sample_rate / 1000))
        scheduler = asyncio.create_task(schedule(), name="veena-turn-schedule")
        rate = self._p.sample_rate
        # a decode completion hands the playing chunk's windows on; once this turn's task is
        # being cancelled nothing more reaches the listener
        cancelling = asyncio.current_task().cancelling

        def play(pcm: np.ndarray, last: bool) -> None:
            if cancelling():
                return
            pcm = joiner.push(pcm, last)
            if len(pcm):
                push(pcm)
                self.audio_pushed = True

        try:
            index, start = 0, 0
            while (chunk := await order.get()) is not None:
                chunk.play(play)
                await self._until_ended(chunk, index)
                if chunk.error is not None:
                    raise chunk.error
                overlap = joiner.end_chunk()
                samples = chunk.samples
                if samples:  # a seam's crossfade counts as the earlier chunk's
                    end = start + samples - overlap
                    if self._texts[index]:
                        self.on_chunk_spoken(self._texts[index], start / rate, end / rate,
                                             self._lengths_of(index))
                    start = end
                index += 1
            tail = joiner.finish()
            if len(tail):
                push(tail)
            await scheduler
        finally:
            await self.aclose(scheduler)
            if self._adapter is not None:
                self._p.engine.adapters.release(self._adapter)
                self._adapter = None

    def _lengths_of(self, index: int) -> list[int] | None:
        """The chunk's words' spoken lengths, where known by now (a transcript falls back to
        the written lengths rather than wait)."""
        fut = self._spoken_lengths.pop(index, None)
        if fut is None or not fut.done() or fut.cancelled() or fut.exception() is not None:
            return None
        return fut.result()

    def _progress_at(self, index: int) -> float:
        syn = self._syns.get(index)
        if syn is not None:
            return syn.progress_at()
        # not started yet: it waits for the first chunk's globals, which is its progress
        first = self._syns.get(self._first_index)
        started = self._chunk_started.get(index, time.monotonic())
        return max(started, first.progress_at()) if first is not None else started

    async def _until_ended(self, chunk: _ChunkAudio, index: int) -> None:
        """Until the chunk ends; TurnTimeout once it has made no progress for ``timeout``
        (one timer per wait, not one per window)."""
        while not chunk.ended:
            remaining = self._progress_at(index) + self._opts.timeout - time.monotonic()
            if remaining <= 0:
                raise TurnTimeout(f"no progress from the engine for {self._opts.timeout:.1f} s")
            await chunk.wait_end(remaining)

    async def aclose(self, *extra: asyncio.Task) -> None:
        tasks = [t for t in (*self._tasks, *extra) if not t.done()]
        for t in tasks:
            t.cancel()
        await settle(tasks)
