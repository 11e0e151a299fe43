"""The decode scheduler of a pipeline (one per engine and codec, so one per process in normal
use): batches same-shape windows from every live request of that pipeline.

A window is a cancellable unit of work: cancelling a request (or the task awaiting its
window) removes its pending windows before they reach the codec. The codec runs on one
worker thread, so the event loop never blocks on torch, and one batch runs at a time while
the next one gathers. No task runs the scheduler: a batch starts from a submit, from the
previous batch's end (one callback from the worker) or from one timer, so a window costs
the loop no task wakes of its own.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..codecs.base import Codec, CodecInput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerOptions:
    max_batch: int = 16
    max_wait_ms: float = 2.0
    """How long the first window of a batch waits for same-shape company."""
    adaptive_batch: bool = True
    """Batch only as far as it measurably pays on this device: on a GPU a batch of windows
    costs little more than one; on a CPU it costs about the sum, and every window in it
    waits for the whole call."""


@dataclass
class SchedulerStats:
    batches: int = 0
    windows: int = 0
    decoded_steps: int = 0
    """Codec steps decoded, context included (work; against the steps kept: overhead); a
    streaming codec decodes each step once."""
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
    on_done: Callable[[asyncio.Future], None] | None = None


class DecodeScheduler:
    def __init__(
        self,
        codec: Codec,
        options: SchedulerOptions = SchedulerOptions(),
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``clock``: seconds, read on the worker around each codec call (tests pass a
        simulated one)."""
        self.codec = codec
        self._clock = clock
        self.options = options
        self.stats = SchedulerStats()
        self._listeners: list[Callable[[int, float, float], None]] = []
        self._pending: collections.deque[_Job] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.Handle | None = None
        """When the next batch is due, if none is in the codec: the next loop turn after a
        submit, or the first window's ``max_wait_ms``."""
        self._running: list[_Job] | None = None
        """The batch in the codec now (one at a time; the next gathers meanwhile)."""
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="veena-decode")
        self._closed = False
        self._cost: dict[int, float] = {}
        """Window steps -> recent seconds of the codec call that decoded such windows, timed
        on the worker (no queue wait, no event-loop delay)."""
        self._per_window: dict[int, float] = {}
        """Batch size bucket (a power of two) -> recent decode seconds per window."""
        self._since_probe = 0
        self.last_done = time.monotonic()
        """When the codec last finished a batch: proof that queued windows will move."""

    def submit(self, request_id: str, item: CodecInput,
               on_done: Callable[[asyncio.Future], None] | None = None) -> asyncio.Future:
        """Queue one window and return its future (cancel it to drop the window).

        ``on_done(future)`` is called as the scheduler completes the window (decoded, failed,
        or dropped by ``aclose``), in the same step rather than a loop turn later as a done
        callback would be; not when the caller cancels the future itself."""
        if self._closed:
            raise RuntimeError("decode scheduler is closed")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # a new event loop (the scheduler serves one at a time): what was queued on the
            # old one can never be delivered there
            self._loop, self._timer, self._running = loop, None, None
            self._pending.clear()
        fut = loop.create_future()
        self._pending.append(_Job(request_id, item, fut, time.perf_counter(), on_done))
        if self._running is None and self._timer is None:
            # the batch starts a loop turn later, with every window submitted in this one
            self._timer = loop.call_soon(self._on_timer)
        return fut

    def run_on_codec_thread(self, fn: Callable[[], Any]) -> asyncio.Future:
        """``fn()`` on the thread that decodes, in turn with the batches (the codec's warm-up):
        the codec's torch work stays on one thread (``codecs/torch_threads``)."""
        return asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def decode_cost(self, steps: int) -> float | None:
        """Seconds the codec takes for a window of ``steps`` steps, as measured on this
        codec and device (start to end of the codec call, on its worker): that size's own
        measurement, else the smallest larger one's (decode work never shrinks with more
        steps), else None. Never a guess from smaller sizes: a caller that wants a size
        larger than any measured must try it first."""
        cost = self._cost.get(steps)
        if cost is not None or not self._cost:
            return cost
        larger = [k for k in self._cost if k > steps]
        return self._cost[min(larger)] if larger else None

    def batch_limit(self) -> int:
        """The largest batch worth building now (see ``SchedulerOptions.adaptive_batch``):
        the largest batch size measured to cost at most 0.9 of a window alone, per window."""
        if not self.options.adaptive_batch or self.options.max_batch <= 1:
            return self.options.max_batch
        single = self._per_window.get(1)
        if single is None:
            return 1  # measure one window alone first
        limit = max((b for b, cost in self._per_window.items() if b == 1 or cost <= 0.9 * single))
        return min(self.options.max_batch, limit)

    def _probe_limit(self, waiting: int) -> int:
        """Now and then (every 16 batches, when enough windows wait), try a batch twice the
        largest measured, so the limit can grow where batching pays."""
        limit = self.batch_limit()
        if not self.options.adaptive_batch or self._since_probe < 16:
            return limit
        probe = min(self.options.max_batch, 2 * max(self._per_window, default=1))
        if probe > limit and waiting >= probe:
            self._since_probe = 0
            return probe
        return limit

    def _measure(self, batch: list["_Job"], started: float, done: float) -> None:
        """One codec call, timed on the worker: its cost for each window shape it held
        (a batch holds one shape), and its cost per window for its batch size."""
        call = done - started
        for steps in {job.input.cost_steps for job in batch}:
            old = self._cost.get(steps)
            self._cost[steps] = call if old is None else 0.7 * old + 0.3 * call
        bucket = 1 << (len(batch).bit_length() - 1)
        per = (done - started) / len(batch)
        self._per_window[bucket] = per if bucket not in self._per_window else \
            0.7 * self._per_window[bucket] + 0.3 * per

    def add_batch_listener(self, listener: Callable[[int, float, float], None]) -> None:
        """Called after every batch with (batch size, mean queue wait s, decode s)."""
        self._listeners.append(listener)

    def remove_batch_listener(self, listener: Callable[[int, float, float], None]) -> None:
        """Undo ``add_batch_listener`` (a server app closing over a pipeline it does not own)."""
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

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
        limit = self._probe_limit(sum(1 for j in self._pending if j.input.batch_key() == key))
        self._since_probe += 1
        batch, rest = [], collections.deque()
        for job in self._pending:
            if len(batch) < limit and job.input.batch_key() == key:
                batch.append(job)
            else:
                rest.append(job)
        self._pending = rest
        return batch

    def _schedule(self) -> None:
        """With no batch in the codec: start the next one now, or arm one timer for when its
        first window has waited ``max_wait_ms`` for company. Called where that can change
        (a batch's end, the timer), so no task sleeps or polls."""
        if self._closed or self._running is not None or self._loop is None:
            return
        if not self._pending:
            self._cancel_timer()
            return
        wait = self.options.max_wait_ms / 1000.0 - (time.perf_counter() - self._pending[0].enqueued)
        if wait > 0 and len(self._pending) < self.batch_limit():
            if self._timer is None:
                self._timer = self._loop.call_later(wait, self._on_timer)
            return
        self._cancel_timer()
        batch = self._take_batch()
        if not batch:
            return
        self._running = batch
        submitted = time.perf_counter()
        loop = self._loop
        work = self._executor.submit(self._decode_timed, [j.input for j in batch])
        work.add_done_callback(lambda w: _call_back(loop, self._finish, batch, submitted, w))

    def _on_timer(self) -> None:
        self._timer = None
        self._schedule()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _finish(self, batch: list[_Job], submitted: float,
                work: concurrent.futures.Future) -> None:
        """On the loop, once per codec call: route its windows back, then start the next."""
        if self._running is not batch:  # closed meanwhile: its windows ended in aclose
            return
        error = RuntimeError("codec decode was cancelled") if work.cancelled() else \
            work.exception()
        if error is None:
            results, started, done = work.result()
            if len(results) != len(batch):
                error = RuntimeError(f"the codec returned {len(results)} windows for a "
                                     f"batch of {len(batch)}")
        if error is not None:  # every window of this batch fails
            logger.error("codec decode failed", exc_info=error, extra={"batch": len(batch)})
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(error)
                    _notify(job)
        else:
            self._delivered(batch, submitted, results, started, done)
        self._running = None  # what the callbacks above submitted joins the next batch
        self._schedule()

    def _delivered(self, batch: list[_Job], submitted: float, results: list,
                   started: float, done: float) -> None:
        """A codec call that succeeded: its measurements and stats, then each window's
        result and completion."""
        self.last_done = time.monotonic()
        self._measure(batch, started, done)
        wait_mean = sum(submitted - j.enqueued for j in batch) / len(batch)
        self.stats.batches += 1
        self.stats.windows += len(batch)
        self.stats.decoded_steps += sum(j.input.work_steps for j in batch)
        self.stats.batch_sizes[len(batch)] += 1
        self.stats.queue_wait_s_total += wait_mean * len(batch)
        self.stats.decode_s_total += done - started
        for listener in self._listeners:
            try:
                listener(len(batch), wait_mean, done - started)
            except Exception:
                logger.exception("decode batch listener failed")
        for job, audio in zip(batch, results):
            if not job.future.done():
                job.future.set_result(audio)
                _notify(job)

    def _decode_timed(self, inputs: list[CodecInput]) -> tuple[list, float, float]:
        """On the worker: the codec call and its own start and end on ``clock``."""
        started = self._clock()
        results = self.codec.decode(inputs)
        return results, started, self._clock()

    async def aclose(self) -> None:
        """Drop every queued window and end those in the codec now (the codec call itself
        finishes on the worker; its results are discarded)."""
        self._closed = True
        self._cancel_timer()
        for job in [*self._pending, *(self._running or ())]:
            if job.future.cancel():
                _notify(job)
        self._pending.clear()
        self._running = None
        self._executor.shutdown(wait=False, cancel_futures=True)


def _call_back(loop: asyncio.AbstractEventLoop, callback: Callable, *args) -> None:
    """From the worker: one callback on the loop (none if the loop has closed: nobody is
    left to take the windows)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)


def _notify(job: _Job) -> None:
    """A window's ``on_done``; its failure is logged, never the scheduler's."""
    if job.on_done is not None:
        try:
            job.on_done(job.future)
        except Exception:
            logger.exception("decode completion callback failed",
                             extra={"request_id": job.request_id})
