"""The plugin's remote mode at its edge with the agent: a first text later than the read
timeout, options given as numpy numbers, a voice changed while a stream still captures the
old one, and streams the agent dropped."""

import asyncio
import gc
import json
import weakref

import numpy as np
import pytest
from aiohttp import web
from livekit.agents import APIConnectOptions
from livekit.plugins import veena

from livekit.plugins.veena.protocol import encode_audio
from livekit.plugins.veena.server.app import ServerOptions

from ..fakes import fake_pipeline, fake_server

TEXT = "Hello there. This is one whole turn."


async def _heard(stream) -> int:
    heard = 0
    async for ev in stream:
        heard += len(ev.frame.data)
    await stream.aclose()
    return heard


async def test_a_first_text_later_than_the_read_timeout_is_spoken():
    """The read timeout measures a silent server, not a slow LLM: nothing was asked of the
    server before the first text (before, ``APITimeoutError`` after ``timeout``)."""
    async with fake_server(ServerOptions(keepalive_s=0.1)) as server:
        tts_ = veena.TTS(base_url=server.ws_url)
        try:
            stream = tts_.stream(conn_options=APIConnectOptions(max_retry=0, timeout=3.0))

            async def late_text():
                await asyncio.sleep(4.0)  # the LLM's first words come after the timeout
                stream.push_text(TEXT)
                stream.end_input()

            writer = asyncio.create_task(late_text())
            assert await asyncio.wait_for(_heard(stream), 120) > 0  # a hang guard only
            await writer
        finally:
            await tts_.aclose()


async def test_numpy_numbers_are_taken_as_python_ones():
    """A numpy int or float passes the checks and is stored as Python's own (before, every
    remote stream failed: JSON cannot write an ``int64``)."""
    kw = dict(temperature=np.float32(0.5), top_p=np.float64(0.9), top_k=np.int64(40),
              repetition_penalty=np.float64(1.1), max_tokens_per_chunk=np.int32(700),
              seed=np.int64(5))
    async with fake_server(ServerOptions()) as server:
        tts_ = veena.TTS(base_url=server.ws_url, **kw)
        try:
            stream = tts_.stream(conn_options=APIConnectOptions(max_retry=0, timeout=30))
            stream.push_text(TEXT)
            stream.end_input()
            assert await asyncio.wait_for(_heard(stream), 120) > 0
            tts_.update_options(top_k=np.int16(20), seed=np.uint8(7))
            stream = tts_.stream(conn_options=APIConnectOptions(max_retry=0, timeout=30))
            stream.push_text(TEXT)
            stream.end_input()
            assert await asyncio.wait_for(_heard(stream), 120) > 0
        finally:
            await tts_.aclose()


