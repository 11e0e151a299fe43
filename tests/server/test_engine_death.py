"""One server's life: a request that arrives while its engine starts waits for it; then the
engine core process is killed under a running stream: the stream ends with a non-retryable
``engine_dead`` from the engine watcher (not a timeout), health says so, new work is refused, and the server exits
non-zero so its supervisor replaces it. Nothing hangs."""

import asyncio
import json
import signal

import aiohttp
import psutil
import pytest
from livekit.agents import APIConnectOptions, APIError
from livekit.plugins import veena

from livekit.plugins.veena.protocol import decode_audio
from livekit.plugins.veena.server.app import ENGINE_DEAD_EXIT_CODE

from ..servers import poll_until, spawn_server

pytestmark = pytest.mark.engine
HANG_GUARD_S = 120  # only against a hang


def _engine_cores(pid: int) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


async def _wait_exit(proc) -> int:
    await poll_until(lambda: proc.poll() is not None, "the server exits", every_s=0.2)
    return proc.returncode


MAX_MESSAGES = 100_000  # messages read while waiting for one event: a hang guard only


async def test_warm_up_then_engine_core_killed_mid_stream(tiny_model_dir):
    async with spawn_server(tiny_model_dir, wait_for="/health",
                            VEENA_ENGINE_DEAD_EXIT_S="20",
                            VEENA_TURN_TIMEOUT_S="600") as (proc, url):
        ws_url = url.replace("http://", "ws://") + "/v1/stream"
        # up, engine still starting (tens of seconds here): with the default conn_options
        # (10 s) the request waits for the engine, since the server keeps it informed
        early = veena.TTS(base_url=ws_url, max_tokens_per_chunk=35)
        frame = await early.synthesize("Hello while warming up.").collect()
        assert frame.samples_per_channel > 0
        await early.aclose()

        cores = _engine_cores(proc.pid)
        assert len(cores) == 1, cores
        async with aiohttp.ClientSession() as s:
            ws = await s.ws_connect(ws_url)
            await ws.send_json({"type": "speak", "context_id": "a", "continue": False,
                                "text": "A long reply that the engine will not finish. " * 3,
                                "sampling": {"max_tokens": 1400}})
            for _ in range(MAX_MESSAGES):
                if (await ws.receive(timeout=HANG_GUARD_S)).type == aiohttp.WSMsgType.BINARY:
                    break
            cores[0].send_signal(signal.SIGKILL)
            for _ in range(MAX_MESSAGES):
                msg = await ws.receive(timeout=HANG_GUARD_S)
                if msg.type == aiohttp.WSMsgType.BINARY:
                    assert decode_audio(msg.data)[0] == "a"
                    continue
                event = json.loads(msg.data)
                if event["type"] in ("done", "cancelled", "error"):
                    break
            # the engine watcher ended it (engine_dead, not the 600 s turn timeout below),
            # and within the server's grace period: the process still answers
            assert event["type"] == "error" and event["code"] == "engine_dead", event
            assert event["retryable"] is False
            assert proc.poll() is None
            for path in ("/ready", "/health"):
                async with s.get(url + path) as r:
                    body = await r.json()
                    assert r.status == 503 and body["engine"] == "dead" and body["reason"], body
            # a new context on the open socket, and a new connection: both refused
            await ws.send_json({"type": "speak", "context_id": "b", "text": "Hello.",
                                "continue": False})
            for _ in range(MAX_MESSAGES):
                event = json.loads((await ws.receive(timeout=HANG_GUARD_S)).data)
                if event["type"] == "error":
                    break
            assert event["code"] == "engine_dead"
            await ws.close()
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await s.ws_connect(ws_url)
            assert info.value.status == 503
            async with s.post(url + "/v1/audio/speech", json={"input": "Hello."}) as r:
                assert r.status == 503 and (await r.json())["error"]["code"] == "engine_dead"
        t = veena.TTS(base_url=ws_url)
        with pytest.raises(APIError):
            await t.synthesize("Hello.", conn_options=APIConnectOptions(max_retry=0)).collect()
        await t.aclose()
        assert await asyncio.wait_for(_wait_exit(proc), HANG_GUARD_S) == ENGINE_DEAD_EXIT_CODE
