"""``GET /v1/stream``: the WebSocket protocol (``protocol.py``), several contexts per socket.

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
import socket
import time
from typing import Callable

from aiohttp import WSMsgType, web

from ..pipeline.chunking import TextChunker
from ..pipeline.stitching import to_int16
from ..pipeline.transcripts import word_timings
from ..pipeline.turn import Turn, TurnOptions
from ..protocol import (
    ClientMessage,
    ProtocolError,
    cancelled_event,
    done_event,
    encode_audio,
    error_event,
    parse_client_message,
    rejected_event,
    voice_event,
    waiting_event,
    words_event,
)
from .admission import Overloaded, StreamSlot
from .state import ServerState, error_code, json_error, server_state, turn_options

logger = logging.getLogger(__name__)

_ENDED_IDS_KEPT = 256
"""Ended context ids a connection remembers, so that a late message for one is rejected
instead of starting a new context under a stale id (ids are single-use)."""


class _Outbox:
    """One connection's outgoing messages, bounded in bytes: a client that cannot keep up
    is cut off instead of growing the server's memory."""

    def __init__(self, limit: int, on_overflow: Callable[[], None],
                 on_bytes: Callable[[int], None]) -> None:
        self._items: asyncio.Queue = asyncio.Queue()
        self.bytes = 0
        self._limit = limit
        self._on_overflow = on_overflow
        self._on_bytes = on_bytes
        self.closed = False

    def _count(self, delta: int) -> None:
        self.bytes += delta
        self._on_bytes(delta)

    def put(self, item: bytes | dict) -> None:
        if self.closed:
            return
        if isinstance(item, bytes):
            if self.bytes + len(item) > self._limit:
                self.closed = True
                self._on_overflow()
                return
            self._count(len(item))
        self._items.put_nowait(item)

    def _taken(self, item: bytes | dict) -> bytes | dict:
        if isinstance(item, bytes):
            self._count(-len(item))
        return item

    async def get(self) -> bytes | dict:
        return self._taken(await self._items.get())

    def get_nowait(self) -> bytes | dict | None:
        return None if self._items.empty() else self._taken(self._items.get_nowait())

    def discard(self) -> None:
        """Forget what is still queued (the connection is gone)."""
        while self.get_nowait() is not None:
            pass


class _ContextTurn(Turn):
    """A turn that reports the end of each chunk's generation, so that its context can give
    its stream slot back as soon as nothing generates and no text is waiting."""

    on_chunk_generated: Callable[[], None]

    async def _prefetch(self, text: str, index: int, out: asyncio.Queue) -> None:
        try:
            await super()._prefetch(text, index, out)
        finally:
            self.on_chunk_generated()


class Context:
    """One WebSocket context: text in through a chunker, one turn of audio out.

    States: ``open`` (takes text), ``closed`` (``continue: false`` came; still speaking),
    ``ending`` (cancelled or failed; its task is being stopped)."""

    def __init__(self, cid: str, conn: "_Connection", turn_opts: TurnOptions) -> None:
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
        self._slot = StreamSlot(state.admission, self._on_hold)
        self._in_flight = 0
        self._last_activity = time.monotonic()
        self.turn = _ContextTurn(state.pipeline, turn_opts)
        self.turn.on_chunk_generated = self._chunk_generated
        self.turn.on_speaker_globals = lambda g: self._send(voice_event(self.cid, g))
        self.turn.on_chunk_spoken = lambda text, a, b: self._send(words_event(
            self.cid, [(w.text, w.start, w.end) for w in word_timings(text, a, b)]))
        self._created = time.perf_counter()
        self.last_sent = time.monotonic()
        self._first_audio: float | None = None
        self._samples = 0
        self._rate = state.pipeline.sample_rate
        self._failure: tuple[str, str] | None = None
        self._cancelled = False
        state.contexts.add(self)
        self.task = asyncio.create_task(self._run(), name=f"veena-ctx-{cid}")
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
        (self._state.metrics.active_streams.inc if held else
         self._state.metrics.active_streams.dec)()

    def _chunk_generated(self) -> None:
        self._in_flight -= 1
        self._last_activity = time.monotonic()
        if self._in_flight <= 0 and not self._pieces:
            self._slot.give_back()  # nothing generates and nothing waits: hold no slot
        self._wake.set()

    async def _chunks(self):
        """The turn's text: a slot is taken when a piece is ready and given back (by
        ``_chunk_generated``) when nothing is left to generate. It never raises: the turn
        would wait forever for a chunk that a failed text source never sends.

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
        if time.monotonic() - self.last_sent >= every_s and not self.task.done():
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
        self._state.contexts.discard(self)
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


class _Connection:
    """One socket's contexts, its outbox, and the ids of its recently ended contexts."""

    def __init__(self, state: ServerState, out: _Outbox) -> None:
        self.state = state
        self.out = out
        self.contexts: dict[str, Context] = {}
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()

    def forget(self, ctx: Context) -> None:
        """Take an ending context off the table (idempotent); its id stays ended."""
        if self.contexts.get(ctx.cid) is ctx:
            del self.contexts[ctx.cid]
        self._remember_ended(ctx.cid)

    def _remember_ended(self, cid: str) -> None:
        self._ended[cid] = None
        self._ended.move_to_end(cid)
        while len(self._ended) > _ENDED_IDS_KEPT:
            self._ended.popitem(last=False)

    def _reject(self, cid: str, code: str, message: str) -> None:
        self.out.put(rejected_event(cid, code, message))

    def handle(self, msg: ClientMessage) -> None:
        cid = msg.context_id
        ctx = self.contexts.get(cid)
        ended = cid in self._ended
        if msg.type == "cancel":
            if ctx is not None:
                ctx.cancel()
            elif not ended:  # a cancel that crossed its context's end is answered by nothing
                self._reject(cid, "unknown_context", "no such context")
            return
        if ctx is None and ended:
            self._reject(cid, "context_ended", "this context has ended (context ids are "
                         "single-use on a connection)")
            return
        if msg.type == "flush":
            if ctx is None:
                self._reject(cid, "unknown_context", "no such context")
            elif ctx.status != "open":
                self._reject(cid, "context_ended", "this context's text has ended")
            else:
                ctx.flush()
            return
        if ctx is not None:
            if ctx.status != "open":
                self._reject(cid, "context_ended", "this context's text has ended")
            else:
                ctx.add_text(msg.text, msg.more)
            return
        try:
            ctx = self._start(msg)
        except ProtocolError as e:  # the context's one terminal event: it never started
            self._remember_ended(cid)
            self.out.put(e.event())
            return
        ctx.add_text(msg.text, msg.more)

    def _start(self, msg: ClientMessage) -> Context:
        state, opts = self.state, self.state.options
        refusal = state.refusal()
        if refusal is not None:
            raise ProtocolError(*refusal, msg.context_id)
        if len(self.contexts) >= opts.max_contexts_per_connection:
            raise ProtocolError("too_many_contexts",
                                f"at most {opts.max_contexts_per_connection} contexts per "
                                "connection", msg.context_id)
        if len(msg.text) > opts.max_text_chars:
            raise ProtocolError("text_too_long",
                                f"a context may carry at most {opts.max_text_chars} characters",
                                msg.context_id)
        try:
            turn_opts = turn_options(state, msg.voice, msg.sampling, msg.seed,
                                     msg.speaker_globals)
        except ValueError as e:
            raise ProtocolError(error_code(e), str(e), msg.context_id) from None
        ctx = Context(msg.context_id, self, turn_opts)
        self.contexts[msg.context_id] = ctx
        return ctx

    async def close(self) -> None:
        """The client left: cancel every context and wait until each has ended."""
        live = [ctx for ctx in self.state.contexts if ctx._conn is self]
        for ctx in live:
            ctx.cancel()
        pending = {ctx.task for ctx in live}
        while pending:  # a cancellation swallowed by a racing wait_for (3.11) gets another
            _, pending = await asyncio.wait(pending, timeout=1.0)
            for task in pending:
                task.cancel()


