"""A maya1 server takes a voice described in words, in the WebSocket's ``voice`` field and in
``/v1/audio/speech``'s: a bad description is a 4xx JSON error before any engine work, a good
one (stripped) reaches the prompt as ``<description="...">``. The product's own pipeline and
server run over the fake engine, which records every request it is given."""

from __future__ import annotations

import contextlib
import json
import re

import aiohttp
import pytest

from livekit.plugins.veena.models.profiles import MAYA1
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions
from livekit.plugins.veena.protocol import ERROR_CODES
from livekit.plugins.veena.server.app import ServerOptions

from ..fakes import FakeEngine, ToneCodec
from ..servers import serve_app

MAX_MESSAGES = 10_000  # messages read while waiting for one: a hang guard only


class _RecordingEngine(FakeEngine):
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.prompts: list[list[int]] = []

    def generate(self, prompt, sampling, request_id=None):
        self.prompts.append(list(prompt))
        return super().generate(prompt, sampling, request_id)


@contextlib.asynccontextmanager
async def _maya1_server():
    """A maya1 server over the recording fake engine; yields (URL, engine)."""
    p = Pipeline(_RecordingEngine(), ToneCodec(), MAYA1, PipelineOptions())
    await p.start()
    try:
        async with serve_app(p, ServerOptions()) as (url, _):
            yield url, p.engine
    finally:
        await p.aclose()


def _prompt(engine: FakeEngine, text: str, description: str) -> list[int]:
    """SOH, BOS, the fake tokenizer's words, EOT, EOH, SOA, SOS (the model card's ids)."""
    words = engine.tokenizer.encode(f'<description="{description}"> {text}')
    return [128259, 128000, *words, 128009, 128260, 128261, 128257]


REJECTED = [
    ("", "bad_request", "must not be empty"),
    ("  \t ", "bad_request", "must not be empty|U\\+0009"),
    ("x" * 501, "bad_request", "at most 500"),
    ('Female, "calm"', "bad_request", "must not contain"),
    ("Female <angry>", "bad_request", "must not contain"),
    ("Female> calm", "bad_request", "must not contain"),
    ("calm<|eot_id|>", "bad_request", "must not contain"),
    ("Female, calm\nnew line", "bad_request", "U\\+000A"),
    ("Female,\tcalm", "bad_request", "U\\+0009"),
    ("Female,\u200bcalm", "bad_request", "U\\+200B"),
    ("Female, \u202ecalm", "bad_request", "U\\+202E"),
    (3, "bad_field", "string"),
    (True, "bad_field", "string"),
    (["ava"], "bad_field", "string"),
]


async def test_a_bad_description_is_a_4xx_json_error_before_any_engine_work():
    async with _maya1_server() as (url, engine), aiohttp.ClientSession() as s:
        async with s.ws_connect(url.replace("http://", "ws://") + "/v1/stream") as ws:
            for i, (voice, code, match) in enumerate(REJECTED):
                await ws.send_json({"type": "speak", "context_id": f"c{i}", "text": "Hello.",
                                    "voice": voice, "continue": False})
                event = json.loads((await ws.receive(timeout=30)).data)
                assert event["type"] == "error" and event["context_id"] == f"c{i}", event
                assert event["code"] == code and 400 <= ERROR_CODES[code].status < 500, event
                assert re.search(match, event["message"]), event
        for voice, _, match in REJECTED:
            body = {"input": "Hello.", "voice": voice}
            async with s.post(url + "/v1/audio/speech", json=body) as r:
                error = (await r.json())["error"]
                assert 400 <= r.status < 500 and error["code"] in ("bad_request", "bad_field")
                assert re.search(match, error["message"]), (voice, error)
        assert engine.prompts == [] and engine.tokens_out == 0


ACCEPTED = [
    ("noah", dict(MAYA1.voice_prompts)["noah"]),
    *((d, d) for d in ("Female, 30s, British accent, calm",
                       "Mujer de 30 años, acento andaluz, voz cálida",
                       "Male, 45, 2 kids; deep & slow (narration)")),
    ("   Young woman, 20s, upbeat  ", "Young woman, 20s, upbeat"),
    (None, dict(MAYA1.voice_prompts)["ava"]),  # no voice: the default preset
]


@pytest.mark.parametrize("voice,spoken", ACCEPTED)
async def test_a_description_reaches_the_prompt_over_the_websocket(voice, spoken):
    async with _maya1_server() as (url, engine), aiohttp.ClientSession() as s:
        async with s.ws_connect(url.replace("http://", "ws://") + "/v1/stream") as ws:
            message = {"type": "speak", "context_id": "a", "text": "Hi there.",
                       "continue": False, "sampling": {"max_tokens": 35}}
            if voice is not None:
                message["voice"] = voice
            await ws.send_json(message)
            audio = 0
            for _ in range(MAX_MESSAGES):
                msg = await ws.receive(timeout=30)
                if msg.type == aiohttp.WSMsgType.BINARY:
                    audio += 1
                    continue
                event = json.loads(msg.data)
                assert event["type"] != "error", event
                if event["type"] == "done":
                    break
            assert audio > 0
    assert engine.prompts == [_prompt(engine, "Hi there.", spoken)]


@pytest.mark.parametrize("voice,spoken", ACCEPTED)
async def test_a_description_reaches_the_prompt_over_http(voice, spoken):
    async with _maya1_server() as (url, engine), aiohttp.ClientSession() as s:
        body = {"input": "Hi there.", "response_format": "pcm", "sampling": {"max_tokens": 35}}
        if voice is not None:
            body["voice"] = {"id": voice} if voice == "noah" else voice
        async with s.post(url + "/v1/audio/speech", json=body) as r:
            assert r.status == 200, await r.text()
            assert len(await r.read()) > 0
    assert engine.prompts == [_prompt(engine, "Hi there.", spoken)]
