"""OpenAI-compatible ``POST /v1/audio/speech`` (plus ``seed`` and ``sampling``).

As OpenAI's clients use it: the six ``response_format`` values (MP3 by default),
``speed`` as a pitch-preserving stretch, ``stream_format: "sse"`` (base64 audio deltas, then
a done event). Every value this server cannot honour is refused with a 400 naming the valid
ones, never dropped: ``instructions`` are the voice's description for a model whose voices are
described in words (Maya1), and refused for any other.

aiohttp does not cancel a handler whose client has gone (unless its runner is told to), so a
non-streamed request would synthesize to its end, holding its stream slot, for nobody. The
work runs as its own task and the handler watches the connection: once the client is gone
the work is cancelled (vLLM request aborted, decode windows dropped) and counted as aborted.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ..models.profiles import check_description
from ..pipeline.chunking import chunk_text
from ..pipeline.engine import EngineError
from ..pipeline.stitching import to_int16
from ..pipeline.turn import Turn, TurnOptions, TurnTimeout
from ..protocol import ERROR_CODES, ProtocolError
from ..validation import UNLOADABLE_JSON, check_bool, check_str, is_number
from .admission import Overloaded
from .audio_formats import (
    AUDIO_FORMATS,
    DEFAULT_FORMAT,
    SPEED_RANGE,
    AudioEncoder,
    complete_wav,
)
from .errors import error_code, json_error
from .options import MAX_HTTP_BODY_BYTES
from .state import ServerState, server_state
from .turn_request import turn_options

logger = logging.getLogger(__name__)

CLIENT_CHECK_S = 0.25
"""How often a request's connection is checked while its work runs (a lone timer wake
costs about 60 µs of CPU here: negligible per request)."""


STREAM_FORMATS = ("audio", "sse")
"""OpenAI's ``stream_format``: the audio bytes themselves, or server-sent events."""

SSE_CONTENT_TYPE = "text/event-stream"
MAX_INSTRUCTIONS_CHARS = 4096


@dataclass(frozen=True)
class _SpeechRequest:
    text: str
    fmt: str
    stream: bool
    turn: TurnOptions
    speed: float = 1.0
    sse: bool = False


def _shown(value: Any) -> str:
    """A refused value as the client sent it, kept short for the error message."""
    if isinstance(value, (str, int, float, bool)):
        return json.dumps(value)[:64]
    return "null" if value is None else type(value).__name__


def _optional(body: dict, name: str, default: Any) -> Any:
    """A field's value; absent or null stands for its default, as for every optional field."""
    value = body.get(name)
    return default if value is None else value


def _choice(name: str, value: Any, valid: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in valid:
        raise ProtocolError("bad_field",
                            f"{name} must be one of {', '.join(valid)} (got {_shown(value)})")
    return value


def _speed(value: Any) -> float:
    lo, hi = SPEED_RANGE
    if value is None:
        return 1.0
    if not is_number(value) or not lo <= value <= hi:
        raise ProtocolError("bad_field",
                            f"speed must be a number from {lo} to {hi} (got {_shown(value)})")
    return float(value)


def _instructions(value: Any, state: ServerState) -> str | None:
    """The one place ``instructions`` is decided: for a profile whose voices are described
    in words (``described_voices``, Maya1) a non-empty value is the voice's description,
    checked by ``check_description`` (a bad one is ``bad_field``, before any engine work); it
    replaces the description of the ``voice`` named beside it (a preset's, a saved voice's,
    whose seed stays). Any other model cannot be steered by a description: a non-empty value
    is refused, since dropping it would give a voice nobody asked for. None: no description."""
    if value is None or check_str("instructions", value, MAX_INSTRUCTIONS_CHARS).strip() == "":
        return None
    profile = state.pipeline.profile
    if not getattr(profile, "described_voices", False):
        raise ProtocolError(
            "bad_field", f"instructions are not supported by this server's model "
            f"({profile.name}): it cannot be steered by a description; "
            "leave instructions out and choose a voice instead")
    try:
        return check_description(value)
    except ValueError as e:
        raise ProtocolError("bad_field", f"instructions (the voice description): {e}") from None


def _voice(value: Any) -> Any:
    """OpenAI's custom-voice form ``{"id": name}`` names the same voice as ``name``."""
    if isinstance(value, dict) and set(value) == {"id"}:
        return value["id"]
    return value


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
    fmt = _choice("response_format", _optional(body, "response_format", DEFAULT_FORMAT),
                  tuple(AUDIO_FORMATS))
    sse = _choice("stream_format", _optional(body, "stream_format", "audio"),
                  STREAM_FORMATS) == "sse"
    speed = _speed(body.get("speed"))
    description = _instructions(body.get("instructions"), state)
    if not text.strip():
        raise ProtocolError("empty_input", "input is empty")
    if len(text) > opts.max_text_chars:
        raise ProtocolError("text_too_long", f"input is limited to {opts.max_text_chars} characters")
    if body.get("model") is not None:
        check_str("model", body["model"], max_len=1024)
    # server-sent events are a stream by nature, whatever ``stream`` says
    stream = check_bool("stream", body.get("stream", False)) or sse
    sampling = body.get("sampling")
    turn = turn_options(state, _voice(body.get("voice")), {} if sampling is None else sampling,
                        body.get("seed"), None, body.get("text_normalization"),
                        body.get("pronunciations"))
    if description is not None:
        turn = replace(turn, voice=description)
    return _SpeechRequest(text, fmt, stream, turn, speed, sse)


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def _audio_delta(data: bytes) -> bytes:
    """OpenAI's ``speech.audio.delta``: a piece of the encoded audio, base64."""
    return _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})


