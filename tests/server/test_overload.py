"""Past capacity the server refuses new streams at once (``overloaded``, retryable, HTTP 503
with Retry-After) instead of slowing every stream down; admitted ones are unaffected."""

import asyncio
import json
import time

import aiohttp
import numpy as np
import pytest
from livekit.agents import APIConnectOptions, tts

from livekit.plugins import veena
from livekit.plugins.veena.server.app import ServerOptions
from livekit.plugins.veena.protocol import decode_audio

from ..helpers import engine_settled, same_audio
from .conftest import metric, serve

pytestmark = pytest.mark.engine
TERMINAL = ("done", "cancelled", "error")
HANG_GUARD_S = 600  # only against a hang; never a claim about speed


def _ws(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/stream"


def _speak(cid: str, seed: int) -> dict:
    return {"type": "speak", "context_id": cid, "text": f"Stream {cid} speaks.",
            "continue": False, "seed": seed, "sampling": {"max_tokens": 35}}


async def _collect(ws, cids):
    """Per context: its audio, its terminal event, and when that event came."""
    audio = {c: bytearray() for c in cids}
    end: dict = {}
    ended_at: dict = {}
    while len(end) < len(cids):
        msg = await ws.receive(timeout=HANG_GUARD_S)
        if msg.type == aiohttp.WSMsgType.BINARY:
            cid, pcm = decode_audio(msg.data)
            audio[cid] += pcm
            continue
        ev = json.loads(msg.data)
        if ev["type"] in TERMINAL:  # not "waiting", "voice" or "words"
            end[ev["context_id"]] = ev
            ended_at[ev["context_id"]] = time.perf_counter()
    return audio, end, ended_at


async def test_two_active_two_queued_eight_arrive(pipeline):
    opts = ServerOptions(max_active_streams=2, max_queued_streams=2, max_queue_wait_s=3600)
    cids = [f"c{i}" for i in range(8)]
    async with serve(pipeline, opts) as url, aiohttp.ClientSession() as s:
        async with s.ws_connect(_ws(url)) as ws:
            sent = time.perf_counter()
            for i, cid in enumerate(cids):
                await ws.send_json(_speak(cid, seed=100 + i))
            audio, end, ended_at = await _collect(ws, cids)
        done = [c for c in cids if end[c]["type"] == "done"]
        refused = [c for c in cids if end[c]["type"] == "error"]
        assert len(done) == 4 and len(refused) == 4, end
        for c in refused:
            assert end[c]["code"] == "overloaded" and end[c]["retryable"] is True
            assert ended_at[c] - sent < 1.0  # refused at once, no engine work
            assert not audio[c]
        assert await metric(s, url, "veena_rejected_streams_total") == 4
        # each admitted stream sounds exactly as it does alone
        async with s.ws_connect(_ws(url)) as ws:
            for c in done:
                await ws.send_json(_speak(c, seed=100 + cids.index(c)))
                solo, _, _ = await _collect(ws, [c])
                got = np.frombuffer(bytes(audio[c]), np.int16)
                assert same_audio(got, np.frombuffer(bytes(solo[c]), np.int16))
        # the HTTP edge refuses the same way: 503 + Retry-After, JSON body
        async with s.ws_connect(_ws(url)) as ws:
            for i in range(4):
                await ws.send_json({**_speak(f"h{i}", 1), "sampling": {"max_tokens": 1400},
                                    "text": "A long answer that keeps the slots busy. " * 3})
            while await metric(s, url, "veena_queued_streams") < 2:
                await asyncio.sleep(0.02)
            async with s.post(url + "/v1/audio/speech", json={"input": "Hi."}) as r:
                body = await r.json()
                assert r.status == 503 and r.headers["Retry-After"] == "1"
                assert body["error"]["code"] == "overloaded" and body["error"]["retryable"]
    assert await engine_settled(pipeline) and pipeline.scheduler.pending == 0


async def test_fallback_adapter_moves_on_when_the_server_is_full(pipeline):
    opts = ServerOptions(max_active_streams=1, max_queued_streams=0)
    async with serve(pipeline, opts) as url, aiohttp.ClientSession() as s:
        async with s.ws_connect(_ws(url)) as ws:
            await ws.send_json({**_speak("busy", 1), "sampling": {"max_tokens": 1400},
                                "text": "A long answer that holds the only slot. " * 3})
            while (await ws.receive(timeout=HANG_GUARD_S)).type != aiohttp.WSMsgType.BINARY:
                pass
            remote = veena.TTS(base_url=_ws(url), max_tokens_per_chunk=35)
            local = veena.TTS(pipeline=pipeline, max_tokens_per_chunk=35, seed=3)
            remote_errors = []
            remote.on("error", remote_errors.append)
            fallback = tts.FallbackAdapter([remote, local], max_retry_per_tts=0)
            frame = await fallback.synthesize(
                "Hello from the fallback.", conn_options=APIConnectOptions(max_retry=0)).collect()
            assert frame.samples_per_channel > 0
            assert remote_errors and "overloaded" in str(remote_errors[0].error)
            assert remote_errors[0].error.status_code == 503
            assert await metric(s, url, "veena_rejected_streams_total") >= 1
            await ws.send_json({"type": "cancel", "context_id": "busy"})
            await fallback.aclose()
    assert await engine_settled(pipeline)
