"""Claims of the server pages (docs/http-api.md, websocket.md, operations.md) and
docs/plugin.md about the server and the plugin's transport that
no other test exercised, each on the fake engine (no vLLM): a flushed live context speaks before its end, the plugin's
FLUSH and its cancel reach the server, the error codes end to end, VEENA_MAX_CONNECTIONS,
X-Sample-Rate and the streamed WAV header, HTTP ``seed`` reproducibility, the output buffer's
bound (not a send timeout) cutting off a client that stops reading, ``/ready`` 503 during
start-up, exit code 3 after a failed start, the metrics' values after one stream, and a
server that leaves a caller's pipeline as it found it."""

import asyncio
import contextlib
import json
import os
import struct
import subprocess
import sys

import aiohttp
import numpy as np
import pytest

from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.pipeline.chunking import ChunkerOptions
from livekit.plugins.veena.pipeline.engine import (
    EngineError,
    EngineHealth,
    EngineOptions,
    EngineStartingError,
)
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions
from livekit.plugins.veena.plugin.remote import FLUSH, RemoteClient
from livekit.plugins.veena.server import app as app_module
from livekit.plugins.veena.server.app import ServerOptions

from ..fakes import FakeEngine, ToneCodec, fake_pipeline, fake_server
from ..servers import free_port, metric, poll_until, serve, serve_app
from .rawws import RawWebSocket, text_frame
from .test_contexts import Reader, speak
from .test_slow_client import _open_non_reader

GUARD_POLLS = 400  # a hang guard for the fake engine's tests, never a claim about speed
HANG_GUARD_S = 60


@contextlib.asynccontextmanager
async def _pipeline(engine: FakeEngine, codec=None):
    p = Pipeline(engine, codec or ToneCodec(), VEENA, PipelineOptions())
    await p.start()
    try:
        yield p
    finally:
        await p.aclose()


# --- isolation -------------------------------------------------------------------------------

async def test_a_closed_server_app_leaves_the_callers_pipeline_as_it_found_it():
    async with fake_pipeline() as p:
        before = (len(p.scheduler._listeners), len(p.engine._dead_listeners))
        for _ in range(2):
            async with serve(p, ServerOptions()):
                assert len(p.scheduler._listeners) == before[0] + 1
            assert (len(p.scheduler._listeners), len(p.engine._dead_listeners)) == before


# --- WebSocket flush, and the plugin's FLUSH and cancel --------------------------------------

async def test_flush_speaks_a_live_contexts_buffered_text_before_its_end():
    async with fake_server(ServerOptions()) as server:
        r = Reader(await RawWebSocket.connect(server.port))
        # no sentence mark: the chunker holds this text until a flush or the end
        await r.ws.send_together([speak("a", "a few words with no sentence mark", True),
                                  {"type": "flush", "context_id": "sentinel"}])
        await poll_until(lambda: r.of("sentinel", "rejected"), "the sentinel's answer",
                         polls=GUARD_POLLS)
        assert server.engine.tokens_out == 0 and not r.audio
        await r.ws.send_together([{"type": "flush", "context_id": "a"}])
        await poll_until(lambda: r.audio.get("a"), "audio of the flushed text",
                         polls=GUARD_POLLS)
        assert not r.terminal("a")  # spoken while the context is still open
        await r.ws.send_together([speak("a", "", False)])
        await poll_until(lambda: r.terminal("a"), "a's end", polls=GUARD_POLLS)
        assert [e["type"] for e in r.terminal("a")] == ["done"]
        await r.stop()


async def test_the_plugins_flush_reaches_the_server():
    async with fake_server(ServerOptions()) as server:
        client = RemoteClient(server.url)
        heard = asyncio.Event()

        async def texts():
            yield "a few words with no sentence mark"
            yield FLUSH
            await heard.wait()  # the context stays open until the flushed text is heard

        def push(pcm: bytes) -> None:
            heard.set()

        try:
            await asyncio.wait_for(client.speak(texts(), {"sampling": {"max_tokens": 28}},
                                                push, timeout=HANG_GUARD_S), HANG_GUARD_S)
        finally:
            await client.aclose()
        assert heard.is_set()


