"""One WebSocket context: text in through a chunker, one turn of audio out, one end.

Every context ends exactly once. Its end is one done-callback on its task, not code inside
the task: a task cancelled before its first step never runs its own ``except`` or
``finally``, so cleanup that lived there leaked a context (and its slots) whenever a
``cancel`` arrived in the same socket read as the context's first ``speak``. A context that
is cancelled or fails leaves its connection's table at once; its task's end sends its one
terminal event. A context holds a stream slot only while it has something to speak: it takes
one when text is ready and gives it back while it waits for more, and after
``context_idle_s`` with nothing to do it ends with ``idle_timeout``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from typing import Callable, Protocol

from ..pipeline.chunking import TextChunker
from ..pipeline.stitching import to_int16
from ..pipeline.transcripts import word_timings
from ..pipeline.turn import Turn, TurnOptions
from ..protocol import (
    cancelled_event,
    done_event,
    encode_audio,
    error_event,
    voice_event,
    waiting_event,
    words_event,
)
from .admission import Overloaded, StreamSlot
from .errors import error_code
from .state import ServerState

logger = logging.getLogger(__name__)


class Outbox(Protocol):
    """Where a context's events and audio go (``websocket._Outbox``)."""

    def put(self, item: bytes | dict) -> None: ...


class Connection(Protocol):
    """What a context uses of its connection (``websocket._Connection``): typed here, since
    the WebSocket module builds contexts and so imports this one."""

    @property
    def state(self) -> ServerState: ...

    @property
    def out(self) -> Outbox: ...

    def forget(self, ctx: Context) -> None:
        """Take an ending context off the connection's table (idempotent)."""
        ...


class _ContextTurn(Turn):
    """A turn that reports the end of each chunk's generation, so that its context can give
    its stream slot back as soon as nothing generates and no text is waiting."""

    on_chunk_generated: Callable[[], None]

    async def _prefetch(self, text: str, index: int, out) -> None:
        try:
            await super()._prefetch(text, index, out)
        finally:
            self.on_chunk_generated()


