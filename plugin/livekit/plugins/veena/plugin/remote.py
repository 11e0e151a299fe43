"""The plugin's remote mode: a pooled WebSocket client of ``veena-tts serve``.

Text is chunked and spoken server-side (the same ``Turn`` as in-process). Each stream is one
context on a pooled socket; messages for other contexts (a cancelled earlier one) are ignored.
A pooled socket can end while it waits for the next turn (the server restarted, a proxy's
idle timeout): a context that finds its socket ended before the server answered it is sent
again, whole, on a new one, so the turn neither fails nor loses text.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any, AsyncIterable, Callable

import aiohttp
from livekit.agents import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    utils,
)

from ..log import logger
from ..protocol import (
    ERROR_CODES,
    ProtocolError,
    cancel_message,
    decode_audio,
    flush_message,
    parse_server_event,
    speak_message,
)
from ..validation import is_int

FLUSH = object()
"""Marker in a remote text stream: speak what is buffered now."""

_TAG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
MAX_TAGS = 256
"""The most tags a server's ``/ready`` may list (Maya1 has 20); a longer list is ignored."""


def _tags(value: object) -> tuple[str, ...] | None:
    """A ``/ready`` body's ``tags``: a list of tag names, or None where it is absent or not
    one (an older or foreign server: the given profile's tags stand)."""
    if not isinstance(value, list) or len(value) > MAX_TAGS:
        return None
    if not all(isinstance(t, str) and _TAG_NAME.fullmatch(t) for t in value):
        return None
    return tuple(value)


def server_error(code: str, message: str, body: object, audio_pushed: bool) -> APIError:
    """The plugin-edge error of a server ``error`` event, from the protocol's code table.

    Client errors and a dead engine are never retried; capacity (``overloaded``,
    ``starting``) and transient faults are, unless audio already reached the listener.
    An unknown code (a newer server) counts as a transient server fault."""
    spec = ERROR_CODES.get(code)
    text = f"veena server: {code}: {message}"
    if spec is None:
        return APIConnectionError(text, retryable=not audio_pushed)
    if code == "timeout":
        return APITimeoutError(text, retryable=spec.retryable and not audio_pushed)
    return APIStatusError(text, status_code=spec.status, body=body,
                          retryable=spec.retryable and not audio_pushed)


class _ConnectionLost(Exception):
    """The socket ended under a context."""

    def __init__(self, detail: str, pushed: bool) -> None:
        super().__init__(detail)
        self.pushed = pushed


class _SocketFailed(Exception):
    """Sending on the socket failed (it ended); not the text source's failure."""


class _Progress:
    """How far a context got on its socket: whether the server was asked anything yet
    (until then a silent socket is no fault: the agent's LLM has not said its first words),
    and whether audio reached the listener (it pushes it)."""

    def __init__(self, push: Callable[[bytes], None]) -> None:
        self._push = push
        self.pushed = False
        self.opened = False

    def push(self, pcm: bytes) -> None:
        self._push(pcm)
        self.pushed = True


class _ContextTexts:
    """A context's texts, kept until the server first answers the context, so that it can be
    sent again on a new socket. The source is read through one pending read that outlives a
    cancelled sender: the sender of a socket that ended loses no text."""

    def __init__(self, texts: AsyncIterable[Any]) -> None:
        self._source = aiter(texts)
        self._kept: list[Any] = []
        self._pos = 0
        self._next: asyncio.Future | None = None
        self.answered = False

    def rewind(self) -> None:
        self._pos = 0

    def __aiter__(self) -> "_ContextTexts":
        return self

    async def __anext__(self) -> Any:
        if self._pos < len(self._kept):
            self._pos += 1
            return self._kept[self._pos - 1]
        if self._next is None:
            self._next = asyncio.ensure_future(anext(self._source))
        next_ = self._next
        item = await asyncio.shield(next_)  # raises StopAsyncIteration at the end
        self._next = None
        if not self.answered:
            self._kept.append(item)
            self._pos += 1
        return item

    async def aclose(self) -> None:
        """Stop a pending read, and wait until it has left the source (its owner may close
        the source next)."""
        next_, self._next = self._next, None
        if next_ is not None and not next_.done():
            next_.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await next_


