"""The aiohttp server: WebSocket streaming, OpenAI-compatible ``/v1/audio/speech``, health
and Prometheus metrics, all over one pipeline (one engine, one decode scheduler).

Production runs every agent job's TTS through this server, so its edges are strict: every
client value is checked by type and range before it can reach vLLM, past capacity a new
stream is refused at once (``overloaded``, retryable) instead of slowing everyone down, a
client that stops reading loses its streams instead of growing the server's memory, and when
the engine dies the server says so (``/health`` and ``/ready`` 503, ``engine_dead``) and
exits so that its supervisor replaces it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import socket
import struct
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

from aiohttp import WSMsgType, web

from ..chunking import ChunkerOptions, TextChunker, chunk_text
from ..engine import EngineDeadError, EngineError, EngineStartingError, SamplingOptions
from ..families import InvalidGlobalsError
from ..pipeline import Pipeline
from ..profiles import check_cloned_voice
from ..stitching import to_int16
from ..transcripts import word_timings
from ..settings import env_float, env_int, env_str
from ..turn import Turn, TurnOptions, TurnTimeout
from ..validation import check_bool, check_float, check_int, check_str
from ..reference_clip import ReferenceClipError
from ..voices import VoiceFile, clone_voice, voices_in
from .admission import Admission, AdmissionOptions, Overloaded
from .metrics import ServerMetrics
from ..protocol import (ERROR_CODES, SAMPLING_FIELDS, ClientMessage, ProtocolError,
                        cancelled_event, done_event, encode_audio, error_event,
                        parse_client_message, voice_event, waiting_event, words_event)

logger = logging.getLogger(__name__)

STATE_KEY = web.AppKey("veena_state", object)
STOPPING_KEY = web.AppKey("veena_stopping", bool)

ENGINE_DEAD_EXIT_CODE = 3


@dataclass(frozen=True)
class ServerOptions:
    api_key: str | None = None
    """When set, every request needs ``Authorization: Bearer <key>``."""
    max_message_bytes: int = 65536
    max_text_chars: int = 20000
    """Per WebSocket context and per /v1/audio/speech request."""
    max_contexts_per_connection: int = 16
    max_connections: int = 1024
    """Open WebSocket connections; one more is answered 503."""
    max_active_streams: int | None = None
    """Streams synthesizing at once (None: the engine's ``max_num_seqs`` / 2, since a turn
    keeps up to two engine requests in flight)."""
    max_queued_streams: int | None = None
    """Streams waiting for a slot (None: as many as ``max_active_streams``)."""
    max_queue_wait_s: float = 5.0
    turn_timeout_s: float = 30.0
    """A running stream that makes no progress for this long fails with ``timeout``."""
    slow_client_s: float = 10.0
    """A client that reads nothing for this long loses its contexts and its socket."""
    max_connection_buffer_bytes: int = 4 << 20
    """Audio waiting to be sent on one connection; past it the client counts as slow."""
    socket_send_buffer_bytes: int = 256 << 10
    """Kernel send buffer per WebSocket (bounds memory a non-reading client can hold)."""
    keepalive_s: float = 1.0
    """A waiting context hears ``waiting`` this often, so clients can tell busy from dead."""
    engine_dead_exit_s: float = 5.0
    """After the engine dies, answer 503 this long, then exit non-zero."""
    voices_dir: str | None = None
    """Every ``*.json`` voice file here is a voice clients can name (by its file name)."""
    max_voice_upload_bytes: int = 12 << 20
    """POST /v1/voices: the largest reference clip accepted (30 s of 48 kHz stereo float
    is 11.5 MB)."""
    chunker: ChunkerOptions = ChunkerOptions()

    @classmethod
    def from_env(cls) -> "ServerOptions":
        def optional_int(name: str) -> int | None:
            value = env_int(name, 0)
            return value or None

        return cls(
            api_key=env_str("VEENA_API_KEY", "") or None,
            max_message_bytes=env_int("VEENA_MAX_MESSAGE_BYTES", cls.max_message_bytes),
            max_text_chars=env_int("VEENA_MAX_TEXT_CHARS", cls.max_text_chars),
            max_contexts_per_connection=env_int("VEENA_MAX_CONTEXTS_PER_CONNECTION",
                                                cls.max_contexts_per_connection),
            max_connections=env_int("VEENA_MAX_CONNECTIONS", cls.max_connections),
            max_active_streams=optional_int("VEENA_MAX_ACTIVE_STREAMS"),
            max_queued_streams=optional_int("VEENA_MAX_QUEUED_STREAMS"),
            max_queue_wait_s=env_float("VEENA_MAX_QUEUE_WAIT_S", cls.max_queue_wait_s),
            turn_timeout_s=env_float("VEENA_TURN_TIMEOUT_S", cls.turn_timeout_s),
            slow_client_s=env_float("VEENA_SLOW_CLIENT_S", cls.slow_client_s),
            max_connection_buffer_bytes=env_int("VEENA_MAX_CONNECTION_BUFFER_BYTES",
                                                cls.max_connection_buffer_bytes),
            socket_send_buffer_bytes=env_int("VEENA_SOCKET_SEND_BUFFER_BYTES",
                                             cls.socket_send_buffer_bytes),
            keepalive_s=env_float("VEENA_KEEPALIVE_S", cls.keepalive_s),
            engine_dead_exit_s=env_float("VEENA_ENGINE_DEAD_EXIT_S", cls.engine_dead_exit_s),
            voices_dir=env_str("VEENA_VOICES_DIR", "") or None,
            max_voice_upload_bytes=env_int("VEENA_MAX_VOICE_UPLOAD_BYTES",
                                           cls.max_voice_upload_bytes),
            chunker=ChunkerOptions.from_env(),
        ).validate()

    def validate(self) -> "ServerOptions":
        for name in ("max_message_bytes", "max_text_chars", "max_contexts_per_connection",
                     "max_connections", "max_connection_buffer_bytes",
                     "socket_send_buffer_bytes", "max_voice_upload_bytes"):
            check_int(name, getattr(self, name), 1)
        for name in ("max_active_streams", "max_queued_streams"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 0 if name == "max_queued_streams" else 1)
        for name in ("max_queue_wait_s", "turn_timeout_s", "slow_client_s", "keepalive_s"):
            check_float(name, getattr(self, name), 0.0, lo_open=True)
        check_float("engine_dead_exit_s", self.engine_dead_exit_s, 0.0)
        return self

    def admission(self, max_num_seqs: int) -> AdmissionOptions:
        active = self.max_active_streams or max(1, max_num_seqs // 2)
        queued = active if self.max_queued_streams is None else self.max_queued_streams
        return AdmissionOptions(active, queued, self.max_queue_wait_s)


class _ServerState:
    """What every route shares: the pipeline, limits, metrics and the live contexts."""

    def __init__(self, pipeline: Pipeline, options: ServerOptions) -> None:
        self.pipeline = pipeline
        self.options = options
        self.metrics = ServerMetrics()
        self.admission = Admission(
            options.admission(pipeline.engine.options.max_num_seqs),
            on_change=self.metrics.on_admission, on_wait=self.metrics.stream_queue_wait.observe,
            on_reject=lambda reason: self.metrics.rejected.labels(reason).inc())
        self.contexts: set[_Context] = set()
        self.connections = 0
        self.voices: dict[str, VoiceFile] = (
            voices_in(options.voices_dir, pipeline.profile) if options.voices_dir else {})
        """Saved voices by name; a bad file stops the server at start-up with its reason."""
        self.clone_lock = asyncio.Lock()

    def refusal(self) -> tuple[str, str] | None:
        """Why no new stream can be accepted now (code, message), or None."""
        health = self.pipeline.engine.health
        if health.state == "dead":
            return "engine_dead", f"the TTS engine is dead: {health.reason}"
        return None

    def on_engine_dead(self, reason: str) -> None:
        self.metrics.engine_up.set(0)
        for ctx in list(self.contexts):
            ctx.fail("engine_dead", f"the TTS engine died: {reason}")


def _state(request: web.Request) -> _ServerState:
    return request.app[STATE_KEY]  # type: ignore[return-value]


def _authorized(request: web.Request, key: str | None) -> bool:
    if not key:
        return True
    header = request.headers.get("Authorization", "")
    given = header[7:] if header.startswith("Bearer ") else ""
    return hmac.compare_digest(given.encode(), key.encode())


def _json_error(code: str, message: str, retry_after_s: float | None = None) -> web.Response:
    spec = ERROR_CODES[code]
    headers = {"Retry-After": str(max(1, round(retry_after_s)))} if retry_after_s else None
    return web.json_response({"error": {"code": code, "message": message,
                                        "retryable": spec.retryable}},
                             status=spec.status, headers=headers)


@web.middleware
async def _require_api_key(request: web.Request, handler):
    """Every /v1/ route needs the API key when one is configured; health and metrics do not."""
    if request.path.startswith("/v1/") and not _authorized(request, _state(request).options.api_key):
        return _json_error("unauthorized", "missing or wrong API key")
    return await handler(request)


def _sampling(pipeline: Pipeline, sampling: Any) -> SamplingOptions:
    if not isinstance(sampling, dict) or set(sampling) - set(SAMPLING_FIELDS):
        raise ValueError(f"sampling must be an object with only {', '.join(SAMPLING_FIELDS)}")
    return replace(pipeline.default_sampling(), **sampling).validate()


def _turn_options(state: "_ServerState", voice: Any, sampling: Any, seed: Any,
                  speaker_globals: Any) -> TurnOptions:
    """Validate everything a client asked for, by type and range, before any engine work.
    A saved voice's name stands for its profile voice and its speaker globals."""
    pipeline = state.pipeline
    saved = state.voices.get(voice) if isinstance(voice, str) else None
    if saved is not None:
        voice = saved.voice
        if speaker_globals is None:
            speaker_globals = saved.speaker_globals
    voice = pipeline.profile.check_voice(
        pipeline.profile.default_voice if voice is None else voice)
    s = _sampling(pipeline, sampling)
    globals_ = None if speaker_globals is None else pipeline.family.check_globals(speaker_globals)
    check_cloned_voice(voice, globals_)
    if seed is not None:
        check_int("seed", seed, 0, 2**63 - 1)
    return TurnOptions(voice=voice, sampling=s, seed=seed, speaker_globals=globals_,
                       timeout=state.options.turn_timeout_s,
                       startup_timeout=pipeline.engine.options.startup_timeout_s)


