"""OpenAI-compatible ``POST /v1/audio/speech`` (plus ``seed`` and ``sampling``).

aiohttp does not cancel a handler whose client has gone (unless its runner is told to), so a
non-streamed request would synthesize to its end, holding its stream slot, for nobody. The
work runs as its own task and the handler watches the connection: once the client is gone
the work is cancelled (vLLM request aborted, decode windows dropped) and counted as aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ..pipeline.chunking import chunk_text
from ..pipeline.engine import EngineError
from ..pipeline.stitching import to_int16
from ..pipeline.turn import Turn, TurnOptions
from ..protocol import ERROR_CODES, ProtocolError
from ..validation import check_bool, check_float, check_str
from .admission import Overloaded
from .options import MAX_HTTP_BODY_BYTES
from .state import ServerState, error_code, json_error, server_state, turn_options

logger = logging.getLogger(__name__)

CLIENT_CHECK_S = 0.25
"""How often a request's connection is checked while its work runs (a lone timer wake
costs about 60 µs of CPU here: negligible per request)."""


def wav_header(sample_rate: int, data_bytes: int = 0xFFFFFFFF - 36) -> bytes:
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


def _speech_request(body: Any, state: ServerState) -> _SpeechRequest:
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
    if not isinstance(fmt, str) or fmt not in ("wav", "pcm"):
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
    turn = turn_options(state, body.get("voice"), {} if sampling is None else sampling,
                        body.get("seed"), None)
    return _SpeechRequest(text, fmt, stream, turn)


def client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def read_json(request: web.Request) -> Any | web.Response:
    """The body as JSON, or the JSON error that answers it (too large, not JSON, cut off)."""
    try:
        return await request.json()
    except web.HTTPRequestEntityTooLarge:
        return json_error("body_too_large",
                          f"the body is larger than {MAX_HTTP_BODY_BYTES} bytes")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return json_error("bad_json", "body is not valid JSON")
    except (ConnectionError, HttpProcessingError) as e:
        return json_error("bad_request", f"the body could not be read: {e}")


async def speech(request: web.Request) -> web.StreamResponse:
    """``POST /v1/audio/speech``: validate, then run the work while the client is there."""
    state = server_state(request)
    body = await read_json(request)
    if isinstance(body, web.StreamResponse):
        return body
    try:
        req = _speech_request(body, state)
    except ProtocolError as e:
        return json_error(e.code, e.message)
    except ValueError as e:
        return json_error(error_code(e), str(e))
    refusal = state.refusal()
    if refusal is not None:
        return json_error(*refusal)
    work = asyncio.create_task(_admitted_speech(request, req, state), name="veena-speech")
    try:
        while not work.done():
            await asyncio.wait({work}, timeout=CLIENT_CHECK_S)
            if not work.done() and client_gone(request):
                logger.info("speech client gone: aborting its work")
                break
    finally:
        while not work.done():  # again if a racing wait_for (3.11) swallowed a cancellation
            work.cancel()
            await asyncio.wait({work}, timeout=CLIENT_CHECK_S)
    error = None if work.cancelled() else work.exception()
    if work.cancelled() or isinstance(error, (ConnectionError, asyncio.TimeoutError)):
        # the client left or stopped reading (counted as aborted): nobody hears an answer
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=499, reason="Client Closed Request")
    return work.result()


async def _admitted_speech(request: web.Request, req: _SpeechRequest, state: ServerState
                           ) -> web.StreamResponse:
    metrics = state.metrics
    try:
        await state.pipeline.start(state.pipeline.engine.options.startup_timeout_s)
        await state.admission.acquire()
    except (Overloaded, EngineError) as e:
        code = error_code(e)
        return json_error(code, str(e),
                          retry_after_s=1.0 if ERROR_CODES[code].retryable else None)
    except asyncio.CancelledError:  # gone while it waited: no engine work yet
        metrics.aborted.inc()
        metrics.finished.labels("cancelled").inc()
        raise
    try:
        return await _speak(request, req, state)
    finally:
        state.admission.release()


async def _speak(request: web.Request, req: _SpeechRequest, state: ServerState
                 ) -> web.StreamResponse:
    pipeline, metrics = state.pipeline, state.metrics
    pcm_parts: list[bytes] = []
    response: web.StreamResponse | None = None
    content_type = "audio/wav" if req.fmt == "wav" else "audio/pcm"
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

    speaking = asyncio.create_task(turn.speak(texts(), push), name="veena-speech-turn")
    try:
        if req.stream:
            response = web.StreamResponse(headers={"Content-Type": content_type,
                                                   "X-Sample-Rate": str(pipeline.sample_rate)})
            response.enable_chunked_encoding()
            await response.prepare(request)
            if req.fmt == "wav":
                await response.write(wav_header(pipeline.sample_rate))
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
    except (asyncio.CancelledError, ConnectionError, asyncio.TimeoutError):
        metrics.aborted.inc()
        metrics.finished.labels("cancelled").inc()
        raise
    except Exception as e:
        code = error_code(e)
        metrics.finished.labels(code).inc()
        logger.warning("speech request failed: %r", e)
        if response is None:
            return json_error(code, str(e) or repr(e))
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
    payload = (wav_header(pipeline.sample_rate, len(pcm)) + pcm) if req.fmt == "wav" else pcm
    return web.Response(body=payload, content_type=content_type,
                        headers={"X-Sample-Rate": str(pipeline.sample_rate)})
