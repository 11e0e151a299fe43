"""The aiohttp server: WebSocket streaming, OpenAI-compatible ``/v1/audio/speech``, health
and Prometheus metrics, all over one pipeline (one engine, one decode scheduler)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import struct
import time
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import WSMsgType, web

from ..chunking import ChunkerOptions, TextChunker, chunk_text
from ..engine import EngineError, SamplingOptions
from ..pipeline import Pipeline
from ..settings import env_int, env_str
from ..turn import Turn, TurnOptions, TurnTimeout
from .metrics import ServerMetrics
from .protocol import ClientMessage, ProtocolError, encode_audio, error_event, parse_client_message

logger = logging.getLogger(__name__)

PIPELINE_KEY = web.AppKey("pipeline", Pipeline)
OPTIONS_KEY = web.AppKey("options", object)
METRICS_KEY = web.AppKey("metrics", ServerMetrics)
WARM_KEY = web.AppKey("warm", asyncio.Task)


@dataclass(frozen=True)
class ServerOptions:
    api_key: str | None = None
    """When set, every request needs ``Authorization: Bearer <key>``."""
    max_message_bytes: int = 65536
    max_text_chars: int = 20000
    """Per WebSocket context and per /v1/audio/speech request."""
    max_contexts_per_connection: int = 16
    turn_timeout_s: float = 30.0
    chunker: ChunkerOptions = ChunkerOptions()

    @classmethod
    def from_env(cls) -> "ServerOptions":
        return cls(
            api_key=env_str("VEENA_API_KEY", "") or None,
            max_message_bytes=env_int("VEENA_MAX_MESSAGE_BYTES", cls.max_message_bytes),
            max_text_chars=env_int("VEENA_MAX_TEXT_CHARS", cls.max_text_chars),
            max_contexts_per_connection=env_int("VEENA_MAX_CONTEXTS_PER_CONNECTION",
                                                cls.max_contexts_per_connection),
            chunker=ChunkerOptions.from_env(),
        )


def _authorized(request: web.Request, key: str | None) -> bool:
    if not key:
        return True
    header = request.headers.get("Authorization", "")
    given = header[7:] if header.startswith("Bearer ") else ""
    return hmac.compare_digest(given.encode(), key.encode())


def _json_error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


@web.middleware
async def _require_api_key(request: web.Request, handler):
    """Every /v1/ route needs the API key when one is configured; health and metrics do not."""
    if request.path.startswith("/v1/") and not _authorized(request, request.app[OPTIONS_KEY].api_key):
        return _json_error(401, "unauthorized", "missing or wrong API key")
    return await handler(request)


def _turn_options(pipeline: Pipeline, opts: ServerOptions, voice: str | None,
                  sampling: dict[str, Any], seed: int | None,
                  speaker_globals: list[int] | None) -> TurnOptions:
    """Validate everything a client asked for before any engine work (ValueError)."""
    voice = pipeline.profile.check_voice(voice or pipeline.profile.default_voice)
    s: SamplingOptions = replace(pipeline.default_sampling(), **sampling).validate()
    globals_ = None
    if speaker_globals is not None:
        check = getattr(pipeline.profile, "check_globals", None)
        if check is None:
            raise ValueError(f"model profile {pipeline.profile.name} takes no speaker_globals")
        globals_ = check(speaker_globals)
    if seed is not None and not 0 <= seed < 2**63:
        raise ValueError("seed must be a non-negative 64-bit integer")
    return TurnOptions(voice=voice, sampling=s, seed=seed, speaker_globals=globals_,
                       timeout=opts.turn_timeout_s)


class _Context:
    """One WebSocket context: text in through a chunker, one turn of audio out."""

    def __init__(self, cid: str, pipeline: Pipeline, turn_opts: TurnOptions,
                 server: ServerOptions, out: asyncio.Queue, metrics: ServerMetrics,
                 on_end) -> None:
        self.cid = cid
        self._chunker = TextChunker(server.chunker)
        self._texts: asyncio.Queue[str | None] = asyncio.Queue()
        self._max_chars = server.max_text_chars
        self.chars = 0
        self.ended = False
        self._out = out
        self._metrics = metrics
        self._on_end = on_end
        self.turn = Turn(pipeline, turn_opts)
        self._created = time.perf_counter()
        self._first_audio: float | None = None
        self._samples = 0
        self._rate = pipeline.sample_rate
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

    async def _iter_texts(self):
        while (piece := await self._texts.get()) is not None:
            yield piece

    def _push(self, pcm) -> None:
        if self._first_audio is None:
            self._first_audio = time.perf_counter()
            self._metrics.first_audio.observe(self._first_audio - self._created)
        self._samples += len(pcm)
        self._out.put_nowait(encode_audio(self.cid, pcm.tobytes()))

    async def _run(self) -> None:
        self._metrics.active_streams.inc()
        outcome = "error"
        try:
            await self.turn.speak(self._iter_texts(), self._push)
            audio_s = self._samples / self._rate
            wall = time.perf_counter() - self._created
            if audio_s > 0:
                self._metrics.rtf.observe(wall / audio_s)
            self._out.put_nowait({"type": "done", "context_id": self.cid,
                                  "audio_seconds": round(audio_s, 4)})
            outcome = "done"
        except asyncio.CancelledError:
            outcome = "cancelled"
            self._metrics.aborted.inc()
            self._out.put_nowait({"type": "cancelled", "context_id": self.cid})
        except ValueError as e:
            self._out.put_nowait(error_event(self.cid, "bad_request", str(e)))
        except TurnTimeout as e:
            self._out.put_nowait(error_event(self.cid, "timeout", str(e)))
        except EngineError as e:
            self._out.put_nowait(error_event(self.cid, "engine_error", str(e)))
        except Exception as e:
            logger.exception("context failed", extra={"context_id": self.cid})
            self._out.put_nowait(error_event(self.cid, "internal_error", repr(e)))
        finally:
            self._metrics.active_streams.dec()
            self._metrics.finished.labels(outcome).inc()
            self._on_end(self.cid)


async def _websocket(request: web.Request) -> web.StreamResponse:
    opts: ServerOptions = request.app[OPTIONS_KEY]
    pipeline = request.app[PIPELINE_KEY]
    metrics = request.app[METRICS_KEY]
    ws = web.WebSocketResponse(max_msg_size=max(4 * opts.max_message_bytes, 4 << 20),
                               heartbeat=30)
    await ws.prepare(request)
    out: asyncio.Queue = asyncio.Queue()
    contexts: dict[str, _Context] = {}

    async def writer() -> None:
        while True:
            item = await out.get()
            if isinstance(item, bytes):
                await ws.send_bytes(item)
            else:
                await ws.send_json(item)

    write_task = asyncio.create_task(writer(), name="veena-ws-writer")
    try:
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                out.put_nowait(error_event(None, "bad_message", "binary frames are not accepted"))
                continue
            if msg.type != WSMsgType.TEXT:
                continue
            if len(msg.data.encode()) > opts.max_message_bytes:
                out.put_nowait(error_event(None, "message_too_large",
                                           f"messages are limited to {opts.max_message_bytes} bytes"))
                continue
            try:
                _handle(parse_client_message(msg.data), contexts, pipeline, opts, out, metrics)
            except ProtocolError as e:
                out.put_nowait(e.event())
    finally:
        for ctx in list(contexts.values()):  # the client left: abort its work
            ctx.task.cancel()
        for ctx in list(contexts.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await ctx.task
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_drain(out, ws), 1.0)
        write_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await write_task
    return ws


async def _drain(out: asyncio.Queue, ws: web.WebSocketResponse) -> None:
    while not out.empty() and not ws.closed:
        item = out.get_nowait()
        await (ws.send_bytes(item) if isinstance(item, bytes) else ws.send_json(item))


def _handle(msg: ClientMessage, contexts: dict[str, _Context], pipeline: Pipeline,
            opts: ServerOptions, out: asyncio.Queue, metrics: ServerMetrics) -> None:
    ctx = contexts.get(msg.context_id)
    if msg.type == "cancel":
        if ctx is None:
            raise ProtocolError("unknown_context", "no such context", msg.context_id)
        ctx.task.cancel()
        return
    if msg.type == "flush":
        if ctx is None:
            raise ProtocolError("unknown_context", "no such context", msg.context_id)
        ctx.flush()
        return
    if ctx is None:
        if len(contexts) >= opts.max_contexts_per_connection:
            raise ProtocolError("too_many_contexts",
                                f"at most {opts.max_contexts_per_connection} contexts per connection",
                                msg.context_id)
        if len(msg.text) > opts.max_text_chars:
            raise ProtocolError("text_too_long",
                                f"a context may carry at most {opts.max_text_chars} characters",
                                msg.context_id)
        try:
            turn_opts = _turn_options(pipeline, opts, msg.voice, msg.sampling, msg.seed,
                                      msg.speaker_globals)
        except (ValueError, TypeError) as e:
            code = "invalid_globals" if "global" in str(e) else "bad_request"
            raise ProtocolError(code, str(e), msg.context_id) from None
        ctx = _Context(msg.context_id, pipeline, turn_opts, opts, out, metrics,
                       lambda cid: contexts.pop(cid, None))
        contexts[msg.context_id] = ctx
    ctx.add_text(msg.text, msg.more)


def _wav_header(sample_rate: int, data_bytes: int = 0xFFFFFFFF - 36) -> bytes:
    """A 16-bit mono WAV header; streamed responses use the 'unknown length' maximum."""
    return (b"RIFF" + struct.pack("<I", min(36 + data_bytes, 0xFFFFFFFF)) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", data_bytes))


async def _speech(request: web.Request) -> web.StreamResponse:
    """OpenAI-compatible ``POST /v1/audio/speech``."""
    opts: ServerOptions = request.app[OPTIONS_KEY]
    pipeline = request.app[PIPELINE_KEY]
    metrics = request.app[METRICS_KEY]
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _json_error(400, "bad_json", "body is not valid JSON")
    if not isinstance(body, dict) or not isinstance(body.get("input"), str):
        return _json_error(400, "missing_field", "'input' (string) is required")
    text: str = body["input"]
    fmt = body.get("response_format", "wav")
    if fmt not in ("wav", "pcm"):
        return _json_error(400, "bad_field", "response_format must be 'wav' or 'pcm'")
    if not text.strip():
        return _json_error(400, "empty_input", "input is empty")
    if len(text) > opts.max_text_chars:
        return _json_error(400, "text_too_long", f"input is limited to {opts.max_text_chars} characters")
    try:
        turn_opts = _turn_options(pipeline, opts, body.get("voice"), {}, body.get("seed"), None)
    except (ValueError, TypeError) as e:
        return _json_error(400, "bad_request", str(e))

    pcm_parts: list[bytes] = []
    stream = bool(body.get("stream", False))
    response: web.StreamResponse | None = None
    content_type = "audio/wav" if fmt == "wav" else "audio/pcm"
    if stream:
        response = web.StreamResponse(headers={"Content-Type": content_type,
                                               "X-Sample-Rate": str(pipeline.sample_rate)})
        response.enable_chunked_encoding()
        await response.prepare(request)
        if fmt == "wav":
            await response.write(_wav_header(pipeline.sample_rate))
    writes: asyncio.Queue = asyncio.Queue()

    async def texts():
        for piece in chunk_text(text, opts.chunker):
            yield piece

    turn = Turn(pipeline, turn_opts)
    metrics.active_streams.inc()
    started = time.perf_counter()
    first: list[float] = []

    def push(pcm) -> None:
        if not first:
            first.append(time.perf_counter())
            metrics.first_audio.observe(first[0] - started)
        writes.put_nowait(pcm.tobytes())

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
                await response.write(data)
            else:
                pcm_parts.append(data)
        await speaking  # raise a failure
        metrics.finished.labels("done").inc()
    except (asyncio.CancelledError, ConnectionResetError):
        metrics.aborted.inc()
        metrics.finished.labels("cancelled").inc()
        raise
    except Exception as e:
        metrics.finished.labels("error").inc()
        logger.warning("speech request failed: %r", e)
        if response is None:
            return _json_error(502 if isinstance(e, EngineError) else 500, "synthesis_failed", str(e))
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
    payload = (_wav_header(pipeline.sample_rate, len(pcm)) + pcm) if fmt == "wav" else pcm
    return web.Response(body=payload, content_type=content_type,
                        headers={"X-Sample-Rate": str(pipeline.sample_rate)})


async def _health(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _ready(request: web.Request) -> web.Response:
    pipeline = request.app[PIPELINE_KEY]
    if pipeline.ready:
        return web.json_response({"status": "ready", "model": pipeline.engine.options.model,
                                  "profile": pipeline.profile.name,
                                  "sample_rate": pipeline.sample_rate})
    return web.json_response({"status": "starting"}, status=503)


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[METRICS_KEY].render(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def create_app(pipeline: Pipeline, options: ServerOptions | None = None,
               own_pipeline: bool = True) -> web.Application:
    """The server app; with ``own_pipeline`` it starts the pipeline and closes it at exit."""
    app = web.Application(client_max_size=1 << 20, middlewares=[_require_api_key])
    app[PIPELINE_KEY] = pipeline
    app[OPTIONS_KEY] = options or ServerOptions.from_env()
    metrics = ServerMetrics()
    app[METRICS_KEY] = metrics
    pipeline.scheduler.add_batch_listener(metrics.on_batch)
    app.router.add_get("/v1/stream", _websocket)
    app.router.add_post("/v1/audio/speech", _speech)
    app.router.add_get("/health", _health)
    app.router.add_get("/ready", _ready)
    app.router.add_get("/metrics", _metrics)

    async def warm(_app: web.Application) -> None:
        _app[WARM_KEY] = asyncio.create_task(pipeline.start())

    async def close(_app: web.Application) -> None:
        await pipeline.aclose()

    if own_pipeline:
        app.on_startup.append(warm)
        app.on_cleanup.append(close)
    return app


def run_server(model: str, *, profile: str | None, host: str, port: int) -> int:
    pipeline = Pipeline.from_model(model, profile=profile)
    logger.info("serving", extra={"model": model, "host": host, "port": port})
    web.run_app(create_app(pipeline), host=host, port=port, print=None)
    return 0
