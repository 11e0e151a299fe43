"""How every route answers a failure: one JSON error body, and one mapping from exception
types to protocol codes (``protocol.ERROR_CODES``), as vLLM's ``OpenAIServing`` does."""

from __future__ import annotations

from aiohttp import web

from ..pipeline.engine import EngineDeadError, EngineError, EngineStartingError
from ..pipeline.family import InvalidGlobalsError
from ..pipeline.turn import TurnTimeout
from ..protocol import ERROR_CODES
from .admission import Overloaded


def json_error(code: str, message: str, retry_after_s: float | None = None) -> web.Response:
    """The one error body of every HTTP route: ``{"error": {code, message, retryable}}``."""
    spec = ERROR_CODES[code]
    headers = {"Retry-After": str(max(1, round(retry_after_s)))} if retry_after_s else None
    return web.json_response({"error": {"code": code, "message": message,
                                        "retryable": spec.retryable}},
                             status=spec.status, headers=headers)


_CODE_BY_TYPE: tuple[tuple[type[BaseException], str], ...] = (
    (EngineDeadError, "engine_dead"),  # before its base class EngineError
    (EngineStartingError, "starting"),
    (EngineError, "engine_error"),
    (Overloaded, "overloaded"),
    (TurnTimeout, "timeout"),
    (InvalidGlobalsError, "invalid_globals"),  # before its base class ValueError
    (ValueError, "bad_request"),
)


def error_code(e: BaseException) -> str:
    """The protocol code of a failure, by its type (most specific first)."""
    return next((code for kind, code in _CODE_BY_TYPE if isinstance(e, kind)), "internal_error")