_AUDIO_DONE = _sse({"type": "speech.audio.done",
                    "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}})
"""OpenAI's ``speech.audio.done``; tokens are not counted here (zeros)."""


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
    except (*UNLOADABLE_JSON, LookupError):  # LookupError: a charset Python does not know
        return json_error("bad_json", "body is not valid JSON")
    except (ConnectionError, HttpProcessingError) as e:
        return json_error("bad_request", f"the body could not be read: {e}")


def _client_left(error: BaseException | None) -> bool:
    """The client went away or stopped reading (a write that failed or timed out), as
    opposed to the turn failing: a ``TurnTimeout`` is a ``TimeoutError`` too, but it is the
    engine's stall, answered with ``timeout``."""
    return (isinstance(error, (ConnectionError, asyncio.TimeoutError))
            and not isinstance(error, TurnTimeout))


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
    refusal = state.lifecycle.refusal()
    if refusal is not None:
        return json_error(*refusal)
    work = asyncio.create_task(_admitted_speech(request, req, state), name="veena-speech")
    state.live.speeches.add(work)
    work.add_done_callback(state.live.speech_ended)
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
    if work.cancelled() or _client_left(error):
        # the client left or stopped reading (counted as aborted): nobody hears an answer
        _drop_connection(request)
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
        if _cut_by_drain(state):
            return _shutting_down(state)
        metrics.aborted.inc()
        metrics.finished.labels("cancelled").inc()
        raise
    try:
        return await _speak(request, req, state)
    finally:
        state.admission.release()


def _drop_connection(request: web.Request) -> None:
    """End the client's connection at once: a response already under way is cut short."""
    if request.transport is not None:
        request.transport.abort()


def _cut_by_drain(state: ServerState) -> bool:
    """The running speech work was cancelled by the drain, not by its client leaving."""
    return asyncio.current_task() in state.live.cut_speeches


def _shutting_down(state: ServerState) -> web.Response:
    state.metrics.finished.labels("shutting_down").inc()
    return json_error("shutting_down", f"the server stopped after {state.options.drain_s:g} s "
                      "of draining (VEENA_DRAIN_S): send the request again elsewhere",
                      retry_after_s=1.0)


async def _speak(request: web.Request, req: _SpeechRequest, state: ServerState
                 ) -> web.StreamResponse:
    pipeline, metrics = state.pipeline, state.metrics
    parts: list[bytes] = []
    response: web.StreamResponse | None = None
    fmt = AUDIO_FORMATS[req.fmt]
    encoder = AudioEncoder(fmt, pipeline.sample_rate, req.speed)
    headers = {"Content-Type": SSE_CONTENT_TYPE if req.sse else fmt.content_type,
               "X-Sample-Rate": str(encoder.sample_rate)}
    writes: asyncio.Queue = asyncio.Queue()

    async def texts():
        for piece in chunk_text(req.text, state.options.chunker):
            yield piece

    async def send(data: bytes) -> None:
        if not data:  # an encoder holding samples back for its next frame
            return
        if response is None:
            parts.append(data)
            return
        await asyncio.wait_for(response.write(_audio_delta(data) if req.sse else data),
                               state.options.slow_client_s)

    turn = Turn(pipeline, req.turn)
    metrics.streaming(req.turn.adapter, True)
    started = time.perf_counter()
    first: list[float] = []

    def push(pcm) -> None:
        if not first:
            first.append(time.perf_counter())
            metrics.first_audio.observe(first[0] - started)
        writes.put_nowait(to_int16(pcm).tobytes())

    speaking = asyncio.create_task(turn.speak(texts(), push), name="veena-speech-turn")
    getter: asyncio.Future | None = None
    try:
        if req.stream:
            response = web.StreamResponse(headers=headers)
            response.enable_chunked_encoding()
            await response.prepare(request)
        while not (speaking.done() and writes.empty()):
            getter = asyncio.ensure_future(writes.get())
            await asyncio.wait({getter, speaking}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                continue
            await send(encoder.encode(getter.result()))
        await speaking  # raise a failure
        await send(encoder.finish())
        if req.sse and response is not None:
            await asyncio.wait_for(response.write(_AUDIO_DONE), state.options.slow_client_s)
        metrics.finished.labels("done").inc()
    except asyncio.CancelledError:
        if _cut_by_drain(state):
            if response is None:
                return _shutting_down(state)
            metrics.finished.labels("shutting_down").inc()
            logger.warning("speech request cut mid-stream: the server stopped after "
                           "VEENA_DRAIN_S")
            _drop_connection(request)  # cut without its last chunk: the client sees it
            return response
        metrics.aborted.inc()
        metrics.finished.labels("cancelled").inc()
        raise
    except Exception as e:
        if _client_left(e):
            metrics.aborted.inc()
            metrics.finished.labels("cancelled").inc()
            raise
        code = error_code(e)
        metrics.finished.labels(code).inc()
        logger.warning("speech request failed: %r", e)
        if response is None:
            return json_error(code, str(e) or repr(e))
        # mid-stream: the stream is cut without its last chunk, which tells the client it
        # failed (logged above, once: not as aiohttp's "Error handling request" traceback)
        _drop_connection(request)
        return response
    finally:
        if getter is not None:
            getter.cancel()  # a client that left leaves it waiting for audio otherwise
        encoder.close()
        metrics.streaming(req.turn.adapter, False)
        if not speaking.done():
            speaking.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await speaking
    if response is not None:
        await response.write_eof()
        return response
    body = b"".join(parts)
    return web.Response(body=complete_wav(body) if req.fmt == "wav" else body,
                        headers=headers)
