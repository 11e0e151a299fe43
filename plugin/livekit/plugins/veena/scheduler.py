"""The decode scheduler of a pipeline (one per engine and codec, so one per process in normal
use): batches same-shape windows from every live request of that pipeline.

A window is a cancellable unit of work: cancelling a request (or the task awaiting its
window) removes its pending windows before they reach the codec. The codec runs on one
worker thread, so the event loop never blocks on torch, and one batch runs at a time while
the next one gathers.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from .codecs.base import Codec, CodecInput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerOptions:
    max_batch: int = 16
    max_wait_ms: float = 2.0
    """How long the first window of a batch waits for same-shape company."""


@dataclass
class SchedulerStats:
    batches: int = 0
    windows: int = 0
    cancelled_windows: int = 0
    batch_sizes: collections.Counter = field(default_factory=collections.Counter)
    queue_wait_s_total: float = 0.0
    decode_s_total: float = 0.0


@dataclass(eq=False)
class _Job:
    request_id: str
    input: CodecInput
    future: asyncio.Future
    enqueued: float


class DecodeScheduler:
    def __init__(
        self,
        codec: Codec,
        options: SchedulerOptions = SchedulerOptions(),
    ) -> None:
        self.codec = codec
        self.options = options
        self.stats = SchedulerStats()
        self._listeners: list[Callable[[int, float, float], None]] = []
        self._pending: collections.deque[_Job] = collections.deque()
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="veena-decode")
        self._closed = False
        self.last_done = time.monotonic()
        """When the codec last finished a batch: proof that queued windows will move."""

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._wakeup = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="veena-decode")

    def submit(self, request_id: str, item: CodecInput) -> asyncio.Future:
        """Queue one window and return its future (cancel it to drop the window)."""
        if self._closed:
            raise RuntimeError("decode scheduler is closed")
        self._ensure_running()
        fut = asyncio.get_running_loop().create_future()
        self._pending.append(_Job(request_id, item, fut, time.perf_counter()))
        assert self._wakeup is not None
        self._wakeup.set()
        return fut

    def add_batch_listener(self, listener: Callable[[int, float, float], None]) -> None:
        """Called after every batch with (batch size, mean queue wait s, decode s)."""
        self._listeners.append(listener)

    def cancel_request(self, request_id: str) -> int:
        """Drop every pending window of ``request_id``; return how many were dropped."""
        dropped = 0
        for job in list(self._pending):
            if job.request_id == request_id and not job.future.done():
                job.future.cancel()
                dropped += 1
        self._prune()
        return dropped

    def pending_for(self, request_id: str) -> int:
        return sum(1 for j in self._pending if j.request_id == request_id and not j.future.done())

    @property
    def pending(self) -> int:
        return sum(1 for j in self._pending if not j.future.done())

    def _prune(self) -> None:
        live = collections.deque()
        for job in self._pending:
            if job.future.cancelled():
                self.stats.cancelled_windows += 1
            elif not job.future.done():
                live.append(job)
        self._pending = live

    def _take_batch(self) -> list[_Job]:
        self._prune()
        if not self._pending:
            return []
        key = self._pending[0].input.batch_key()
        batch, rest = [], collections.deque()
        for job in self._pending:
            if len(batch) < self.options.max_batch and job.input.batch_key() == key:
                batch.append(job)
            else:
                rest.append(job)
        self._pending = rest
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wakeup is not None
        while not self._closed:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            first = self._pending[0].enqueued
            wait = self.options.max_wait_ms / 1000.0 - (time.perf_counter() - first)
            if wait > 0 and len(self._pending) < self.options.max_batch:
                await asyncio.sleep(wait)
            batch = self._take_batch()
            if not batch:
                continue
            started = time.perf_counter()
            try:
                results = await loop.run_in_executor(
                    self._executor, self.codec.decode, [j.input for j in batch]
                )
            except Exception as e:  # the codec failed: every window of this batch fails
                logger.exception("codec decode failed", extra={"batch": len(batch)})
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(e)
                continue
            done = time.perf_counter()
            self.last_done = time.monotonic()
            wait_mean = sum(started - j.enqueued for j in batch) / len(batch)
            self.stats.batches += 1
            self.stats.windows += len(batch)
            self.stats.batch_sizes[len(batch)] += 1
            self.stats.queue_wait_s_total += wait_mean * len(batch)
            self.stats.decode_s_total += done - started
            for listener in self._listeners:
                listener(len(batch), wait_mean, done - started)
            for job, audio in zip(batch, results):
                if not job.future.done():
                    job.future.set_result(audio)

    async def aclose(self) -> None:
        self._closed = True
        for job in self._pending:
            job.future.cancel()
        self._pending.clear()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=False, cancel_futures=True)
