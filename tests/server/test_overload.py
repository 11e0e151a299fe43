"""Past capacity the server refuses new streams at once (``overloaded``, retryable, HTTP 503
with Retry-After) instead of slowing every stream down; admitted ones are unaffected."""

import json

import aiohttp
import numpy as np
import pytest
from livekit.agents import APIConnectOptions, tts
from livekit.plugins import veena

from livekit.plugins.veena.protocol import decode_audio
from livekit.plugins.veena.server.app import ServerOptions

from ..helpers import engine_settled, same_audio
from ..servers import metric, poll_until, serve

pytestmark = pytest.mark.engine
TERMINAL = ("done", "cancelled", "error")
HANG_GUARD_S = 600  # only against a hang; never a claim about speed


def _ws(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/stream"


def _speak(cid: str, seed: int) -> dict:
    return {"type": "speak", "context_id": cid, "text": f"Stream {cid} speaks.",
            "continue": False, "seed": seed, "sampling": {"max_tokens": 35}}


async def _collect(ws, cids):
    """Per context: its audio and its terminal event; and the order of arrival: each
    context's terminal event, and "audio" for the socket's first audio frame."""
    audio = {c: bytearray() for c in cids}
    end: dict = {}
    order: list[str] = []
    while len(end) < len(cids):
        msg = await ws.receive(timeout=HANG_GUARD_S)
        if msg.type == aiohttp.WSMsgType.BINARY:
            cid, pcm = decode_audio(msg.data)
            audio[cid] += pcm
            if "audio" not in order:
                order.append("audio")
            continue
        ev = json.loads(msg.data)
        if ev["type"] in TERMINAL:  # not "waiting", "voice" or "words"
            end[ev["context_id"]] = ev
            order.append(ev["context_id"])
    return audio, end, order


async def test_two_active_two_queued_eight_arrive(pipeline):
    opts = ServerOptions(max_active_streams=2, max_queued_streams=2, max_queue_wait_s=3600)
    cids = [f"c{i}" for i in range(8)]
    async with serve(pipeline, opts) as url, aiohttp.ClientSession() as s:
        async with s.ws_connect(_ws(url)) as ws:
            for i, cid in enumerate(cids):
                await ws.send_json(_speak(cid, seed=100 + i))
            audio, end, order = await _collect(ws, cids)
        done = [c for c in cids if end[c]["type"] == "done"]
        refused = [c for c in cids if end[c]["type"] == "error"]
        assert len(done) == 4 and len(refused) == 4, end
        for c in refused:
            assert end[c]["code"] == "overloaded" and end[c]["retryable"] is True
            # refused at once: before any stream's first audio, and with no engine work
            assert order.index(c) < order.index("audio"), order
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
            async def queued() -> bool:
                return await metric(s, url, "veena_queued_streams") >= 2

            await poll_until(queued, "two streams queued", every_s=0.02)
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
            for _ in range(10_000):  # "waiting" keep-alives until the first audio
                if (await ws.receive(timeout=HANG_GUARD_S)).type == aiohttp.WSMsgType.BINARY:
                    break
            else:
                raise AssertionError("no audio from the stream holding the slot")
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