async def test_the_plugin_cancels_its_context_when_its_stream_is_closed_mid_speech():
    async with fake_server(ServerOptions(), hold_after=2) as server:
        client = RemoteClient(server.url)
        heard = asyncio.Event()

        async def texts():
            yield "A sentence that will not be finished."

        task = asyncio.create_task(client.speak(
            texts(), {"sampling": {"max_tokens": 700}}, lambda pcm: heard.set(),
            timeout=HANG_GUARD_S))
        try:
            await poll_until(lambda: server.engine.live, "the engine request",
                             polls=GUARD_POLLS)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            async with aiohttp.ClientSession() as s:
                async def cancelled() -> bool:
                    return await metric(s, server.url,
                                        'veena_requests_total{outcome="cancelled"}') >= 1
                await poll_until(cancelled, "the context ended cancelled", polls=GUARD_POLLS)
            # the socket is still open (pooled): only the cancel can have ended the context
            assert server.state.connections == 1
            await poll_until(server.idle, "slots and the engine request freed",
                             polls=GUARD_POLLS)
            assert server.engine.aborted
        finally:
            await client.aclose()


# --- error codes end to end ------------------------------------------------------------------

class _FailingEngine(FakeEngine):
    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    async def generate(self, prompt, sampling, request_id=None):
        raise self.error
        yield  # an async generator, as the real engine's


class _StartingEngine(FakeEngine):
    """An engine whose start outlasts every caller's wait."""

    def __init__(self) -> None:
        super().__init__()
        self.started = False

    async def start(self, timeout=None) -> None:
        raise EngineStartingError("the engine is still starting")


async def _ws_error(url: str) -> dict:
    async with aiohttp.ClientSession() as s, s.ws_connect(url + "/v1/stream") as ws:
        await ws.send_json(speak("a", "Hello there.", False))
        while True:
            msg = await asyncio.wait_for(ws.receive(), HANG_GUARD_S)
            assert msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), msg
            if msg.type == aiohttp.WSMsgType.TEXT and json.loads(msg.data)["type"] in (
                    "done", "cancelled", "error"):
                return json.loads(msg.data)


@pytest.mark.parametrize("engine, code, retryable", [
    (lambda: _FailingEngine(EngineError("vLLM said no")), "engine_error", True),
    (lambda: _FailingEngine(KeyError("a bug")), "internal_error", True),
    (lambda: _StartingEngine(), "starting", True),
])
async def test_a_failure_ends_the_context_with_its_code(engine, code, retryable):
    e = engine()
    p = Pipeline(e, ToneCodec(), VEENA, PipelineOptions())
    try:
        async with serve(p, ServerOptions()) as url:
            event = await _ws_error(url)
            assert (event["type"], event["code"], event["retryable"]) == ("error", code, retryable)
            async with aiohttp.ClientSession() as s:
                r = await s.post(url + "/v1/audio/speech", json={"input": "Hello there."})
                body = await r.json()
                assert body["error"]["code"] == code
                assert r.status == {"engine_error": 502, "internal_error": 500,
                                    "starting": 503}[code]
    finally:
        await p.aclose()


async def test_a_stream_without_progress_ends_with_timeout():
    # the engine never yields past its second frame: no progress, whatever the clock says
    async with fake_server(ServerOptions(turn_timeout_s=0.2), hold_after=2) as server:
        event = await _ws_error(server.url)
        assert (event["code"], event["retryable"]) == ("timeout", True)
        await poll_until(server.idle, "the stalled request freed", polls=GUARD_POLLS)


