"""SIGTERM with WebSocket contexts live: aiohttp reads nothing more from any socket once the
server stops, so a context still open for text ends at once with the retryable
``shutting_down``, while one that has all its text speaks to its end (up to ``drain_s``);
then the socket closes with 1001. Before, every context froze: its client's text was
dropped unread, and the process sat out aiohttp's shutdown timeout twice (up to 120 s)
before it cut the sockets (1006)."""

import asyncio
import contextlib

import aiohttp
import pytest
from aiohttp import web

from livekit.plugins.veena.protocol import ERROR_CODES
from livekit.plugins.veena.server.app import ServerOptions, create_app

from ..fakes import fake_pipeline
from ..servers import poll_until
from .rawws import RawWebSocket
from .test_contexts import GUARD_POLLS, Reader, speak

HANG_GUARD_S = 120  # only against a hang


@contextlib.asynccontextmanager
async def _server(pipeline, options: ServerOptions):
    """The app on a free loopback port: yields (port, the runner's cleanup, which is what
    SIGTERM runs through ``web.run_app``)."""
    runner = web.AppRunner(create_app(pipeline, options, own_pipeline=False))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    stop = asyncio.ensure_future(asyncio.sleep(0))  # replaced by the test's stop, if any

    def stopping() -> asyncio.Future:
        nonlocal stop
        stop = asyncio.ensure_future(runner.cleanup())
        return stop

    try:
        yield site._server.sockets[0].getsockname()[1], stopping
    finally:
        await stop
        if runner.server is not None:  # the test did not stop it
            await runner.cleanup()


async def _two_contexts(port: int, engine) -> Reader:
    """One context with all its text, one still open for more; both generating, held."""
    reader = Reader(await RawWebSocket.connect(port))
    await reader.ws.send_together([speak("whole", "All of this turn's text is here.", False),
                                   speak("open", "This turn has more to come.", True),
                                   {"type": "flush", "context_id": "open"}])
    await poll_until(lambda: len(engine.live) == 2, "both generating", polls=GUARD_POLLS)
    return reader


async def test_stopping_drains_whole_contexts_and_ends_open_ones_retryably():
    async with fake_pipeline(hold_after=3) as p, _server(p, ServerOptions(drain_s=3600)) as (
            port, stop):
        reader = await _two_contexts(port, p.engine)
        stopping = stop()
        await poll_until(lambda: reader.terminal("open"), "the open context ended",
                         polls=GUARD_POLLS)
        (ended,) = reader.terminal("open")
        assert (ended["type"], ended["code"], ended["retryable"]) == (
            "error", "shutting_down", True)
        assert ERROR_CODES["shutting_down"].status == 503
        assert not reader.terminal("whole") and not stopping.done()  # still speaking
        p.engine.gate.set()  # the engine goes on: the whole context speaks to its end
        await asyncio.wait_for(stopping, HANG_GUARD_S)
        (done,) = reader.terminal("whole")
        assert done["type"] == "done" and reader.audio["whole"] > 0
        await poll_until(lambda: reader.closed, "the socket closed", polls=GUARD_POLLS)
        assert reader.close_code == 1001  # going away
        await reader.stop()


async def test_a_context_still_speaking_after_drain_s_is_cut_with_shutting_down():
    async with fake_pipeline(hold_after=3) as p, _server(p, ServerOptions(drain_s=0.2)) as (
            port, stop):
        reader = await _two_contexts(port, p.engine)
        # the engine never goes on: only the drain's bound ends the whole context
        await asyncio.wait_for(stop(), HANG_GUARD_S)
        assert {e["context_id"]: e["code"] for e in reader.terminal()} == {
            "open": "shutting_down", "whole": "shutting_down"}
        await poll_until(lambda: reader.closed, "the socket closed", polls=GUARD_POLLS)
        assert reader.close_code == 1001
        assert not p.engine.live  # their engine requests were aborted
        await reader.stop()


# --- /v1/audio/speech drains as contexts do --------------------------------------------------

async def _speeches(port: int, engine, session):
    """A whole and a streamed speech request, both generating, held at the engine's gate."""
    url = f"http://127.0.0.1:{port}/v1/audio/speech"
    whole = asyncio.ensure_future(session.post(url, json={"input": "All of this is here."}))
    streamed = asyncio.ensure_future(session.post(
        url, json={"input": "This one streams its audio.", "stream": True}))
    await poll_until(lambda: len(engine.live) == 2, "both generating", polls=GUARD_POLLS)
    return whole, streamed


async def test_speech_requests_speak_to_their_end_while_the_server_drains():
    async with fake_pipeline(hold_after=3) as p, _server(p, ServerOptions(drain_s=3600)) as (
            port, stop), aiohttp.ClientSession() as s:
        whole, streamed = await _speeches(port, p.engine, s)
        stopping = stop()
        await asyncio.sleep(0.2)  # the drain has begun (a causal check follows: not done)
        assert not stopping.done() and not whole.done()
        p.engine.gate.set()
        await asyncio.wait_for(stopping, HANG_GUARD_S)
        for request in (whole, streamed):
            r = await request
            assert r.status == 200 and len(await r.read()) > 44


async def test_a_speech_request_still_running_after_drain_s_answers_shutting_down():
    """Before, the drain did not wait for HTTP requests and aiohttp then waited its own
    shutdown timeout twice before it dropped them (``ServerDisconnectedError``, up to ~44 s
    with the defaults: past a pod's grace period)."""
    async with fake_pipeline(hold_after=3) as p, _server(p, ServerOptions(drain_s=0.2)) as (
            port, stop), aiohttp.ClientSession() as s:
        whole, streamed = await _speeches(port, p.engine, s)
        await asyncio.wait_for(stop(), HANG_GUARD_S)  # the engine never goes on
        r = await whole
        assert r.status == 503 and r.headers["Retry-After"] == "1"
        assert (await r.json())["error"]["code"] == "shutting_down"
        r = await streamed  # its headers went out: it is cut short, which its client sees
        assert r.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
        assert not p.engine.gate.is_set() and not p.engine.live  # aborted, never finished
