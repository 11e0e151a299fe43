"""Admission control: how many streams run at once, and how many may wait for a slot.

Past capacity a server that keeps accepting work only makes every stream slower until they
all time out. Here a new stream either gets a slot, waits in a bounded FIFO queue for a
bounded time, or is refused at once with ``Overloaded``: a retryable refusal that another
replica or a ``tts.FallbackAdapter`` can act on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable


class Overloaded(RuntimeError):
    """No slot now and no room (or no time left) in the wait queue."""

    def __init__(self, message: str, reason: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class AdmissionOptions:
    max_active: int
    """Streams synthesizing at once."""
    max_queued: int
    """Streams waiting for a slot; one more is refused at once."""
    max_queue_wait_s: float
    """A waiting stream is refused once it has waited this long."""


class Admission:
    def __init__(self, options: AdmissionOptions,
                 on_change: Callable[[int, int], None] = lambda active, queued: None,
                 on_wait: Callable[[float], None] = lambda seconds: None,
                 on_reject: Callable[[str], None] = lambda reason: None) -> None:
        self.options = options
        self.active = 0
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._on_change = on_change
        self._on_wait = on_wait
        self._on_reject = on_reject

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def _changed(self) -> None:
        self._on_change(self.active, self.queued)

    def _refuse(self, reason: str, message: str) -> Overloaded:
        self._on_reject(reason)
        return Overloaded(message, reason, retry_after_s=1.0)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one stream slot for the body; raise ``Overloaded`` when none can be had."""
        await self.acquire()
        try:
            yield
        finally:
            self._release()

    async def acquire(self) -> None:
        """Take one stream slot (give it back with ``release``); ``Overloaded`` when none
        can be had. A caller cancelled while it waits holds nothing."""
        opts = self.options
        if self.active >= opts.max_active or self._waiters:
            if len(self._waiters) >= opts.max_queued:
                raise self._refuse("queue_full", f"server at capacity: {self.active} streams "
                                   f"running and {len(self._waiters)} waiting")
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            self._changed()
            started = time.monotonic()
            try:
                await asyncio.wait_for(asyncio.shield(waiter), opts.max_queue_wait_s)
            except BaseException as e:
                if _granted(waiter):  # the slot came just as we gave up: hand it on
                    self._release()
                else:
                    waiter.cancel()
                    self._waiters.remove(waiter)
                    self._changed()
                if isinstance(e, asyncio.TimeoutError):
                    raise self._refuse("queue_timeout", "server at capacity: no stream slot "
                                       f"within {opts.max_queue_wait_s:.1f} s") from None
                raise
            self._on_wait(time.monotonic() - started)
        else:
            self.active += 1
            self._changed()
            self._on_wait(0.0)

    def release(self) -> None:
        """Give back a slot taken with ``acquire`` (once per ``acquire``)."""
        self._release()

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)  # the slot passes straight to the next waiter
                self._changed()
                return
        self.active -= 1
        self._changed()


class StreamSlot:
    """One stream's hold on a slot, taken when it has text to speak and given back while it
    waits for more: ``give_back`` is idempotent, so every exit path may call it."""

    def __init__(self, admission: Admission,
                 on_hold: Callable[[bool], None] = lambda held: None) -> None:
        self._admission = admission
        self._on_hold = on_hold
        self.held = False

    async def take(self) -> None:
        """Hold a slot (no-op while held); ``Overloaded`` when none can be had."""
        if self.held:
            return
        await self._admission.acquire()
        self.held = True
        self._on_hold(True)

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self._admission.release()
            self._on_hold(False)


def _granted(waiter: asyncio.Future) -> bool:
    return waiter.done() and not waiter.cancelled() and waiter.result() is True