_CODE_BY_TYPE: tuple[tuple[type[BaseException], str], ...] = (
    (EngineDeadError, "engine_dead"),  # before its base class EngineError
    (EngineStartingError, "starting"),
    (EngineError, "engine_error"),
    (Overloaded, "overloaded"),
    (TurnTimeout, "timeout"),
    (InvalidGlobalsError, "invalid_globals"),  # before its base class ValueError
    (ValueError, "bad_request"),
)


def _error_code(e: BaseException) -> str:
    """The protocol code of a failure, by its type (most specific first)."""
    return next((code for kind, code in _CODE_BY_TYPE if isinstance(e, kind)), "internal_error")


async def _admitted(state: _ServerState):
    """Wait for the engine (bounded by its start-up timeout); return the stream-slot holder."""
    await state.pipeline.start(state.pipeline.engine.options.startup_timeout_s)
    return state.admission.slot()


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


class _Context:
    """One WebSocket context: text in through a chunker, one turn of audio out."""

    def __init__(self, cid: str, state: _ServerState, turn_opts: TurnOptions,
                 out: _Outbox, on_end: Callable[[str], None]) -> None:
        self.cid = cid
        self._state = state
        server = state.options
        self._chunker = TextChunker(server.chunker)
        self._texts: asyncio.Queue[str | None] = asyncio.Queue()
        self._max_chars = server.max_text_chars
        self.chars = 0
        self.ended = False
        self._out = out
        self._on_end = on_end
        self.turn = Turn(state.pipeline, turn_opts)
        self.turn.on_speaker_globals = lambda g: self._send(voice_event(self.cid, g))
        self.turn.on_chunk_spoken = lambda text, a, b: self._send(words_event(
            self.cid, [(w.text, w.start, w.end) for w in word_timings(text, a, b)]))
        self._created = time.perf_counter()
        self.last_sent = time.monotonic()
        self._first_audio: float | None = None
        self._samples = 0
        self._rate = state.pipeline.sample_rate
        self._failure: tuple[str, str] | None = None
        state.contexts.add(self)
        self.task = asyncio.create_task(self._run(), name=f"veena-ctx-{cid}")

    def add_text(self, text: str, more: bool) -> None:
        if self.ended:
            raise ProtocolError("context_ended", "this context's text has ended", self.cid)
        self.chars += len(text)
        if self.chars > self._max_chars:
            raise ProtocolError("text_too_long",
                                f"a context may carry at most {self._max_chars} characters",
                                self.cid)
        for piece in self._chunker.push(text):
            self._texts.put_nowait(piece)
        if not more:
            self.flush()
            self.ended = True
            self._texts.put_nowait(None)

    def flush(self) -> None:
        for piece in self._chunker.flush():
            self._texts.put_nowait(piece)

    def fail(self, code: str, message: str) -> None:
        """End this context now with an ``error`` event of ``code`` (its work is aborted)."""
        if self._failure is None and not self.task.done():
            self._failure = (code, message)
            self.task.cancel()

    def _send(self, item: bytes | dict) -> None:
        self.last_sent = time.monotonic()
        self._out.put(item)

    def keepalive(self, every_s: float) -> None:
        if time.monotonic() - self.last_sent >= every_s and not self.task.done():
            self._send(waiting_event(self.cid))

    async def _iter_texts(self):
        while (piece := await self._texts.get()) is not None:
            yield piece

    def _push(self, pcm) -> None:
        if self._first_audio is None:
            self._first_audio = time.perf_counter()
            self._state.metrics.first_audio.observe(self._first_audio - self._created)
        self._samples += len(pcm)
        self._send(encode_audio(self.cid, to_int16(pcm).tobytes()))

    async def _run(self) -> None:
        metrics = self._state.metrics
        outcome = "error"
        try:
            async with await _admitted(self._state):
                metrics.active_streams.inc()
                try:
                    await self.turn.speak(self._iter_texts(), self._push)
                finally:
                    metrics.active_streams.dec()
            audio_s = self._samples / self._rate
            wall = time.perf_counter() - self._created
            if audio_s > 0:
                metrics.rtf.observe(wall / audio_s)
            self._send(done_event(self.cid, audio_s))
            outcome = "done"
        except asyncio.CancelledError:
            if self._failure is not None:
                outcome = self._failure[0]
                self._send(error_event(self.cid, *self._failure))
            else:
                outcome = "cancelled"
                metrics.aborted.inc()
                self._send(cancelled_event(self.cid))
        except Exception as e:
            outcome = code = _error_code(e)
            if code == "internal_error":
                logger.exception("context failed", extra={"context_id": self.cid})
            self._send(error_event(self.cid, code, str(e) or repr(e)))
        finally:
            self._state.contexts.discard(self)
            metrics.finished.labels(outcome).inc()
            self._on_end(self.cid)


