"""Remote mode against servers that stall: timeouts are ``APITimeoutError``, retried as
livekit-agents' provider contract expects (``max_retry=3`` gives four ``error`` events)."""

import asyncio
import re

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
    """Answers ``/ready``; on ``/v1/stream`` completes the WebSocket handshake, then never
    sends a message; on ``/stall/v1/stream`` never completes the handshake."""
    async def handler(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for _ in ws:
            pass
        return ws

    async def ready(request):
        return web.json_response({"ready": True, "sample_rate": 24000})

    released = asyncio.Event()

    async def stall(request):
        await released.wait()  # until the fixture ends
        return web.Response(status=503)

    async def refuse(request):
        return web.json_response({"error": {"code": "overloaded", "message": "full",
                                             "retryable": True}}, status=503,
                                 headers={"Retry-After": "1"})

    app = web.Application()
    app.router.add_get("/v1/stream", handler)
    app.router.add_get("/ready", ready)
    app.router.add_get("/stall/ready", ready)
    app.router.add_get("/stall/v1/stream", stall)
    app.router.add_get("/full/v1/stream", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"ws://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    released.set()
    await runner.cleanup()


async def _stream_errors(tts_, conn):
    errors = []
    tts_.on("error", errors.append)
    stream = tts_.stream(conn_options=conn)
    stream.push_text("Hello there.")
    stream.end_input()
    with pytest.raises(Exception) as info:
        async for _ in stream:
            pass
    await stream.aclose()
    return info.value, errors


STALLS = {  # where the server stops answering -> the plugin's message for it
    "no ready": "no answer from .*/ready",
    "no handshake": "no WebSocket handshake from",
    "no message": "no message from the veena server",
}


@pytest.fixture(params=list(STALLS))
def stalled(request, silent_tcp_server, silent_ws_server):
    url = {"no ready": silent_tcp_server, "no handshake": silent_ws_server + "/stall",
           "no message": silent_ws_server}[request.param]
    return url, STALLS[request.param]


async def test_stalled_server_is_a_timeout_retried_four_times(stalled):
    url, message = stalled
    tts_ = veena.TTS(base_url=url)
    conn = APIConnectOptions(max_retry=3, timeout=0.5, retry_interval=0.05)
    err, errors = await _stream_errors(tts_, conn)
    assert isinstance(err, APITimeoutError), err
    assert len(errors) == 4 and all(isinstance(e.error, APITimeoutError) for e in errors)
    assert all(re.search(message, str(e.error)) for e in errors), [str(e.error) for e in errors]
    assert [e.recoverable for e in errors] == [True, True, True, False]
    assert all("in 0.5 s" in str(e.error) for e in errors)  # each attempt had its full timeout
    await tts_.aclose()


async def test_refused_handshake_is_a_retryable_503(silent_ws_server):
    tts_ = veena.TTS(base_url=silent_ws_server + "/full")
    err, errors = await _stream_errors(tts_, APIConnectOptions(max_retry=1, timeout=5,
                                                                  retry_interval=0.05))
    assert isinstance(err, APIStatusError) and err.status_code == 503 and err.retryable
    assert len(errors) == 2
    await tts_.aclose()