async def stream(request: web.Request) -> web.StreamResponse:
    """``GET /v1/stream``: one WebSocket, its contexts, and its bounded outgoing buffer."""
    state = server_state(request)
    opts = state.options
    if state.connections >= opts.max_connections:
        state.metrics.rejected.labels("connections").inc()
        return json_error("overloaded", f"at most {opts.max_connections} connections",
                          retry_after_s=1.0)
    refusal = state.refusal()
    if refusal is not None:
        return json_error(*refusal)
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, opts.socket_send_buffer_bytes)
    ws = web.WebSocketResponse(max_msg_size=opts.max_frame_bytes, heartbeat=30)
    await ws.prepare(request)
    state.connections += 1
    state.metrics.connections.inc()
    conn: _Connection

    def cut_off(why: str) -> None:
        """The client stopped reading: drop its work and its socket."""
        logger.warning("slow client: closing its connection",
                       extra={"reason": why, "contexts": list(conn.contexts)})
        state.metrics.slow_clients.inc()
        for ctx in list(conn.contexts.values()):
            ctx.fail("slow_client", "the client stopped reading: connection closed")
        if request.transport is not None:
            request.transport.abort()

    out = _Outbox(opts.max_connection_buffer_bytes, lambda: cut_off("output buffer full"),
                  state.metrics.buffered_bytes.inc)
    conn = _Connection(state, out)

    async def writer() -> None:
        while True:
            item = await out.get()
            send = ws.send_bytes(item) if isinstance(item, bytes) else ws.send_json(item)
            try:
                await asyncio.wait_for(send, opts.slow_client_s)
            except asyncio.TimeoutError:
                out.closed = True
                cut_off(f"no read for {opts.slow_client_s:.1f} s")
                return

    async def keepalive() -> None:
        while True:
            await asyncio.sleep(opts.keepalive_s / 2)
            for ctx in list(conn.contexts.values()):
                ctx.keepalive(opts.keepalive_s)

    write_task = asyncio.create_task(writer(), name="veena-ws-writer")
    keepalive_task = asyncio.create_task(keepalive(), name="veena-ws-keepalive")
    try:
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                out.put(error_event(None, "bad_message", "binary frames are not accepted"))
                continue
            if msg.type != WSMsgType.TEXT:
                continue
            if len(msg.data.encode("utf-8", "replace")) > opts.max_message_bytes:
                out.put(error_event(None, "message_too_large",
                                    f"messages are limited to {opts.max_message_bytes} bytes"))
                continue
            try:
                conn.handle(parse_client_message(msg.data))
            except ProtocolError as e:
                out.put(e.event())
    finally:
        state.connections -= 1
        state.metrics.connections.dec()
        keepalive_task.cancel()
        await conn.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_drain(out, ws), 1.0)
        for task in (write_task, keepalive_task):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        out.discard()
    return ws


async def _drain(out: _Outbox, ws: web.WebSocketResponse) -> None:
    while not out.closed and not ws.closed and (item := out.get_nowait()) is not None:
        await (ws.send_bytes(item) if isinstance(item, bytes) else ws.send_json(item))
