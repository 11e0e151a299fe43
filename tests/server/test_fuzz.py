"""Arbitrary JSON at every field of ``speak`` and ``/v1/audio/speech``: each request gets a
client (4xx-class) error or audio, and a normal request right after still succeeds. Plus the
four poison pills that, unchecked, killed vLLM's engine core for every client."""

import json
import math

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from livekit.plugins.veena.engine import SamplingOptions
from livekit.plugins.veena.protocol import ERROR_CODES, decode_audio

from ..helpers import engine_settled
from .conftest import API_KEY

pytestmark = pytest.mark.engine
AUTH = {"Authorization": f"Bearer {API_KEY}"}
HANG_GUARD_S = 300  # only against a hang; a tiny request takes well under a second

_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
json_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6),
                                                                         inner, max_size=4),
    max_leaves=6)
# values near the edges of what each field takes, mixed with anything at all
edge_values = st.sampled_from([0, 1, -1, 7, 1.5, 2.0, True, False, 2**63, 2**31, -0.0,
                               math.nan, math.inf, "", "kavya", [], {}, None, [0] * 32])
any_value = json_values | edge_values

SPEAK_FIELDS = ["type", "context_id", "text", "continue", "voice", "seed", "speaker_globals",
                "sampling", "sampling.temperature", "sampling.top_p", "sampling.top_k",
                "sampling.repetition_penalty", "sampling.max_tokens", "sampling.min_tokens"]
SPEECH_FIELDS = ["model", "input", "voice", "response_format", "speed", "stream", "seed",
                 "sampling", "sampling.temperature", "sampling.top_p", "sampling.top_k",
                 "sampling.repetition_penalty", "sampling.max_tokens", "sampling.min_tokens"]
FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


def _with(base: dict, path: str, value) -> dict:
    msg = json.loads(json.dumps(base))
    if path.startswith("sampling."):
        msg["sampling"][path.split(".", 1)[1]] = value
    else:
        msg[path] = value
    return msg


def _ws_url(http: str) -> str:
    return http.replace("http://", "ws://") + "/v1/stream"


def _is_client_error(event: dict) -> bool:
    spec = ERROR_CODES.get(event.get("code"))
    return spec is not None and spec.client_error and isinstance(event.get("message"), str)


async def _speak_outcome(ws, msg) -> str:
    """Send one speak message; 'audio', 'done' or the error code it got."""
    await ws.send_str(json.dumps(msg))  # NaN / Infinity go out as JSON extensions
    cid = msg.get("context_id")
    if msg.get("continue") is True and isinstance(cid, str):
        await ws.send_json({"type": "speak", "context_id": cid, "text": "", "continue": False})
    outcome = None
    while True:
        m = await ws.receive(timeout=HANG_GUARD_S)
        if m.type == aiohttp.WSMsgType.BINARY:
            got_cid, _ = decode_audio(m.data)
            if outcome is None and got_cid == cid:
                outcome = "audio"
                await ws.send_json({"type": "cancel", "context_id": got_cid})
            continue
        assert m.type == aiohttp.WSMsgType.TEXT, m
        event = json.loads(m.data)
        if event["type"] in ("waiting", "voice", "words") or event.get("context_id") not in (cid, None):
            continue  # e.g. an earlier context's answer to a cancel that crossed its end
        if event["type"] == "error":
            assert _is_client_error(event), (msg, event)
            return event["code"]
        assert event["type"] in ("done", "cancelled"), event
        return outcome or "done"


async def _normal_speak_works(ws) -> None:
    outcome = await _speak_outcome(ws, {"type": "speak", "context_id": "normal", "text": "Hi.",
                                        "continue": False, "sampling": {"max_tokens": 7}})
    assert outcome == "audio"


@given(field=st.sampled_from(SPEAK_FIELDS), value=any_value)
@FUZZ
async def test_fuzz_websocket_speak(server_url, pipeline, field, value):
    base = {"type": "speak", "context_id": "f", "text": "Hi.", "continue": False,
            "sampling": {"max_tokens": 14}}
    async with aiohttp.ClientSession(headers=AUTH) as s:
        async with s.ws_connect(_ws_url(server_url)) as ws:
            outcome = await _speak_outcome(ws, _with(base, field, value))
            assert outcome in ("audio", "done") or ERROR_CODES[outcome].client_error
            await _normal_speak_works(ws)
    assert pipeline.engine.health.state == "ready"


async def _speech_outcome(session, url, body) -> str:
    data = json.dumps(body)
    async with session.post(url + "/v1/audio/speech", data=data,
                            headers={"Content-Type": "application/json"}) as r:
        if r.status != 200:
            err = await r.json()
            assert 400 <= r.status < 500 and _is_client_error(err["error"]), (body, r.status, err)
            return err["error"]["code"]
        await r.content.read(64)  # audio flows; leaving now aborts the rest
        return "audio"


@given(field=st.sampled_from(SPEECH_FIELDS), value=any_value)
@FUZZ
async def test_fuzz_openai_speech(server_url, pipeline, field, value):
    base = {"model": "veena", "input": "Hi.", "voice": "kavya", "response_format": "pcm",
            "stream": True, "sampling": {"max_tokens": 14}}
    async with aiohttp.ClientSession(headers=AUTH) as s:
        await _speech_outcome(s, server_url, _with(base, field, value))
        assert await _speech_outcome(s, server_url, {**base, "sampling": {"max_tokens": 7}}) == "audio"
    assert pipeline.engine.health.state == "ready"


@pytest.mark.parametrize("sampling", [{"max_tokens": 1.5}, {"max_tokens": True},
                                      {"min_tokens": 1.5}, {"temperature": True}])
async def test_poison_pills_are_refused_and_the_engine_keeps_serving(server_url, pipeline, sampling):
    """The exact reproductions: each once passed validation and killed the engine core."""
    async with aiohttp.ClientSession(headers=AUTH) as s:
        async with s.ws_connect(_ws_url(server_url)) as ws:
            msg = {"type": "speak", "context_id": "p", "text": "Hello.", "continue": False,
                   "sampling": sampling}
            assert await _speak_outcome(ws, msg) == "bad_request"
            await _normal_speak_works(ws)
        body = {"input": "Hello.", "response_format": "pcm", "sampling": sampling}
        assert await _speech_outcome(s, server_url, body) == "bad_request"
    assert pipeline.engine.health.state == "ready"
    assert await engine_settled(pipeline)


async def test_engine_wrapper_rechecks_what_it_hands_to_vllm(pipeline):
    """Even a caller that skipped validation cannot get a float or bool into vLLM."""
    prompt = pipeline.profile.build_prompt(pipeline.engine.tokenizer, "Hi.", "kavya")
    for bad in (SamplingOptions(max_tokens=1.5), SamplingOptions(min_tokens=True),
                SamplingOptions(temperature=math.nan)):
        with pytest.raises(ValueError):
            async for _ in pipeline.engine.generate(prompt, bad):
                pass
    with pytest.raises(ValueError, match="prompt_token_ids"):
        async for _ in pipeline.engine.generate([1, 2.0], SamplingOptions(max_tokens=7)):
            pass
    got = [ids async for ids in pipeline.engine.generate(prompt, SamplingOptions(max_tokens=7))]
    assert sum(map(len, got)) == 7 and pipeline.engine.health.state == "ready"
