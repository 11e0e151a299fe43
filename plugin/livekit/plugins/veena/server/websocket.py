"""``GET /v1/stream``: the WebSocket protocol (``protocol.py``), several contexts per socket
(``contexts.py``), one bounded outbox per connection."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import struct
from typing import Callable, Iterable

from aiohttp import WSCloseCode, WSMsgType, web

from ..protocol import (
    ClientMessage,
    ProtocolError,
    error_event,
    parse_client_message,
    rejected_event,
)
from .contexts import Context
from .errors import error_code, json_error
from .state import ServerState, server_state
from .turn_request import turn_options

logger = logging.getLogger(__name__)

_ENDED_IDS_KEPT = 256
"""Ended context ids a connection remembers, so that a late message for one is rejected
instead of starting a new context under a stale id (ids are single-use)."""


_MERGED_FRAME_BYTES = 256 << 10
"""Audio frames of one context queued back to back leave as one frame of up to this many
bytes: one write (one frame header, one syscall) instead of several when a connection's
windows pile up. Clients read frames of up to 4 MiB (aiohttp's default)."""


class _Outbox:
    """One connection's outgoing messages, bounded in bytes: a client that cannot keep up
    is cut off instead of growing the server's memory. Bytes count until they are sent.

    An audio frame put while the writer waits with nothing queued goes out at once through
    ``send_now`` where that can write it without waiting (nothing is unsent before it), so
    a window reaches the socket without a task wake; anything else is queued for the writer,
    which keeps the order and the flow control."""

    def __init__(self, limit: int, on_overflow: Callable[[], None],
                 on_bytes: Callable[[int], None]) -> None:
        self._items: collections.deque[bytes | dict] = collections.deque()
        self._ready = asyncio.Event()
        self.bytes = 0
        self._limit = limit
        self._on_overflow = on_overflow
        self._on_bytes = on_bytes
        self.closed = False
        self.send_now: Callable[[bytes], bool] = lambda frame: False
        """Write one frame now if that cannot block or reorder; False: it was not written."""
        self._writer_waits = False
        """The writer waits in ``take``: everything it took has been sent."""

    def _count(self, delta: int) -> None:
        self.bytes += delta
        self._on_bytes(delta)

    def put(self, item: bytes | dict) -> None:
        if self.closed:
            return
        if isinstance(item, bytes):
            if self._writer_waits and not self._items and self.send_now(item):
                return
            if self.bytes + len(item) > self._limit:
                self.closed = True
                self._on_overflow()
                return
            self._count(len(item))
        self._items.append(item)
        self._ready.set()

    async def take(self) -> list[bytes | dict | None]:
        """Everything queued (waiting for at least one message), one context's consecutive
        audio merged; its bytes stay counted until ``sent``."""
        while not self._items:
            self._ready.clear()
            self._writer_waits = True
            try:
                await self._ready.wait()
            finally:
                self._writer_waits = False
        return self.take_now()

    def take_now(self) -> list[bytes | dict | None]:
        items = list(self._items)
        self._items.clear()
        merged = _merged(items)
        if len(merged) < len(items):  # the merged-away frame headers are no longer held
            self._count(_size(merged) - _size(items))
        return merged

    def end(self) -> None:
        """After what is queued now, the writer stops (``take`` yields ``None``)."""
        self._items.append(None)
        self._ready.set()

    def sent(self, item: bytes | dict) -> None:
        if isinstance(item, bytes):
            self._count(-len(item))

    def discard(self, unsent: Iterable[bytes | dict | None] = ()) -> None:
        """Forget what is still queued or was taken and never sent (the connection is
        gone)."""
        for item in [*unsent, *self.take_now()]:
            if item is not None:
                self.sent(item)


def _size(items: list[bytes | dict | None]) -> int:
    return sum(len(item) for item in items if isinstance(item, bytes))


def _merged(items: list[bytes | dict | None]) -> list[bytes | dict | None]:
    """Consecutive audio frames of one context as one frame (order kept, events untouched,
    no frame past ``_MERGED_FRAME_BYTES`` unless it came that large)."""
    out: list[bytes | dict | None] = []
    run: list = []  # the frame being built: its first frame whole, then the others' PCM
    head, size = b"", 0
    for item in items:
        if isinstance(item, bytes):
            n = 1 + item[0]
            if run and item[:n] == head and size + len(item) - n <= _MERGED_FRAME_BYTES:
                run.append(memoryview(item)[n:])
                size += len(item) - n
                continue
        if run:
            out.append(b"".join(run))  # one frame alone comes back as itself, uncopied
            run = []
        if isinstance(item, bytes):
            run, head, size = [item], item[:n], len(item)
        else:
            out.append(item)
    if run:
        out.append(b"".join(run))
    return out


def _binary_frame(payload: bytes) -> bytes:
    """One unmasked, uncompressed, final WebSocket binary frame (RFC 6455 5.2: a server
    never masks; this socket never compresses)."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x82, n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x82, 126, n)
    else:
        head = struct.pack("!BBQ", 0x82, 127, n)
    return head + payload


class _Connection:
    """One socket's contexts, its outbox, and the ids of its recently ended contexts."""

    def __init__(self, state: ServerState, out: _Outbox) -> None:
        self.state = state
        self.out = out
        self.contexts: dict[str, Context] = {}
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._running: set[Context] = set()
        """This socket's contexts whose task has not ended (an ending one has left
        ``contexts`` already): the ones to wait for when the client leaves."""

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
        refusal = state.lifecycle.refusal()
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
                                     msg.speaker_globals, msg.text_normalization,
                                     msg.pronunciations)
        except ValueError as e:
            raise ProtocolError(error_code(e), str(e), msg.context_id) from None
        ctx = Context(msg.context_id, self, turn_opts)
        self.contexts[msg.context_id] = ctx
        self._running.add(ctx)
        ctx.task.add_done_callback(lambda _task: self._running.discard(ctx))
        return ctx

    async def close(self) -> None:
        """The client left: cancel every context and wait until each has ended."""
        live = list(self._running)
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
    refusal = state.lifecycle.refusal()
    if refusal is not None:
        return json_error(*refusal)
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, opts.socket_send_buffer_bytes)
    # no permessage-deflate, whatever the client offers: PCM shrinks by ~5 % for ~1 ms of
    # CPU per audio second, more than the rest of the control plane spends on a stream
    ws = web.WebSocketResponse(max_msg_size=opts.max_frame_bytes, heartbeat=opts.heartbeat_s,
                               compress=False)
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

    loop = asyncio.get_running_loop()
    unsent: collections.deque[bytes | dict | None] = collections.deque()

    def stalled() -> None:
        out.closed = True
        cut_off(f"no read for {opts.slow_client_s:.1f} s")
        write_task.cancel()

    async def writer() -> None:
        """Sends what is queued until the outbox ends; one timer per send (no Task per
        frame) notices a client that stopped reading."""
        while True:
            unsent.extend(await out.take())
            while unsent:
                item = unsent[0]
                if item is None:
                    return
                timer = loop.call_later(opts.slow_client_s, stalled)
                try:
                    await (ws.send_bytes(item) if isinstance(item, bytes)
                           else ws.send_json(item))
                finally:
                    timer.cancel()
                out.sent(unsent.popleft())

    transport = request.transport

    def send_now(frame: bytes) -> bool:
        """An audio frame straight into the socket where nothing waits in its buffer (so
        the write cannot block, and the slow-client timer has nothing to watch)."""
        if (ws.closed or transport is None or transport.is_closing()
                or transport.get_write_buffer_size()):
            return False
        transport.write(_binary_frame(frame))
        return True

    out.send_now = send_now
    write_task = asyncio.create_task(writer(), name="veena-ws-writer")

    async def goodbye() -> None:
        """The server stops: what is queued (its contexts' terminal events) goes out, then
        the socket closes with 1001 (nothing more can be read from it: see ``drain``)."""
        out.end()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(write_task), opts.slow_client_s)
        with contextlib.suppress(asyncio.CancelledError, Exception):  # no close reply comes
            await asyncio.wait_for(ws.close(code=WSCloseCode.GOING_AWAY,
                                            message=b"server stopping"), 1.0)

    state.lifecycle.goodbyes.add(goodbye)
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
        state.lifecycle.goodbyes.discard(goodbye)
        state.connections -= 1
        state.metrics.connections.dec()
        await conn.close()
        out.end()  # the ended contexts' last messages (their terminal events) go out first
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(write_task, 1.0)
        out.discard(unsent)
    return ws

