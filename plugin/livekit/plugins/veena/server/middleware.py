"""The edges every request crosses: the API key, and aiohttp's own refusals as JSON.

The key is compared on bytes in constant time; the scheme is case-insensitive (RFC 9110:
``bearer``, ``Bearer`` and ``BEARER`` are one scheme); a header aiohttp could only decode
with surrogates (non-UTF-8 bytes) is a wrong key, not a 500. aiohttp's own 4xx answers (an
unknown path, a wrong method, a body past the size limit) become the same JSON error body as
every other refusal.
"""

from __future__ import annotations

import hmac
import logging

from aiohttp import web

from .errors import json_error
from .state import server_state

logger = logging.getLogger(__name__)

_CODE_BY_STATUS = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}


def authorized(header: str, key: str | None) -> bool:
    """Whether an ``Authorization`` header value carries ``key`` as a Bearer token."""
    if not key:
        return True
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    try:
        given = token.strip().encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that no byte string stands for
        return False
    return hmac.compare_digest(given, key.encode())


@web.middleware
async def require_api_key(request: web.Request, handler):
    """Every /v1/ route needs the API key when one is configured; health and metrics do not
    (see ``health.py``)."""
    key = server_state(request).options.api_key
    if request.path.startswith("/v1/") and not authorized(
            request.headers.get("Authorization", ""), key):
        return json_error("unauthorized", "missing or wrong API key")
    return await handler(request)


@web.middleware
async def json_errors(request: web.Request, handler):
    """aiohttp's own client errors (404, 405, 413, ...) as JSON, like every other refusal."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400 or e.status >= 500:
            raise
        code = _CODE_BY_STATUS.get(e.status, "bad_request")
        response = json_error(code, e.reason or e.text or "bad request")
        response.set_status(e.status)
        if "Allow" in e.headers:
            response.headers["Allow"] = e.headers["Allow"]
        return response