@pytest.mark.parametrize("stream", [False, True])
async def test_an_http_speech_without_progress_is_a_timeout_not_a_client_that_left(stream,
                                                                                  caplog):
    """A turn's timeout is a ``TimeoutError`` too: it was taken for a client that stopped
    reading (499, counted aborted and cancelled; a streamed one logged a traceback)."""
    async with fake_server(ServerOptions(turn_timeout_s=0.2), hold_after=2) as server, \
            aiohttp.ClientSession() as s:
        async with s.post(server.url + "/v1/audio/speech", json={
                "input": "Hello there.", "response_format": "pcm", "stream": stream}) as r:
            if stream:  # the stream is cut: its last chunk never comes
                assert r.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    await r.read()
            else:
                assert r.status == 504
                assert (await r.json())["error"] == {
                    "code": "timeout", "message": "no progress from the engine for 0.2 s",
                    "retryable": True}
        assert await metric(s, server.url, 'veena_requests_total{outcome="timeout"}') == 1
        assert await metric(s, server.url, 'veena_requests_total{outcome="cancelled"}') == 0
        assert await metric(s, server.url, "veena_aborted_requests_total") == 0
        await poll_until(server.settled, "nothing left", polls=GUARD_POLLS)
    assert not [r for r in caplog.records if r.levelno >= 40], caplog.text


# --- VEENA_MAX_CONNECTIONS -------------------------------------------------------------------

async def test_connections_past_veena_max_connections_are_refused_at_the_handshake(monkeypatch):
    monkeypatch.setenv("VEENA_MAX_CONNECTIONS", "1")
    opts = ServerOptions.from_env()
    assert opts.max_connections == 1
    async with fake_server(opts) as server, aiohttp.ClientSession() as s:
        async with s.ws_connect(server.ws_url):
            await poll_until(lambda: server.state.connections == 1, "the first connection",
                             polls=GUARD_POLLS)
            with pytest.raises(aiohttp.WSServerHandshakeError) as e:
                await s.ws_connect(server.ws_url)
            assert e.value.status == 503
            assert await metric(s, server.url,
                                'veena_rejected_streams_total{reason="connections"}') == 1
        await poll_until(lambda: server.state.connections == 0, "the first one closed",
                         polls=GUARD_POLLS)
        async with s.ws_connect(server.ws_url):  # room again
            pass


# --- VEENA_MAX_QUEUED_STREAMS=0, VEENA_CHUNK_CROSSFADE_MS, VEENA_MAX_CHUNKS_IN_FLIGHT -------

async def test_veena_max_queued_streams_0_means_no_queue(monkeypatch):
    """0 is a limit, not "the default" (it was read as unset: as many as may run)."""
    monkeypatch.setenv("VEENA_MAX_ACTIVE_STREAMS", "1")
    monkeypatch.setenv("VEENA_MAX_QUEUED_STREAMS", "0")
    monkeypatch.setenv("VEENA_MAX_QUEUE_WAIT_S", "3600")  # a queued one would wait for good
    async with fake_server(ServerOptions.from_env(), hold_after=3) as server:
        holder = await RawWebSocket.connect(server.port)
        await holder.send_together([speak("h", "Hold the only slot, please. ", False)])
        await poll_until(lambda: server.engine.live, "the slot held", polls=GUARD_POLLS)
        async with aiohttp.ClientSession() as s:
            async def refused() -> None:
                async with s.post(server.url + "/v1/audio/speech",
                                  json={"input": "Me too."}) as r:
                    assert r.status == 503
                    assert (await r.json())["error"]["code"] == "overloaded"

            await asyncio.wait_for(refused(), 60)  # a hang guard only: it is refused at once
        assert server.state.admission.queued == 0
        await holder.close()
        await poll_until(server.settled, "nothing left", polls=GUARD_POLLS)


TWO_CHUNKS = "Hello there, my friend. And this second sentence is another chunk of the turn."


async def _pcm_bytes(options: ServerOptions) -> int:
    async with fake_server(options) as server, aiohttp.ClientSession() as s:
        async with s.post(server.url + "/v1/audio/speech",
                          json={"input": TWO_CHUNKS, "response_format": "pcm"}) as r:
            assert r.status == 200
            return len(await r.read())