class Context:
    """One WebSocket context: text in through a chunker, one turn of audio out.

    States: ``open`` (takes text), ``closed`` (``continue: false`` came; still speaking),
    ``ending`` (cancelled or failed; its task is being stopped)."""

    def __init__(self, cid: str, conn: Connection, turn_opts: TurnOptions) -> None:
        """``conn``: its connection (``state``, ``out``, ``forget(ctx)``)."""
        self.cid = cid
        self.status = "open"
        self._conn = conn
        state = conn.state
        self._state = state
        self._chunker = TextChunker(state.options.chunker)
        self._pieces: collections.deque[str | None] = collections.deque()
        self._wake = asyncio.Event()
        self._max_chars = state.options.max_text_chars
        self.chars = 0
        self._adapter = turn_opts.adapter
        self._slot = StreamSlot(state.admission, self._on_hold)
        self._in_flight = 0
        self._last_activity = time.monotonic()
        self.turn = _ContextTurn(state.pipeline, turn_opts)
        self.turn.on_chunk_generated = self._chunk_generated
        self.turn.on_speaker_globals = lambda g: self._send(voice_event(self.cid, g))
        self.turn.on_chunk_spoken = lambda text, a, b, lengths: self._send(words_event(
            self.cid, [(w.text, w.start, w.end) for w in word_timings(text, a, b, lengths)]))
        self._created = time.perf_counter()
        self.last_sent = time.monotonic()
        self._first_audio: float | None = None
        self._samples = 0
        self._rate = state.pipeline.sample_rate
        self._failure: tuple[str, str] | None = None
        self._cancelled = False
        self.task = asyncio.create_task(self._run(), name=f"veena-ctx-{cid}")
        state.lifecycle.add_context(self)
        self.task.add_done_callback(self._ended)

    # -- the client's messages (called synchronously, in message order) -------------------

    def add_text(self, text: str, more: bool) -> None:
        self.chars += len(text)
        if self.chars > self._max_chars:
            self.fail("text_too_long", f"a context may carry at most {self._max_chars} "
                      "characters")
            return
        self._last_activity = time.monotonic()
        self._queue(self._chunker.push(text))
        if not more:
            self._queue(self._chunker.flush())
            self._pieces.append(None)
            self.status = "closed"
        self._wake.set()

    def flush(self) -> None:
        self._last_activity = time.monotonic()
        self._queue(self._chunker.flush())
        self._wake.set()

    def _queue(self, pieces) -> None:
        self._pieces.extend(p for p in pieces if p.strip())

    def cancel(self) -> None:
        """The client cancelled (or left): stop now, answer ``cancelled``."""
        self._stop()

    def fail(self, code: str, message: str) -> None:
        """End this context now with an ``error`` event of ``code`` (its work is aborted)."""
        self._stop((code, message))

    def _stop(self, failure: tuple[str, str] | None = None) -> None:
        if self.status == "ending" or self.task.done():
            return
        self.status = "ending"
        if failure is None:
            self._cancelled = True
        else:
            self._failure = failure
        self._conn.forget(self)  # frees its context slot at once
        self._slot.give_back()  # and its stream slot
        self.task.cancel()
        self._wake.set()  # a text source waiting for text looks again (see _chunks)

    # -- the turn's side ---------------------------------------------------------------

    def _on_hold(self, held: bool) -> None:
        self._state.metrics.streaming(self._adapter, held)

    def _chunk_generated(self) -> None:
        self._in_flight -= 1
        self._last_activity = time.monotonic()
        if self._in_flight <= 0 and not self._pieces:
            self._slot.give_back()  # nothing generates and nothing waits: hold no slot
        self._wake.set()

    async def _chunks(self):
        """The turn's text: a slot is taken when a piece is ready and given back (by
        ``_chunk_generated``) when nothing is left to generate. It never raises: a failure
        ends the context at once as an ``internal_error`` (a turn would deliver a failed
        text source only after the chunks it gave).

        An ending context's text ends here too, and its task is cancelled once more: on
        Python 3.11 ``asyncio.wait_for`` swallows a cancellation that arrives just as the
        awaited future completes (the turn waits that way), and such a turn would otherwise
        wait for the next text of a context that will never get any."""
        try:
            while True:
                while not self._pieces and self.status != "ending":
                    if not await self._wait_for_text():
                        return
                if self.status == "ending":
                    self.task.cancel()
                    return
                piece = self._pieces.popleft()
                if piece is None:
                    return
                try:
                    await self._slot.take()
                except Overloaded as e:
                    self.fail("overloaded", str(e))
                    return
                if self.status == "ending":
                    continue
                self._in_flight += 1
                yield piece
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as e:
            logger.exception("context text source failed", extra={"context_id": self.cid})
            self.fail("internal_error", str(e) or repr(e))

    async def _wait_for_text(self) -> bool:
        """Wait for the client's next text; False once the context has ended by idling."""
        idle_s = self._state.options.context_idle_s
        self._wake.clear()
        timeout = None
        if self._in_flight <= 0:
            self._slot.give_back()
            timeout = self._last_activity + idle_s - time.monotonic()
            if timeout <= 0:
                self.fail("idle_timeout", f"no text for {idle_s:g} s (VEENA_CONTEXT_IDLE_S): "
                          "send continue: false to end a context")
                return False
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)
        return True

    def _send(self, item: bytes | dict) -> None:
        self.last_sent = time.monotonic()
        self._conn.out.put(item)

    def keepalive(self, every_s: float) -> None:
        """A ``waiting`` event if nothing went out for ``every_s`` and the context still
        runs (an ending context's next message is its terminal event)."""
        if (self.status != "ending" and time.monotonic() - self.last_sent >= every_s
                and not self.task.done()):
            self._send(waiting_event(self.cid))

    def _push(self, pcm) -> None:
        if self._first_audio is None:
            self._first_audio = time.perf_counter()
            self._state.metrics.first_audio.observe(self._first_audio - self._created)
        self._samples += len(pcm)
        self._send(encode_audio(self.cid, to_int16(pcm).tobytes()))

    async def _run(self) -> None:
        await self.turn.speak(self._chunks(), self._push)
        audio_s = self._samples / self._rate
        if audio_s > 0:
            self._state.metrics.rtf.observe((time.perf_counter() - self._created) / audio_s)

    def _ended(self, task: asyncio.Task) -> None:
        """The one place a context ends: whatever stopped its task, and even when the task
        never ran a step, exactly one terminal event goes out and every slot comes back."""
        metrics = self._state.metrics
        self.status = "ending"
        self._conn.forget(self)
        self._slot.give_back()
        self._state.lifecycle.remove_context(self)
        error = None if task.cancelled() else task.exception()
        if self._failure is not None:
            outcome = self._failure[0]
            event = error_event(self.cid, *self._failure)
        elif task.cancelled() or self._cancelled:
            outcome = "cancelled"
            metrics.aborted.inc()
            event = cancelled_event(self.cid)
        elif error is not None:
            outcome = error_code(error)
            if outcome == "internal_error":
                logger.error("context failed", exc_info=error, extra={"context_id": self.cid})
            event = error_event(self.cid, outcome, str(error) or repr(error))
        else:
            outcome = "done"
            event = done_event(self.cid, self._samples / self._rate)
        if self._failure is not None or error is not None:
            logger.info("context ended: %s", outcome, extra={"context_id": self.cid})
        metrics.finished.labels(outcome).inc()
        self._send(event)
