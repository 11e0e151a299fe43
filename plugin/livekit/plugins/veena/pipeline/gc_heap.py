"""Freeze the start-up heap, so a full garbage collection no longer pauses every stream.

After start-up the process holds torch, vLLM, transformers and their modules: about 160,000
tracked objects. A full (oldest-generation) collection walks them all, and streaming's
allocation churn triggers one every second or two: measured with 256 real-time streams
(``bench/control_plane.py``), each paused the one event loop that every stream shares for
90-340 ms, which every listener hears as a gap. Frozen after start-up (``gc.freeze``, as
vLLM's own API server does), a collection walks only what was allocated since. What start-up
left behind is never freed; it is alive for the process's life anyway. Anything loaded after
the freeze (a lazy import on a first request) is walked again by every full collection, so
the pipeline loads its tokenizer and token table before it freezes.

What streaming itself keeps alive is walked too: about 270 tracked objects per stream
(tasks, coroutines, queues, events, the connection), 70,000 at 256 streams, and one full
collection of those paused the loop 40-50 ms, again heard as a gap. Streaming makes no
cyclic garbage (at 256 streams every collection of every generation found none; refcounting
frees it all), so a full collection in the middle of streaming only costs. Once frozen, full
collections wait for a moment no stream is playing (the last one ends), or run when a stream
starts after ``max_interval_s`` without one; the young generations are collected as always,
so a cycle that dies young is still freed at once.

At exit the heap is thawed: frozen objects escape even the interpreter's last collection,
and an extension whose objects are never freed reports them as leaks when it unloads
(torch's triton, through nanobind: some 30 lines of "nanobind: leaked ..." after every
``veena-tts say`` and every stopped worker).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import gc
import logging
import threading
import time
from typing import Iterator

logger = logging.getLogger(__name__)

_IDLE_DELAY_S = 0.1
"""How long after the last stream ends a due collection waits (its audio leaves first)."""


_REFREEZE_DELAY_S = 1.0
"""How long after a pipeline closes the heap is frozen again for those still running (the
closing caller has let go of the closed one by then)."""

_running = 0
"""Started pipelines that froze the heap and have not closed."""
_pending: asyncio.TimerHandle | None = None
"""The refreeze waiting for its moment."""


def freeze_startup_heap() -> None:
    """Collect once, then freeze every object alive now. Called when a pipeline has started
    (engine, codec, tokenizer and token table loaded); a second pipeline's start freezes what
    was loaded since (cheap: the frozen part is not walked again)."""
    global _running
    _running += 1
    _thaw_at_exit()
    _freeze()


def _freeze() -> None:
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    logger.info("froze the start-up heap (full collections skip it from now on)",
                extra={"objects": gc.get_freeze_count(),
                       "ms": round((time.perf_counter() - started) * 1000, 1)})


def release_closed_heap() -> None:
    """A pipeline that froze the heap has closed. Its engine client, codec and caches were
    frozen with the rest of start-up, and frozen objects are never freed: a process that
    closes one pipeline and starts another would keep both. So the heap is thawed (the closed
    one goes with a later collection, once nothing refers to it) and, while other pipelines
    still run, frozen again shortly after, at a moment no stream plays."""
    global _running
    _running = max(0, _running - 1)
    gc.unfreeze()
    if _running:
        _refreeze_later()


def _refreeze_later() -> None:
    global _pending
    if _pending is not None:
        _pending.cancel()
    try:
        _pending = asyncio.get_running_loop().call_later(_REFREEZE_DELAY_S, _refreeze)
    except RuntimeError:  # no loop (a synchronous close): now
        _pending = None
        _refreeze()


def _refreeze() -> None:
    global _pending
    _pending = None
    if not _running or gc.get_freeze_count():
        return
    if full_collections.playing:
        _refreeze_later()
        return
    _freeze()


@functools.cache
def _thaw_at_exit() -> None:
    """Once per process: the exit's last collection then frees what start-up left, as in a
    process that never froze."""
    atexit.register(gc.unfreeze)


class FullCollections:
    """When the oldest generation is collected: Python's own schedule until ``defer``, then
    only while no stream plays (or on a stream's start, after ``max_interval_s`` without
    one), and only when Python's schedule would have run one by then. One per process."""

    _NEVER = 1 << 30

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._max_interval_s = 0.0
        self._due_after: int | None = None
        """Python's own oldest-generation threshold while deferred; None: not deferred."""
        self._last = time.monotonic()
        self.collections = 0

    @property
    def playing(self) -> bool:
        """Whether a stream plays now."""
        return self._active > 0

    @property
    def deferred(self) -> bool:
        return self._due_after is not None

    def defer(self, max_interval_s: float) -> None:
        """Take over the oldest generation's schedule (``max_interval_s`` <= 0: leave it)."""
        if max_interval_s <= 0:
            return
        with self._lock:
            young, middle, oldest = gc.get_threshold()
            if self._due_after is None:
                self._due_after = oldest
                gc.set_threshold(young, middle, self._NEVER)
            self._max_interval_s = max_interval_s
            self._last = time.monotonic()

    def restore(self) -> None:
        """Give the schedule back to Python."""
        with self._lock:
            if self._due_after is not None:
                young, middle, _ = gc.get_threshold()
                gc.set_threshold(young, middle, self._due_after)
                self._due_after = None

    @contextlib.contextmanager
    def streaming(self) -> Iterator[None]:
        """Around one stream's life: the last one to end collects, if one is due."""
        with self._lock:
            self._active += 1
            overdue = time.monotonic() - self._last >= self._max_interval_s
        if overdue:
            self._collect_if_due("interval")
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                idle = self._active == 0
            if idle:
                try:  # after the stream's last audio has gone out, if still idle then
                    asyncio.get_running_loop().call_later(_IDLE_DELAY_S, self._collect_if_idle)
                except RuntimeError:
                    self._collect_if_due("idle")

    def _collect_if_idle(self) -> None:
        if self._active == 0:
            self._collect_if_due("idle")

    def _collect_if_due(self, reason: str) -> None:
        due_after = self._due_after
        if due_after is None or gc.get_count()[2] < due_after:
            return
        started = time.perf_counter()
        gc.collect()
        self._last = time.monotonic()
        self.collections += 1
        logger.info("full garbage collection", extra={
            "reason": reason, "ms": round((time.perf_counter() - started) * 1000, 1)})


full_collections = FullCollections()
