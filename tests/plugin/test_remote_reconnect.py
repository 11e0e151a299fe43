"""A pooled socket that ended while it waited for the next turn (the server restarted, a
proxy's idle timeout): the plugin's next turn speaks on a new socket, whole, with no error and
no retry; a socket that ends under a context it opened itself is a typed, retryable error."""

import asyncio
import contextlib

import pytest
from aiohttp import web
from livekit.agents import APIConnectionError, APIConnectOptions
from livekit.plugins import veena

from livekit.plugins.veena.server.app import ServerOptions, create_app

from ..fakes import fake_pipeline
from ..helpers import tasks_left_since

TEXT = "Hello there. This is one whole turn, in two sentences."
NO_RETRY = APIConnectOptions(max_retry=0, timeout=10)


@contextlib.asynccontextmanager
async def _listening(app: web.Application, port: int = 0):
    """``app`` on loopback ``port``: yields the port; on leaving, its sockets close at once
    (as a restarting server's do)."""
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, reuse_address=True)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]
    finally:
        await runner.cleanup()


def _server(pipeline, port: int = 0):
    return _listening(create_app(pipeline, ServerOptions(), own_pipeline=False), port)


async def _turn(tts_: veena.TTS, pieces: list[str]) -> int:
    """One ``stream()`` turn, its text pushed piece by piece: the bytes of audio heard."""
    stream = tts_.stream(conn_options=NO_RETRY)
    for piece in pieces:
        stream.push_text(piece)
        await asyncio.sleep(0.01)
    stream.end_input()
    heard = 0
    async for ev in stream:
        heard += len(ev.frame.data)
    await stream.aclose()
    return heard


@pytest.mark.parametrize("pieces", [[TEXT], [w + " " for w in TEXT.split()]],
                         ids=["whole", "word-by-word"])
async def test_a_pooled_socket_that_ended_is_replaced_and_the_turn_speaks_whole(pieces, caplog):
    errors = []
    async with fake_pipeline() as p:
        async with _server(p) as port:
            tts_ = veena.TTS(base_url=f"ws://127.0.0.1:{port}")
            tts_.on("error", errors.append)
            # two turns at once: the pool keeps two sockets, both of which will have ended
            solo, other = await asyncio.gather(_turn(tts_, pieces), _turn(tts_, pieces))
            assert other == solo
        try:  # the server restarted on the same port: the call's pooled socket has ended
            async with _server(p, port):
                assert await _turn(tts_, pieces) == solo  # every word spoken, once
                assert await _turn(tts_, pieces) == solo  # and the new socket is pooled
        finally:
            await tts_.aclose()
    assert solo > 0
    assert errors == []  # no failed attempt, nothing for livekit to retry
    replaced = [r for r in caplog.records if "pooled connection" in r.getMessage()]
    assert len(replaced) == 1


@pytest.fixture
async def closing_ws_server():
    """Completes the WebSocket handshake, then closes the socket without a word."""
    async def handler(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.close()
        return ws

    async def ready(request):
        return web.json_response({"ready": True, "sample_rate": 24000})

    app = web.Application()
    app.router.add_get("/v1/stream", handler)
    app.router.add_get("/ready", ready)
    async with _listening(app) as port:
        yield f"ws://127.0.0.1:{port}"


async def test_a_new_socket_that_ends_is_a_retryable_connection_error(closing_ws_server):
    """Only a socket that waited in the pool is replaced; one opened for this context that
    ends is the livekit error its retry policy expects, never an aiohttp exception."""
    errors = []
    tts_ = veena.TTS(base_url=closing_ws_server)
    tts_.on("error", errors.append)
    try:
        with pytest.raises(APIConnectionError) as info:
            await _turn(tts_, [TEXT])
    finally:
        await tts_.aclose()
    assert info.value.retryable
    assert "closed the connection" in str(info.value)
    assert len(errors) == 1


async def test_a_turn_closed_while_its_text_still_comes_leaves_nothing_running():
    """The pending read of the agent's text is stopped and waited for when the turn ends
    (its stream closes the text source next)."""
    async with fake_pipeline() as p, _server(p) as port:
        before = set(asyncio.all_tasks())
        tts_ = veena.TTS(base_url=f"ws://127.0.0.1:{port}")
        stream = tts_.stream(conn_options=NO_RETRY)
        stream.push_text("Hello there. This sentence is spoken while more text is due.")
        stream.flush()  # no end of input: the turn waits for more text
        await asyncio.wait_for(stream.__anext__(), 30)  # a hang guard only
        await stream.aclose()
        await tts_.aclose()
        leaked = await tasks_left_since(before)
        assert not leaked, leaked