async def test_the_server_crossfades_chunks_by_veena_chunk_crossfade_ms(monkeypatch):
    """The server's turns read it too (they always used 15 ms)."""
    monkeypatch.setenv("VEENA_CHUNK_CROSSFADE_MS", "0")
    plain = await _pcm_bytes(ServerOptions.from_env())
    monkeypatch.setenv("VEENA_CHUNK_CROSSFADE_MS", "40")
    faded = await _pcm_bytes(ServerOptions.from_env())
    seam = 40 * 24 * 2  # one 40 ms crossfade at 24 kHz, int16
    assert plain > faded and (plain - faded) % seam == 0, (plain, faded)


@pytest.mark.parametrize("in_flight", [1, 2])
async def test_the_server_generates_veena_max_chunks_in_flight_chunks_at_once(monkeypatch,
                                                                             in_flight):
    monkeypatch.setenv("VEENA_MAX_CHUNKS_IN_FLIGHT", str(in_flight))
    async with fake_server(ServerOptions.from_env(), hold_after=3) as server:
        ws = await RawWebSocket.connect(server.port)
        await ws.send_together([speak("c", TWO_CHUNKS, False)])
        engine = server.engine
        await poll_until(lambda: len(engine.live) >= in_flight, "the chunks started",
                         polls=GUARD_POLLS)
        for _ in range(200):  # the turn had every chance to start its next chunk
            await asyncio.sleep(0)
        assert len(engine.live) == in_flight
        await ws.close()
        await poll_until(server.settled, "nothing left", polls=GUARD_POLLS)


# --- POST /v1/audio/speech: X-Sample-Rate, streamed WAV header, seed -------------------------

async def test_a_streamed_wav_says_its_rate_and_carries_the_unknown_length_header():
    async with fake_server(ServerOptions()) as server, aiohttp.ClientSession() as s:
        async with s.post(server.url + "/v1/audio/speech", json={
                "input": "Hello there.", "response_format": "wav", "stream": True,
                "sampling": {"max_tokens": 70}}) as r:
            assert r.status == 200
            assert r.headers["X-Sample-Rate"] == "24000"
            assert r.headers.get("Transfer-Encoding") == "chunked"
            data = await r.read()
        riff, size, wave = struct.unpack("<4sI4s", data[:12])
        assert (riff, wave) == (b"RIFF", b"WAVE") and size == 0xFFFFFFFF
        channels, rate, _, _, bits = struct.unpack("<HIIHH", data[22:36])
        assert (channels, rate, bits) == (1, 24000, 16)
        assert data[36:40] == b"data"
        assert struct.unpack("<I", data[40:44])[0] == 0xFFFFFFFF - 36
        assert len(data) > 44
        async with s.post(server.url + "/v1/audio/speech", json={
                "input": "Hello there.", "response_format": "pcm",
                "sampling": {"max_tokens": 70}}) as r:
            assert r.headers["X-Sample-Rate"] == "24000"


class _CodesCodec(ToneCodec):
    """Audio that is a function of the codes (unlike silence), so sameness means something."""

    def decode(self, batch):
        return [np.repeat((b.codes.reshape(b.codes.shape[0], -1).sum(1) % 997) / 997 - 0.5,
                          self.samples_per_step).astype(np.float32) for b in batch]


async def test_the_same_http_seed_gives_the_same_bytes():
    async with _pipeline(FakeEngine(), _CodesCodec()) as p, serve(p, ServerOptions()) as url, \
            aiohttp.ClientSession() as s:
        async def speech(seed: int) -> bytes:
            async with s.post(url + "/v1/audio/speech", json={
                    "input": "Hello there.", "response_format": "pcm", "seed": seed,
                    "sampling": {"max_tokens": 70}}) as r:
                assert r.status == 200
                return await r.read()

        first = await speech(7)
        assert first and first == await speech(7)
        assert first != await speech(8)  # the seed decides the bytes, not something fixed


# --- the output buffer's bound ---------------------------------------------------------------