class _VoiceServer:
    """A scripted server of a BiCodec model: it answers a context's first message with the
    ``voice`` event of globals [7] * 32 once ``release`` is set, then audio and ``done``."""

    def __init__(self) -> None:
        self.first_messages: list[dict] = []
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    async def ready(self, request):
        return web.json_response({"sample_rate": 16000})

    async def stream(self, request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            m = json.loads(msg.data)
            cid = m["context_id"]
            if m["type"] == "speak" and "voice" in m:
                self.first_messages.append(m)
                self.asked.set()
            if m["type"] == "speak" and m.get("continue") is False:
                await self.release.wait()
                if "speaker_globals" not in self.first_messages[-1]:
                    await ws.send_json({"type": "voice", "context_id": cid,
                                        "speaker_globals": [7] * 32})
                await ws.send_bytes(encode_audio(cid, b"\0\1" * 1600))
                await ws.send_json({"type": "done", "context_id": cid, "audio_seconds": 0.1})
        return ws


@pytest.mark.parametrize("when", ["while it speaks", "before its task ran"])
async def test_globals_captured_after_a_voice_change_are_not_the_new_voices(when):
    """``update_options(voice=...)`` while a stream of the old voice still captures (or
    before its task first ran: its options were taken when it was made): its globals are
    that stream's, not the call's new voice (before, every later stream spoke the new voice
    name with the old voice's timbre)."""
    script = _VoiceServer()
    app = web.Application()
    app.router.add_get("/ready", script.ready)
    app.router.add_get("/v1/stream", script.stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    tts_ = veena.TTS(base_url=f"ws://127.0.0.1:{port}", profile="veena3", voice="kavya")
    try:
        old = tts_.stream(conn_options=APIConnectOptions(max_retry=0, timeout=30))
        if when == "before its task ran":
            tts_.update_options(voice="meera")
        old.push_text(TEXT)
        old.end_input()
        hearing = asyncio.create_task(_heard(old))
        await asyncio.wait_for(script.asked.wait(), 60)  # a hang guard only
        assert script.first_messages[-1]["voice"] == "kavya"
        if when == "while it speaks":
            tts_.update_options(voice="meera")
        script.release.set()
        assert await asyncio.wait_for(hearing, 60) > 0
        assert old.speaker_globals == (7,) * 32  # the old stream spoke with its own
        assert tts_.speaker_globals is None  # but the call's new voice is still to capture
        new = tts_.stream(conn_options=APIConnectOptions(max_retry=0, timeout=30))
        new.push_text(TEXT)
        new.end_input()
        assert await asyncio.wait_for(_heard(new), 60) > 0
        first = script.first_messages[-1]
        assert first["voice"] == "meera" and "speaker_globals" not in first
        assert tts_.speaker_globals == (7,) * 32  # captured by the new voice's own stream
    finally:
        await tts_.aclose()
        await runner.cleanup()


async def test_a_stream_the_agent_dropped_is_not_kept_alive():
    """A closed stream, and one whose server could not be reached, are freed once the agent
    drops them (before, the TTS kept every such stream for its whole life)."""
    tts_ = veena.TTS(base_url="ws://127.0.0.1:9")  # nothing listens there
    try:
        closed = tts_.stream()
        await closed.aclose()
        failed = tts_.stream(conn_options=APIConnectOptions(max_retry=0, timeout=5))
        failed.push_text(TEXT)
        failed.end_input()
        try:
            await asyncio.wait_for(_heard(failed), 60)
        except Exception:
            pass
        await failed.aclose()
        refs = [weakref.ref(closed), weakref.ref(failed)]
        del closed, failed
        gc.collect()
        assert [r() for r in refs] == [None, None]
    finally:
        await tts_.aclose()


async def test_a_reply_of_tags_the_model_does_not_perform_is_a_quiet_turn():
    """All its text removed, a turn says nothing: a moment of silence, not livekit's "no
    audio frames were pushed" (retried, then unrecoverable: an AgentSession closes after a
    few), in both modes."""
    async with fake_pipeline() as p, fake_server(ServerOptions()) as server:
        for tts_ in (veena.TTS(pipeline=p), veena.TTS(base_url=server.ws_url)):
            errors = []
            tts_.on("error", errors.append)
            try:
                for speak in ("stream", "synthesize"):
                    if speak == "stream":
                        stream = tts_.stream(conn_options=APIConnectOptions(max_retry=0))
                        stream.push_text("<happy> <sigh>")
                        stream.end_input()
                    else:
                        stream = tts_.synthesize("<happy>",
                                                 conn_options=APIConnectOptions(max_retry=0))
                    heard = await asyncio.wait_for(_heard(stream), 60)
                    assert 0 < heard <= 2 * 24000 // 50, heard  # at most 20 ms of silence
                empty = tts_.stream(conn_options=APIConnectOptions(max_retry=0))
                empty.end_input()  # no text at all: nothing, not even silence
                assert await asyncio.wait_for(_heard(empty), 60) == 0
            finally:
                await tts_.aclose()
            assert errors == []
