"""Remote mode against servers that stall: timeouts are ``APITimeoutError``, retried as
livekit-agents' provider contract expects (``max_retry=3`` gives four ``error`` events)."""

import asyncio
import time

import pytest
from aiohttp import web
from livekit.agents import APIConnectOptions, APIStatusError, APITimeoutError

from livekit.plugins import veena


@pytest.fixture
async def silent_tcp_server():
    """Accepts TCP connections and never answers (not even the WebSocket handshake)."""
    held = []

    async def on_connect(reader, writer):
        held.append(writer)

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    yield f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    for w in held:
        w.close()
    server.close()
    await server.wait_closed()


@pytest.fixture
async def silent_ws_server():
    """Completes the WebSocket handshake, then never sends a message."""
    async def handler(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for _ in ws:
            pass
        return ws

    async def refuse(request):
        return web.json_response({"error": {"code": "overloaded", "message": "full",
                                             "retryable": True}}, status=503,
                                 headers={"Retry-After": "1"})

    app = web.Application()
    app.router.add_get("/v1/stream", handler)
    app.router.add_get("/full/v1/stream", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"ws://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    await runner.cleanup()


async def _stream_errors(tts_, conn):
    errors = []
    tts_.on("error", errors.append)
    stream = tts_.stream(conn_options=conn)
    stream.push_text("Hello there.")
    stream.end_input()
    t0 = time.perf_counter()
    with pytest.raises(Exception) as info:
        async for _ in stream:
            pass
    elapsed = time.perf_counter() - t0
    await stream.aclose()
    return info.value, errors, elapsed


@pytest.fixture(params=["no handshake", "no message"])
def stalled_url(request, silent_tcp_server, silent_ws_server):
    return silent_tcp_server if request.param == "no handshake" else silent_ws_server


async def test_stalled_server_is_a_timeout_retried_four_times(stalled_url):
    url = stalled_url
    tts_ = veena.TTS(base_url=url)
    conn = APIConnectOptions(max_retry=3, timeout=0.5, retry_interval=0.05)
    err, errors, elapsed = await _stream_errors(tts_, conn)
    assert isinstance(err, APITimeoutError), err
    assert len(errors) == 4 and all(isinstance(e.error, APITimeoutError) for e in errors)
    assert [e.recoverable for e in errors] == [True, True, True, False]
    assert elapsed >= 4 * 0.5  # each attempt waited its full timeout
    await tts_.aclose()


async def test_refused_handshake_is_a_retryable_503(silent_ws_server):
    tts_ = veena.TTS(base_url=silent_ws_server + "/full")
    err, errors, _ = await _stream_errors(tts_, APIConnectOptions(max_retry=1, timeout=5,
                                                                  retry_interval=0.05))
    assert isinstance(err, APIStatusError) and err.status_code == 503 and err.retryable
    assert len(errors) == 2
    await tts_.aclose()