async def _websocket(request: web.Request) -> web.StreamResponse:
    state = _state(request)
    opts = state.options
    if state.connections >= opts.max_connections:
        state.metrics.rejected.labels("connections").inc()
        return _json_error("overloaded", f"at most {opts.max_connections} connections",
                           retry_after_s=1.0)
    refusal = state.refusal()
    if refusal is not None:
        return _json_error(*refusal)
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, opts.socket_send_buffer_bytes)
    ws = web.WebSocketResponse(max_msg_size=max(4 * opts.max_message_bytes, 4 << 20),
                               heartbeat=30)
    await ws.prepare(request)
    state.connections += 1
    state.metrics.connections.inc()
    contexts: dict[str, _Context] = {}

    def cut_off(why: str) -> None:
        """The client stopped reading: drop its work and its socket."""
        logger.warning("slow client: closing its connection",
                       extra={"reason": why, "contexts": list(contexts)})
        state.metrics.slow_clients.inc()
        for ctx in list(contexts.values()):
            ctx.fail("slow_client", "the client stopped reading: connection closed")
        if request.transport is not None:
            request.transport.abort()

    out = _Outbox(opts.max_connection_buffer_bytes, lambda: cut_off("output buffer full"),
                  state.metrics.buffered_bytes.inc)

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
            for ctx in list(contexts.values()):
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
                _handle(parse_client_message(msg.data), contexts, state, out)
            except ProtocolError as e:
                out.put(e.event())
    finally:
        state.connections -= 1
        state.metrics.connections.dec()
        keepalive_task.cancel()
        for ctx in list(contexts.values()):  # the client left: abort its work
            ctx.task.cancel()
        for ctx in list(contexts.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await ctx.task
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


def _handle(msg: ClientMessage, contexts: dict[str, _Context], state: _ServerState,
            out: _Outbox) -> None:
    opts = state.options
    ctx = contexts.get(msg.context_id)
    if msg.type in ("cancel", "flush"):
        if ctx is None:
            raise ProtocolError("unknown_context", "no such context", msg.context_id)
        if msg.type == "cancel":
            ctx.task.cancel()
        else:
            ctx.flush()
        return
    if ctx is None:
        refusal = state.refusal()
        if refusal is not None:
            raise ProtocolError(*refusal, msg.context_id)
        if len(contexts) >= opts.max_contexts_per_connection:
            raise ProtocolError("too_many_contexts",
                                f"at most {opts.max_contexts_per_connection} contexts per connection",
                                msg.context_id)
        if len(msg.text) > opts.max_text_chars:
            raise ProtocolError("text_too_long",
                                f"a context may carry at most {opts.max_text_chars} characters",
                                msg.context_id)
        try:
            turn_opts = _turn_options(state, msg.voice, msg.sampling, msg.seed,
                                      msg.speaker_globals)
        except ValueError as e:
            raise ProtocolError(_error_code(e), str(e), msg.context_id) from None
        ctx = _Context(msg.context_id, state, turn_opts, out, lambda cid: contexts.pop(cid, None))
        contexts[msg.context_id] = ctx
    ctx.add_text(msg.text, msg.more)


def _wav_header(sample_rate: int, data_bytes: int = 0xFFFFFFFF - 36) -> bytes:
    """A 16-bit mono WAV header; streamed responses use the 'unknown length' maximum."""
    return (b"RIFF" + struct.pack("<I", min(36 + data_bytes, 0xFFFFFFFF)) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", data_bytes))


@dataclass(frozen=True)
class _SpeechRequest:
    text: str
    fmt: str
    stream: bool
    turn: TurnOptions


def _speech_request(body: Any, state: _ServerState) -> _SpeechRequest:
    """Validate an OpenAI-style body (ValueError; ProtocolError for a specific code)."""
    opts = state.options
    if not isinstance(body, dict) or "input" not in body:
        raise ProtocolError("missing_field", "'input' (string) is required")
    if not isinstance(body["input"], str):
        raise ProtocolError("missing_field", "'input' must be a string")
    text = body["input"]
    try:
        text.encode()
    except UnicodeEncodeError:
        raise ProtocolError("bad_field", "input is not valid Unicode") from None
    fmt = body.get("response_format", "wav")
    if fmt not in ("wav", "pcm") or not isinstance(fmt, str):
        raise ProtocolError("bad_field", "response_format must be 'wav' or 'pcm'")
    if not text.strip():
        raise ProtocolError("empty_input", "input is empty")
    if len(text) > opts.max_text_chars:
        raise ProtocolError("text_too_long", f"input is limited to {opts.max_text_chars} characters")
    if body.get("model") is not None:
        check_str("model", body["model"], max_len=1024)
    if body.get("speed") is not None and check_float("speed", body["speed"], 0.25, 4.0) != 1.0:
        raise ProtocolError("bad_field", "only speed 1.0 is supported")
    stream = check_bool("stream", body.get("stream", False))
    sampling = body.get("sampling")
    turn = _turn_options(state, body.get("voice"), {} if sampling is None else sampling,
                         body.get("seed"), None)
    return _SpeechRequest(text, fmt, stream, turn)


async def _speech(request: web.Request) -> web.StreamResponse:
    """OpenAI-compatible ``POST /v1/audio/speech`` (plus ``seed`` and ``sampling``)."""
    state = _state(request)
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _json_error("bad_json", "body is not valid JSON")
    try:
        req = _speech_request(body, state)
    except ProtocolError as e:
        return _json_error(e.code, e.message)
    except ValueError as e:
        return _json_error(_error_code(e), str(e))
    refusal = state.refusal()
    if refusal is not None:
        return _json_error(*refusal)
    async with contextlib.AsyncExitStack() as stack:
        try:
            await stack.enter_async_context(await _admitted(state))
        except (Overloaded, EngineError) as e:
            code = _error_code(e)
            return _json_error(code, str(e),
                               retry_after_s=1.0 if ERROR_CODES[code].retryable else None)
        return await _speak_http(request, req, state)


async def _speak_http(request: web.Request, req: _SpeechRequest, state: _ServerState
                      ) -> web.StreamResponse:
    pipeline, metrics = state.pipeline, state.metrics
    pcm_parts: list[bytes] = []
    response: web.StreamResponse | None = None
    content_type = "audio/wav" if req.fmt == "wav" else "audio/pcm"
    if req.stream:
        response = web.StreamResponse(headers={"Content-Type": content_type,
                                               "X-Sample-Rate": str(pipeline.sample_rate)})
        response.enable_chunked_encoding()
        await response.prepare(request)
        if req.fmt == "wav":
            await response.write(_wav_header(pipeline.sample_rate))
    writes: asyncio.Queue = asyncio.Queue()

    async def texts():
        for piece in chunk_text(req.text, state.options.chunker):
            yield piece

    turn = Turn(pipeline, req.turn)
    metrics.active_streams.inc()
    started = time.perf_counter()
    first: list[float] = []

    def push(pcm) -> None:
        if not first:
            first.append(time.perf_counter())
            metrics.first_audio.observe(first[0] - started)
        writes.put_nowait(to_int16(pcm).tobytes())

    speaking = asyncio.create_task(turn.speak(texts(), push))
    try:
        while not (speaking.done() and writes.empty()):
            getter = asyncio.ensure_future(writes.get())
            await asyncio.wait({getter, speaking}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                continue
            data = getter.result()
            if response is not None:
                await asyncio.wait_for(response.write(data), state.options.slow_client_s)
            else:
                pcm_parts.append(data)
        await speaking  # raise a failure
        metrics.finished.labels("done").inc()
    except (asyncio.CancelledError, ConnectionResetError, asyncio.TimeoutError):
        metrics.aborted.inc()
        metrics.finished.labels("cancelled").inc()
        raise
    except Exception as e:
        code = _error_code(e)
        metrics.finished.labels(code).inc()
        logger.warning("speech request failed: %r", e)
        if response is None:
            return _json_error(code, str(e) or repr(e))
        raise
    finally:
        metrics.active_streams.dec()
        if not speaking.done():
            speaking.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await speaking
    if response is not None:
        await response.write_eof()
        return response
    pcm = b"".join(pcm_parts)
    payload = (_wav_header(pipeline.sample_rate, len(pcm)) + pcm) if req.fmt == "wav" else pcm
    return web.Response(body=payload, content_type=content_type,
                        headers={"X-Sample-Rate": str(pipeline.sample_rate)})


def _engine_status(state: _ServerState) -> dict[str, Any]:
    health = state.pipeline.engine.health
    return {"engine": health.state, **({"reason": health.reason} if health.reason else {})}


async def _health(request: web.Request) -> web.Response:
    """Alive: 200 while the engine is starting or serving; 503 once it is dead or failed."""
    state = _state(request)
    ok = state.pipeline.engine.health.ok
    return web.json_response({"status": "ok" if ok else "unhealthy", **_engine_status(state)},
                             status=200 if ok else 503)


async def _ready(request: web.Request) -> web.Response:
    state = _state(request)
    pipeline = state.pipeline
    if pipeline.ready:
        return web.json_response({"status": "ready", "model": pipeline.engine.options.model,
                                  "profile": pipeline.profile.name,
                                  "sample_rate": pipeline.sample_rate,
                                  "active_streams": state.admission.active,
                                  "queued_streams": state.admission.queued})
    return web.json_response({"status": pipeline.engine.health.state, **_engine_status(state),
                              "sample_rate": pipeline.sample_rate}, status=503)


async def _voices(request: web.Request) -> web.Response:
    """``GET /v1/voices``: the profile's voices and the saved ones (``VEENA_VOICES_DIR``)."""
    state = _state(request)
    profile = state.pipeline.profile
    return web.json_response({
        "profile": profile.name, "voices": list(profile.voices),
        "saved": [{"name": name, "voice": v.voice, "model": v.model}
                  for name, v in state.voices.items()]})


_CLIP_CODES = {"empty": "empty_audio", "not_wav": "not_wav", "unsupported": "unsupported_audio",
               "too_short": "audio_too_short", "too_long": "audio_too_long", "silent": "silent_audio"}
_VOICE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


async def _read_upload(request: web.Request, limit: int) -> bytes | web.Response:
    """The clip's bytes: the raw body (e.g. ``Content-Type: audio/wav``) or the ``file`` part
    of a multipart form; past ``limit`` bytes the read stops with 413."""
    too_large = _json_error("upload_too_large", f"the upload is larger than {limit} bytes "
                            "(VEENA_MAX_VOICE_UPLOAD_BYTES)")
    if request.content_length is not None and request.content_length > limit + (1 << 16):
        return too_large
    read = lambda: request.content.read(1 << 16)  # noqa: E731
    if request.content_type.startswith("multipart/"):
        reader = await request.multipart()
        while (part := await reader.next()) is not None and getattr(part, "name", None) != "file":
            await part.release()
        if part is None:
            return _json_error("bad_request", "the multipart form has no 'file' part")
        read = lambda: part.read_chunk(1 << 16)  # noqa: E731
    data = bytearray()
    while chunk := await read():
        data += chunk
        if len(data) > limit:
            return too_large
    return bytes(data)


async def _clone(request: web.Request) -> web.Response:
    """``POST /v1/voices``: a WAV reference clip in, a voice file (JSON) out; with
    ``?name=NAME`` it is also saved in ``VEENA_VOICES_DIR`` and usable by that name."""
    state = _state(request)
    name = request.query.get("name")
    if name is not None:
        if not _VOICE_NAME.fullmatch(name):
            return _json_error("bad_field", "name must be 1-64 letters, digits, '_' or '-'")
        if state.options.voices_dir is None:
            return _json_error("bad_request", "this server has no VEENA_VOICES_DIR to save into")
        if name in state.voices:
            return _json_error("voice_exists", f"a voice named {name!r} exists")
    data = await _read_upload(request, state.options.max_voice_upload_bytes)
    if isinstance(data, web.Response):
        return data
    async with state.clone_lock:  # one clone at a time beside the decode work
        try:
            saved = await clone_voice(state.pipeline, data)
        except ReferenceClipError as e:
            return _json_error(_CLIP_CODES[e.reason], str(e))
        except ValueError as e:  # no speaker encoder: another family, or a checkpoint without
            return _json_error("cannot_clone", str(e))
    body = {**asdict(saved), "speaker_globals": list(saved.speaker_globals)}
    if name is not None:
        saved.save(Path(state.options.voices_dir) / f"{name}.json")
        state.voices[name] = saved
        body["name"] = name
    logger.info("voice cloned", extra={"voice_name": name, "bytes": len(data)})
    return web.json_response(body)


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=_state(request).metrics.render(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def create_app(pipeline: Pipeline, options: ServerOptions | None = None,
               own_pipeline: bool = True) -> web.Application:
    """The server app. With ``own_pipeline`` it starts the pipeline, closes it at exit, and
    stops the process (``ENGINE_DEAD_EXIT_CODE``) when the engine dies or fails to start."""
    app = web.Application(client_max_size=1 << 20, middlewares=[_require_api_key])
    state = _ServerState(pipeline, (options or ServerOptions.from_env()).validate())
    app[STATE_KEY] = state
    pipeline.scheduler.add_batch_listener(state.metrics.on_batch)
    pipeline.engine.add_dead_listener(state.on_engine_dead)
    app.router.add_get("/v1/stream", _websocket)
    app.router.add_post("/v1/audio/speech", _speech)
    app.router.add_get("/v1/voices", _voices)
    app.router.add_post("/v1/voices", _clone)
    app.router.add_get("/health", _health)
    app.router.add_get("/ready", _ready)
    app.router.add_get("/metrics", _metrics)

    def stop_later(reason: str) -> None:
        if app.get(STOPPING_KEY):
            return
        app[STOPPING_KEY] = True
        delay = state.options.engine_dead_exit_s
        logger.error("stopping the server in %.1f s so its supervisor can replace it", delay,
                     extra={"reason": reason})
        asyncio.get_running_loop().call_later(delay, _raise_exit)

    async def warm(_app: web.Application) -> None:
        async def start() -> None:
            try:
                await pipeline.start()
                state.metrics.engine_up.set(1)
            except Exception as e:
                logger.error("the engine failed to start: %s", e)
                stop_later(f"start failed: {e}")

        _app["veena_warm"] = asyncio.create_task(start())

    async def close(_app: web.Application) -> None:
        await pipeline.aclose()

    if own_pipeline:
        pipeline.engine.add_dead_listener(stop_later)
        app.on_startup.append(warm)
        app.on_cleanup.append(close)
    elif pipeline.ready:
        state.metrics.engine_up.set(1)
    return app


def _raise_exit() -> None:
    raise web.GracefulExit()


def run_server(model: str, *, profile: str | None, host: str, port: int) -> int:
    """Serve until stopped; exit code ``ENGINE_DEAD_EXIT_CODE`` when the engine died."""
    pipeline = Pipeline.from_model(model, profile=profile)
    logger.info("serving", extra={"model": model, "host": host, "port": port})
    web.run_app(create_app(pipeline), host=host, port=port, print=None)
    if pipeline.engine.health.state in ("dead", "failed"):
        return ENGINE_DEAD_EXIT_CODE
    return 0