async def test_a_client_that_stops_reading_is_cut_off_by_the_buffer_limit():
    limit = 64 << 10
    # the send timeout is an hour: only the bytes the client leaves unread can decide; one
    # chunk (one engine request) whose budget is past the engine's hold after 300 frames of
    # 2048 samples (1.2 MB of audio, far past every buffer): the request is still running
    # when the client is cut off, so it must be aborted
    text = "a long answer nobody is listening to " * 6 + "."
    opts = ServerOptions(slow_client_s=3600.0, max_connection_buffer_bytes=limit,
                         socket_send_buffer_bytes=16 << 10,
                         chunker=ChunkerOptions(first_min_chars=len(text),
                                                first_max_chars=len(text),
                                                min_chars=len(text), max_chars=len(text)))
    async with fake_server(opts, hold_after=300) as server, aiohttp.ClientSession() as s:
        loop = asyncio.get_running_loop()
        sock = await _open_non_reader(server.port)
        try:
            await loop.sock_sendall(sock, text_frame({
                "type": "speak", "context_id": "a", "continue": False, "text": text,
                "sampling": {"max_tokens": 2800}}))
            peak = 0

            async def cut_off() -> bool:
                nonlocal peak
                peak = max(peak, await metric(s, server.url, "veena_buffered_bytes"))
                return await metric(s, server.url, "veena_slow_clients_total") >= 1

            await poll_until(cut_off, "the client cut off", polls=GUARD_POLLS)
            assert peak <= limit
            await poll_until(server.idle, "its context and engine request freed",
                             polls=GUARD_POLLS)
            assert await metric(s, server.url, 'veena_requests_total{outcome="slow_client"}') == 1
            assert len(server.engine.aborted) == 1  # the one request, stopped before its end
            assert server.engine.tokens_out <= 300 * 7
        finally:
            sock.close()


# --- start-up: /ready 503 while starting, exit code 3 after a failed start -------------------

