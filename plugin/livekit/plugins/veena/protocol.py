"""The WebSocket protocol of ``veena-tts serve``: the one definition that the server and the
plugin's remote mode both use (message builders and parsers for both directions, and the
error-code table that says which codes are the client's fault and which are retryable).

Client -> server, JSON text frames, each naming a ``context_id`` (several may share a socket):
  {"type": "speak", "context_id": "c1", "text": "Hello ", "continue": true,
   "voice": "kavya", "seed": 7, "sampling": {"temperature": 0.4, ...},
   "speaker_globals": [32 ints], "text_normalization": "auto" | "off",
   "pronunciations": {"SQL": "sequel"}}   all but text/continue: first message only
  {"type": "flush", "context_id": "c1"}   speak what is buffered now
  {"type": "cancel", "context_id": "c1"}
``continue: false`` ends the context's text. Server -> client: binary frames
``[1 byte n][n bytes context_id][int16 little-endian PCM]`` and exactly one terminal JSON
event per context: ``done``, ``cancelled`` or ``error`` (``code``, ``message``,
``retryable``). The first ``speak`` of a new id starts a context; a context id is single-use
on its connection. A message that starts nothing and changes nothing (text after
``continue: false``, a message for an ended or unknown context) is answered with a
``rejected`` event (``code``, ``message``), never a terminal one; a ``cancel`` for a context
that has already ended is answered with nothing. Errors that belong to no context carry
``"context_id": null``. While a context waits (engine start-up, a stream slot, vLLM's queue,
the client's next text) and sends nothing else, the server sends ``{"type": "waiting",
"context_id": ...}`` every keep-alive interval, so a client's read timeout measures a silent
server, not a busy one. A context that captured speaker globals (BiCodec) sends ``{"type":
"voice", "speaker_globals": [32 ints]}`` as soon as they are known; after each text chunk's
audio it sends ``{"type": "words", "words": [{"text", "start", "end"}]}`` (seconds in the
context's audio) for aligned transcripts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .normalization import check_mode, check_pronunciations
from .pipeline.engine_options import SamplingOptions
from .validation import UNLOADABLE_JSON, is_int, is_number


@dataclass(frozen=True)
class ErrorCode:
    status: int
    """The HTTP status this code answers with (and the plugin's ``APIStatusError`` code)."""
    retryable: bool
    """Worth retrying (here or on another replica): capacity and transient engine faults."""

    @property
    def client_error(self) -> bool:
        return 400 <= self.status < 500


ERROR_CODES: dict[str, ErrorCode] = {
    # the client's fault: never retried
    "bad_json": ErrorCode(400, False),
    "bad_message": ErrorCode(400, False),
    "bad_field": ErrorCode(400, False),
    "bad_request": ErrorCode(400, False),
    "missing_field": ErrorCode(400, False),
    "unknown_type": ErrorCode(400, False),
    "empty_input": ErrorCode(400, False),
    "invalid_globals": ErrorCode(400, False),
    "unauthorized": ErrorCode(401, False),
    "unknown_context": ErrorCode(404, False),
    "context_ended": ErrorCode(409, False),
    "text_too_long": ErrorCode(400, False),
    "message_too_large": ErrorCode(400, False),
    "body_too_large": ErrorCode(413, False),
    "not_found": ErrorCode(404, False),
    "method_not_allowed": ErrorCode(405, False),
    "idle_timeout": ErrorCode(408, False),
    "too_many_contexts": ErrorCode(429, False),
    "slow_client": ErrorCode(408, False),
    # voice uploads (POST /v1/voices): the clip cannot give a voice
    "empty_audio": ErrorCode(400, False),
    "not_wav": ErrorCode(415, False),
    "unsupported_audio": ErrorCode(415, False),
    "audio_too_short": ErrorCode(400, False),
    "audio_too_long": ErrorCode(400, False),
    "silent_audio": ErrorCode(400, False),
    "upload_too_large": ErrorCode(413, False),
    "voice_exists": ErrorCode(409, False),
    "cannot_clone": ErrorCode(400, False),
    # LoRA adapters (POST /v1/adapters): the adapter cannot be served
    "bad_adapter": ErrorCode(400, False),
    "adapter_exists": ErrorCode(409, False),
    "cannot_remove": ErrorCode(409, False),
    "download_failed": ErrorCode(502, True),
    # the server's state: retry later or elsewhere
    "overloaded": ErrorCode(503, True),
    "starting": ErrorCode(503, True),
    "engine_error": ErrorCode(502, True),
    "timeout": ErrorCode(504, True),
    "internal_error": ErrorCode(500, True),
    "shutting_down": ErrorCode(503, True),
    # the engine is gone: this replica will not recover (its supervisor replaces it)
    "engine_dead": ErrorCode(503, False),
}


class ProtocolError(ValueError):
    def __init__(self, code: str, message: str, context_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.context_id = context_id

    def event(self) -> dict[str, Any]:
        return error_event(self.context_id, self.code, self.message)


@dataclass
class ClientMessage:
    type: str
    context_id: str
    text: str = ""
    more: bool = True
    voice: str | None = None
    seed: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    speaker_globals: list[int] | None = None
    text_normalization: str | None = None
    pronunciations: dict[str, str] | None = None


def parse_client_message(raw: str) -> ClientMessage:
    try:
        msg = json.loads(raw)
    except UNLOADABLE_JSON:
        raise ProtocolError("bad_json", "message is not valid JSON") from None
    if not isinstance(msg, dict):
        raise ProtocolError("bad_message", "message must be a JSON object")
    cid = msg.get("context_id")
    if not isinstance(cid, str) or not cid or not _utf8(cid) or len(cid.encode()) > 255:
        raise ProtocolError("missing_field", "context_id must be a non-empty string (<= 255 bytes)")
    kind = msg.get("type")
    if kind in ("flush", "cancel"):
        return ClientMessage(kind, cid)
    if kind != "speak":
        raise ProtocolError("unknown_type", f"unknown message type {kind!r}", cid)
    text = msg.get("text", "")
    if not isinstance(text, str) or not _utf8(text):
        raise ProtocolError("bad_field", "text must be a (valid Unicode) string", cid)
    more = msg.get("continue", False)
    if not isinstance(more, bool):
        raise ProtocolError("bad_field", "continue must be true or false", cid)
    sampling = msg.get("sampling")
    if sampling is None:
        sampling = {}
    try:
        SamplingOptions.check_fields(sampling)
    except ValueError as e:
        raise ProtocolError("bad_field", str(e), cid) from None
    seed = msg.get("seed")
    if seed is not None and not is_int(seed):
        raise ProtocolError("bad_field", "seed must be an integer", cid)
    globals_ = msg.get("speaker_globals")
    if globals_ is not None and (not isinstance(globals_, list)
                                 or not all(is_int(g) for g in globals_)):
        raise ProtocolError("invalid_globals", "speaker_globals must be a list of integers", cid)
    voice = msg.get("voice")
    if voice is not None and not isinstance(voice, str):
        raise ProtocolError("bad_field", "voice must be a string", cid)
    normalization, words = msg.get("text_normalization"), msg.get("pronunciations")
    try:
        if normalization is not None:
            check_mode(normalization)
        if words is not None:
            words = check_pronunciations(words)
    except ValueError as e:
        raise ProtocolError("bad_field", str(e), cid) from None
    return ClientMessage("speak", cid, text, more, voice, seed, sampling, globals_,
                         normalization, words)


def _utf8(text: str) -> bool:
    """JSON may carry lone surrogates ("\\ud800") that no UTF-8 encoder or tokenizer takes."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def encode_audio(context_id: str, pcm: bytes) -> bytes:
    cid = context_id.encode()
    return bytes([len(cid)]) + cid + pcm


def decode_audio(frame: bytes) -> tuple[str, bytes]:
    if not frame:
        raise ProtocolError("bad_audio", "empty binary frame")
    n = frame[0]
    return frame[1 : 1 + n].decode(), frame[1 + n :]


# -- client -> server ---------------------------------------------------------------------


def speak_message(context_id: str, text: str, more: bool,
                  options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Text for a context; the first one carries ``options`` (voice, seed, sampling, ...)."""
    return {"type": "speak", "context_id": context_id, "text": text, "continue": more,
            **(options or {})}


def flush_message(context_id: str) -> dict[str, Any]:
    return {"type": "flush", "context_id": context_id}


def cancel_message(context_id: str) -> dict[str, Any]:
    return {"type": "cancel", "context_id": context_id}


# -- server -> client ---------------------------------------------------------------------


@dataclass(frozen=True)
class ServerEvent:
    """A JSON event from the server, as the client reads it."""

    type: str
    context_id: str | None
    code: str = ""
    message: str = ""
    audio_seconds: float | None = None
    speaker_globals: tuple[int, ...] | None = None
    words: tuple[tuple[str, float, float], ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def terminal(self) -> bool:
        return self.type in ("done", "cancelled", "error")


def parse_server_event(raw: str) -> ServerEvent:
    """Read one JSON event (ProtocolError on anything that is not one)."""
    try:
        event = json.loads(raw)
    except UNLOADABLE_JSON:
        raise ProtocolError("bad_json", "server event is not valid JSON") from None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise ProtocolError("bad_message", "server event must be an object with a type")
    cid = event.get("context_id")
    seconds = event.get("audio_seconds")
    globals_ = event.get("speaker_globals")
    if globals_ is not None and (not isinstance(globals_, list) or not all(map(is_int, globals_))):
        raise ProtocolError("bad_message", "speaker_globals must be a list of integers")
    words = event.get("words") or []
    if not isinstance(words, list) or not all(
            isinstance(w, dict) and isinstance(w.get("text"), str) and is_number(w.get("start"))
            and is_number(w.get("end")) for w in words):
        raise ProtocolError("bad_message", "words must be a list of {text, start, end}")
    return ServerEvent(event["type"], cid if isinstance(cid, str) else None,
                       str(event.get("code", "")), str(event.get("message", "")),
                       float(seconds) if is_number(seconds) else None,
                       None if globals_ is None else tuple(globals_),
                       tuple((w["text"], float(w["start"]), float(w["end"])) for w in words), event)


def done_event(context_id: str, audio_seconds: float) -> dict[str, Any]:
    return {"type": "done", "context_id": context_id, "audio_seconds": round(audio_seconds, 4)}


def cancelled_event(context_id: str) -> dict[str, Any]:
    return {"type": "cancelled", "context_id": context_id}


def error_event(context_id: str | None, code: str, message: str) -> dict[str, Any]:
    return {"type": "error", "context_id": context_id, "code": code, "message": message,
            "retryable": ERROR_CODES[code].retryable}


def voice_event(context_id: str, speaker_globals: tuple[int, ...]) -> dict[str, Any]:
    """The speaker globals a context captured, as soon as known: a client keeping one voice
    for a call sends them with its later contexts."""
    return {"type": "voice", "context_id": context_id, "speaker_globals": list(speaker_globals)}


def words_event(context_id: str, words: list[tuple[str, float, float]]) -> dict[str, Any]:
    """A chunk's words with their times in the context's audio (seconds), sent once the
    chunk's audio is out: aligned transcripts for the client."""
    return {"type": "words", "context_id": context_id,
            "words": [{"text": t, "start": round(a, 4), "end": round(b, 4)} for t, a, b in words]}


def rejected_event(context_id: str, code: str, message: str) -> dict[str, Any]:
    """A message that started nothing and changed nothing (e.g. text after ``continue:
    false``): not a terminal event, the context (if any) goes on or has already ended."""
    return {"type": "rejected", "context_id": context_id, "code": code, "message": message}


def waiting_event(context_id: str) -> dict[str, Any]:
    return {"type": "waiting", "context_id": context_id}