class RemoteClient:
    def __init__(self, base_url: str, api_key: str | None = None,
                 max_session_duration: float = 3600.0) -> None:
        url = base_url.rstrip("/")
        self.url = url if url.endswith("/v1/stream") else url + "/v1/stream"
        self._api_key = api_key
        self._session: aiohttp.ClientSession | None = None
        base = self.url[: -len("/v1/stream")]
        self._ready_url = base.replace("ws://", "http://", 1).replace("wss://", "https://", 1) + "/ready"
        self._sample_rate: int | None = None
        self.tags: tuple[str, ...] | None = None
        """The expressive tags the server's model performs, from its ``/ready`` (None until
        it has said)."""
        self.pool = utils.ConnectionPool[aiohttp.ClientWebSocketResponse](
            connect_cb=self._connect, close_cb=self._close,
            max_session_duration=max_session_duration, mark_refreshed_on_get=True,
        )

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    @property
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    async def sample_rate(self, timeout: float) -> int | None:
        """The server's sample rate from its ``/ready`` (asked once, then remembered);
        None where the server does not say (an older or foreign server). The same answer
        gives the server's ``tags``."""
        async def ask() -> object:
            async with self._http().get(self._ready_url, headers=self._headers) as r:
                return await r.json(content_type=None) if r.status in (200, 503) else {}

        if self._sample_rate is None:
            try:
                body = await asyncio.wait_for(ask(), timeout)
            except asyncio.TimeoutError:
                raise APITimeoutError(f"no answer from {self._ready_url} in {timeout} s") from None
            except (aiohttp.ClientError, ValueError) as e:
                raise APIConnectionError(f"cannot reach {self._ready_url}: {e!r}") from e
            body = body if isinstance(body, dict) else {}
            rate = body.get("sample_rate")
            if is_int(rate) and 8000 <= rate <= 192000:
                self._sample_rate = int(rate)
            tags = _tags(body.get("tags"))
            if tags is not None:
                self.tags = tags
        return self._sample_rate

    async def _connect(self, timeout: float) -> aiohttp.ClientWebSocketResponse:
        try:
            return await asyncio.wait_for(
                self._http().ws_connect(self.url, headers=self._headers, heartbeat=30), timeout)
        except asyncio.TimeoutError:  # before OSError: TimeoutError is an OSError
            raise APITimeoutError(f"no WebSocket handshake from {self.url} in {timeout} s") from None
        except aiohttp.WSServerHandshakeError as e:
            if e.status == 401:
                raise APIStatusError("veena server rejected the API key", status_code=401,
                                     retryable=False) from e
            if e.status == 503:  # at capacity, or its engine is dead: try elsewhere
                raise APIStatusError(f"veena server unavailable: {e.message}", status_code=503,
                                     retryable=True) from e
            raise APIConnectionError(f"cannot open {self.url}: {e}") from e
        except (aiohttp.ClientError, OSError) as e:
            raise APIConnectionError(f"cannot connect to {self.url}: {e!r}") from e

    async def _close(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        await ws.close()

    def prewarm(self) -> None:
        self.pool.prewarm()

    async def aclose(self) -> None:
        await self.pool.aclose()
        if self._session is not None:
            await self._session.close()

    async def speak(self, texts: AsyncIterable[Any], first_message: dict[str, Any],
                    push: Callable[[bytes], None], timeout: float,
                    on_started: Callable[[], None] = lambda: None,
                    on_voice: Callable[[tuple[int, ...]], None] = lambda g: None,
                    on_words: Callable[[tuple[tuple[str, float, float], ...]], None]
                    = lambda words: None) -> bool:
        """Send ``texts`` (strings or FLUSH) as one context and push its int16 PCM bytes
        until it is done (whether any came); ``on_voice`` hears the speaker globals the
        server captured. A
        socket that had waited in the pool and ended before the server answered is replaced
        once, and the context sent again on the new one; any other end of the socket is an
        ``APIConnectionError`` (retryable unless audio was pushed)."""
        cid = utils.shortuuid()
        kept = _ContextTexts(texts)
        started = False

        def on_first_text() -> None:
            nonlocal started
            if not started:
                started = True
                on_started()

        try:
            for replaced in (False, True):
                idled = False
                try:
                    async with self.pool.connection(timeout=timeout) as ws:
                        # set by the pool's get, with no suspension since: this one's
                        idled = self.pool.last_connection_reused
                        return await self._context(ws, cid, kept, first_message, push,
                                                   timeout, on_first_text, on_voice, on_words)
                except _ConnectionLost as lost:
                    if replaced or not idled or kept.answered:
                        raise APIConnectionError(
                            f"the veena server closed the connection ({lost})",
                            retryable=not lost.pushed) from None
                    logger.info("a pooled connection to the veena server had ended: sending "
                                "the context again on a new one", extra={"context_id": cid})
                    # the other idle ones most likely ended with it (a server restart)
                    self.pool.invalidate()
                    kept.rewind()
        finally:
            await kept.aclose()

    async def _context(self, ws: aiohttp.ClientWebSocketResponse, cid: str,
                       texts: _ContextTexts, first_message: dict[str, Any],
                       push: Callable[[bytes], None], timeout: float,
                       on_started: Callable[[], None],
                       on_voice: Callable[[tuple[int, ...]], None],
                       on_words: Callable[[tuple[tuple[str, float, float], ...]], None]) -> bool:
        """One context on ``ws``, to its end (whether audio came); ``_ConnectionLost`` where
        the socket ends. The
        sender and the receiver run side by side: whichever fails first ends the context (a
        text source that raised must not leave it waiting for the server)."""
        progress = _Progress(push)
        sender = asyncio.create_task(self._send(ws, cid, texts, first_message, progress,
                                                on_started))
        receiver = asyncio.create_task(
            self._receive(ws, cid, texts, progress, timeout, on_voice, on_words))
        try:
            await asyncio.wait((sender, receiver), return_when=asyncio.FIRST_COMPLETED)
            error = None if receiver.done() else sender.exception()
            if isinstance(error, _SocketFailed):
                raise _ConnectionLost(str(error), progress.pushed) from error
            if error is not None:  # the text source failed: the server frees the context
                receiver.cancel()
                if progress.opened:
                    with contextlib.suppress(Exception):
                        await ws.send_json(cancel_message(cid))
                raise APIConnectionError(f"veena synthesis failed: {error!r}",
                                         retryable=not progress.pushed) from error
            await receiver
            return progress.pushed
        except asyncio.CancelledError:
            receiver.cancel()  # nothing more reaches the listener
            with contextlib.suppress(Exception):
                await asyncio.shield(ws.send_json(cancel_message(cid)))
            logger.debug("cancelled remote context", extra={"context_id": cid})
            raise
        finally:
            for task in (sender, receiver):
                task.cancel()
            for task in (sender, receiver):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    @staticmethod
    async def _receive(ws: aiohttp.ClientWebSocketResponse, cid: str, texts: _ContextTexts,
                       progress: _Progress, timeout: float,
                       on_voice: Callable[[tuple[int, ...]], None],
                       on_words: Callable[[tuple[tuple[str, float, float], ...]], None]) -> None:
        """The server's messages for ``cid`` until it is done."""
        while True:
            try:
                msg = await ws.receive(timeout=timeout)
            except asyncio.TimeoutError:  # a waiting context hears "waiting" every second
                if not progress.opened:
                    continue
                raise APITimeoutError(f"no message from the veena server in {timeout} s",
                                      retryable=not progress.pushed) from None
            except (aiohttp.ClientError, OSError) as e:  # closing an ended socket
                raise _ConnectionLost(repr(e), progress.pushed) from e
            if msg.type == aiohttp.WSMsgType.BINARY:
                ctx, pcm = decode_audio(msg.data)
                if ctx == cid:
                    texts.answered = True
                    if pcm:
                        progress.push(pcm)
                continue
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise _ConnectionLost(msg.type.name, progress.pushed)
            try:
                event = parse_server_event(msg.data)
            except ProtocolError as e:
                raise APIConnectionError(f"veena server: {e}", retryable=not progress.pushed) from e
            if event.context_id not in (cid, None):
                continue  # a stale context on this pooled socket
            texts.answered = True
            if event.type == "voice" and event.speaker_globals is not None:
                on_voice(event.speaker_globals)
            elif event.type == "words":
                on_words(event.words)
            elif event.type in ("done", "cancelled"):
                return
            elif event.type == "error":
                raise server_error(event.code, event.message, event.raw, progress.pushed)

    @staticmethod
    async def _send(ws, cid: str, texts: _ContextTexts, first: dict[str, Any],
                    progress: _Progress, on_started: Callable[[], None]) -> None:
        async def send(message: dict[str, Any]) -> None:
            try:
                await ws.send_json(message)
            except (aiohttp.ClientError, OSError) as e:
                raise _SocketFailed(repr(e)) from e

        opened = False
        async for item in texts:
            if item is FLUSH:
                if opened:
                    await send(flush_message(cid))
                continue
            if not item:
                continue
            await send(speak_message(cid, item, True, None if opened else first))
            if not opened:
                opened = progress.opened = True
                on_started()
        await send(speak_message(cid, "", False, None if opened else first))
        progress.opened = True