class _SlowStartEngine(FakeEngine):
    """Starts when the test opens ``gate``; fails to start if ``fail`` is set."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.started = False
        self.fail = fail
        self.health = EngineHealth("starting")
        self.start_gate = asyncio.Event() if not fail else None

    async def start(self, timeout=None) -> None:
        if self.fail:
            self.health = EngineHealth("failed", "no GPU here")
            raise EngineError("no GPU here")
        await self.start_gate.wait()
        self.started, self.health = True, EngineHealth("ready")


async def test_ready_answers_503_while_the_engine_starts_and_200_once_it_has():
    engine = _SlowStartEngine()
    p = Pipeline(engine, ToneCodec(), VEENA, PipelineOptions())
    async with serve_app(p, ServerOptions(), own_pipeline=True) as (url, _app):
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/ready") as r:
                assert r.status == 503 and (await r.json())["status"] == "starting"
            async with s.get(url + "/health") as r:
                assert r.status == 200  # alive while starting
            engine.start_gate.set()

            async def ready() -> bool:
                async with s.get(url + "/ready") as r:
                    return r.status == 200
            await poll_until(ready, "/ready 200 after the start", polls=GUARD_POLLS)
            assert await metric(s, url, "veena_engine_up") == 1


async def test_engine_up_follows_a_pipeline_the_app_does_not_own():
    """An app over a caller's pipeline: the first request starts the engine, and the gauge
    says so (it was set only where the pipeline was ready when the app was built)."""
    engine = _SlowStartEngine()
    engine.start_gate.set()
    p = Pipeline(engine, ToneCodec(), VEENA, PipelineOptions())
    try:
        async with serve_app(p, ServerOptions(), own_pipeline=False) as (url, _app), \
                aiohttp.ClientSession() as s:
            assert await metric(s, url, "veena_engine_up") == 0
            async with s.post(url + "/v1/audio/speech", json={"input": "Hello."}) as r:
                assert r.status == 200
            assert await metric(s, url, "veena_engine_up") == 1
    finally:
        await p.aclose()


def _failing_starts(monkeypatch) -> list[Pipeline]:
    """``load_pipeline`` made over an engine whose start fails; the pipelines made."""
    made: list[Pipeline] = []

    def load_pipeline(model, profile=None, engine_core=None):
        made.append(Pipeline(_SlowStartEngine(fail=True), ToneCodec(), VEENA,
                             PipelineOptions()))
        return made[-1]

    monkeypatch.setattr(app_module.loading, "load_pipeline", load_pipeline)
    return made


def test_serve_exits_3_when_the_engine_fails_to_start(monkeypatch):
    # run_server as `veena-tts serve` runs it, over an engine whose start fails
    monkeypatch.setenv("VEENA_ENGINE_DEAD_EXIT_S", "0")
    made = _failing_starts(monkeypatch)
    assert app_module.run_server("fake", profile=None, host="127.0.0.1",
                                 port=free_port()) == app_module.ENGINE_DEAD_EXIT_CODE == 3
    assert made[0].engine.health.state == "dead"  # failed to start: dead for good


def test_a_worker_whose_engine_fails_to_start_never_opens_the_shared_port(monkeypatch):
    """One of several workers (``reuse_port``, ``on_ready``): it opened the port anyway and
    for ``VEENA_ENGINE_DEAD_EXIT_S`` took its share of the connections, answering them the
    non-retryable ``engine_dead`` while its siblings were healthy. Now it exits 3 at once."""
    monkeypatch.setenv("VEENA_ENGINE_DEAD_EXIT_S", "3600")  # the old code served this long
    made = _failing_starts(monkeypatch)
    readied = []
    assert app_module.run_server("fake", profile=None, host="127.0.0.1", port=free_port(),
                                 reuse_port=True, on_ready=lambda: readied.append(1)) == 3
    assert not readied
    with pytest.raises(RuntimeError, match="closed"):  # closed: no cleanup runs after a
        made[0].scheduler.submit("x", None)  # failed startup, so the app closed it itself


async def test_after_a_failed_start_requests_are_refused_and_start_nothing(monkeypatch):
    """The server is stopping after its engine's start failed: a request meanwhile is
    refused with ``engine_dead`` and the exit code stays 3 (it started a second vLLM load,
    on the GPU that had just failed, and the server then exited 0)."""
    from livekit.plugins.veena.pipeline.engine import VllmEngine

    builds = []

    def build(self):  # stands in for vLLM's engine build: a failure such as CUDA OOM
        builds.append(1)
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(VllmEngine, "_build", build)
    engine = VllmEngine(EngineOptions(model="fake", max_model_len=4096, max_num_seqs=4))
    p = Pipeline(engine, ToneCodec(), VEENA, PipelineOptions())
    async with serve_app(p, ServerOptions(engine_dead_exit_s=3600), own_pipeline=True) as (
            url, _app), aiohttp.ClientSession() as s:
        await poll_until(lambda: engine.health.state == "dead", "the start failed",
                         polls=GUARD_POLLS)
        async with s.post(url + "/v1/audio/speech", json={"input": "Hello."}) as r:
            assert r.status == 503 and (await r.json())["error"]["code"] == "engine_dead"
        async with s.get(url + "/health") as r:
            assert r.status == 503
    assert builds == [1] and engine.health.state == "dead"


# --- metric values after one stream ----------------------------------------------------------

async def _metrics(s, url: str) -> dict[str, float]:
    async with s.get(url + "/metrics") as r:
        text = await r.text()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


async def test_metrics_have_sensible_values_after_one_stream():
    async with fake_server(ServerOptions(), hold_after=2) as server, \
            aiohttp.ClientSession() as s:
        r = Reader(await RawWebSocket.connect(server.port))
        await r.ws.send_together([speak("a", "Hello there, one sentence.", False,
                                        sampling={"max_tokens": 70})])
        await poll_until(lambda: server.engine.live, "the engine request", polls=GUARD_POLLS)
        m = await _metrics(s, server.url)  # while the stream holds its slot
        assert m["veena_active_streams"] == 1 and m["veena_admitted_streams"] == 1
        assert m["veena_queued_streams"] == 0 and m["veena_connections"] == 1
        assert m["veena_engine_up"] == 1
        server.engine.gate.set()
        await poll_until(lambda: r.terminal("a"), "a's end", polls=GUARD_POLLS)
        assert [e["type"] for e in r.terminal("a")] == ["done"]
        await poll_until(server.idle, "a freed", polls=GUARD_POLLS)
        m = await _metrics(s, server.url)
        assert m['veena_requests_total{outcome="done"}'] == 1
        assert m["veena_first_audio_seconds_count"] == 1 and m["veena_first_audio_seconds_sum"] > 0
        assert m["veena_real_time_factor_count"] == 1 and m["veena_real_time_factor_sum"] > 0
        assert m["veena_stream_queue_wait_seconds_count"] == 1
        assert m["veena_stream_queue_wait_seconds_sum"] >= 0
        batches = m["veena_decode_batch_size_count"]
        assert batches >= 1 and m["veena_decode_batch_size_sum"] >= batches
        assert m["veena_decode_queue_wait_seconds_count"] == batches
        assert m["veena_decode_queue_wait_seconds_sum"] >= 0
        assert m["veena_active_streams"] == 0 and m["veena_admitted_streams"] == 0
        assert m["veena_buffered_bytes"] == 0
        assert m["veena_aborted_requests_total"] == 0 and m["veena_slow_clients_total"] == 0
        assert not [k for k, v in m.items() if k.startswith("veena_rejected_streams_total{")
                    and v]
        await r.stop()
        await r.ws.close()
        await poll_until(lambda: server.state.connections == 0, "the socket closed",
                         polls=GUARD_POLLS)
        assert (await _metrics(s, server.url))["veena_connections"] == 0


def _serve_missing_model(tmp_path, **env) -> subprocess.CompletedProcess:
    """``veena-tts serve`` on a model that is not there, with ``env`` added."""
    return subprocess.run(
        [sys.executable, "-m", "livekit.plugins.veena.cli", "serve", "--model",
         str(tmp_path / "no-such-model"), "--port", str(free_port())],
        env=dict(os.environ, HF_HUB_OFFLINE="1", **env), capture_output=True, text=True,
        timeout=600)  # a hang guard only


def test_serve_on_a_model_that_cannot_be_loaded_exits_3_with_one_error_line(tmp_path):
    proc = _serve_missing_model(tmp_path, VEENA_ENGINE_DEAD_EXIT_S="0")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


# --- the plugin itself (remote mode): flush() speaks, aclose() cancels ---------------------

async def test_a_plugin_stream_flushes_live_text_and_its_aclose_cancels_on_the_server():
    from livekit.plugins import veena

    async with fake_server(ServerOptions(), hold_after=8) as server, \
            aiohttp.ClientSession() as s:
        t = veena.TTS(base_url=server.ws_url, max_tokens_per_chunk=700)
        stream = t.stream()
        try:
            stream.push_text("a few words with no sentence mark")
            stream.flush()  # no end_input: only the flush can make the server speak
            first = await asyncio.wait_for(stream.__anext__(), HANG_GUARD_S)
            assert first.frame.samples_per_channel > 0
            assert server.engine.live  # still speaking: held by the engine's gate
            await stream.aclose()

            async def cancelled() -> bool:
                return await metric(s, server.url,
                                    'veena_requests_total{outcome="cancelled"}') >= 1
            await poll_until(cancelled, "the context ended cancelled", polls=GUARD_POLLS)
            assert server.state.connections == 1  # pooled socket open: the cancel ended it
            await poll_until(server.idle, "slots and the engine request freed",
                             polls=GUARD_POLLS)
            assert server.engine.aborted
        finally:
            await stream.aclose()
            await t.aclose()


def test_a_bad_setting_is_one_line_before_any_model_loading(tmp_path):
    """A server setting was first read as the app was made, after the model load (minutes
    on a GPU box; in each worker, with a traceback): here the model cannot even be found,
    and the setting is still what it reports."""
    proc = _serve_missing_model(tmp_path, VEENA_MAX_CONNECTIONS="0")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "max_connections must be in [1, " in proc.stderr
    assert "cannot load the model" not in proc.stderr and "Traceback" not in proc.stderr
