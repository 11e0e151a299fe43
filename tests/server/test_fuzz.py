"""Arbitrary JSON at every field of ``speak`` and ``/v1/audio/speech``: each request gets a
client (4xx-class) error or audio, and a normal request right after still succeeds. Plus the
four poison pills that, unchecked, killed vLLM's engine core for every client.

The HTTP edges beyond the JSON fields (fake engine, no vLLM: bounded time in CI): arbitrary
header values, malformed multipart bodies and oversized bodies and frames. Nothing a client
sends gets a 5xx; every refusal the app makes is a JSON error body with a known code."""

import asyncio
import json
import math

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from livekit.plugins.veena.pipeline.engine_options import SamplingOptions
from livekit.plugins.veena.protocol import ERROR_CODES, decode_audio
from livekit.plugins.veena.server.app import ServerOptions
from livekit.plugins.veena.server.options import MAX_HTTP_BODY_BYTES

from ..fakes import fake_server
from ..helpers import engine_settled
from ..servers import API_KEY
from .rawws import RawWebSocket, frame, raw_http

engine = pytest.mark.engine
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
    for _ in range(100_000):  # a hang guard only
        m = await ws.receive(timeout=HANG_GUARD_S)
        if m.type == aiohttp.WSMsgType.BINARY:
            got_cid, _ = decode_audio(m.data)
            if outcome is None and got_cid == cid:
                outcome = "audio"
                await ws.send_json({"type": "cancel", "context_id": got_cid})
            continue
        assert m.type == aiohttp.WSMsgType.TEXT, m
        event = json.loads(m.data)
        if (event["type"] in ("waiting", "voice", "words", "rejected")
                or event.get("context_id") not in (cid, None)):
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


@engine
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


@engine
@given(field=st.sampled_from(SPEECH_FIELDS), value=any_value)
@FUZZ
async def test_fuzz_openai_speech(server_url, pipeline, field, value):
    base = {"model": "veena", "input": "Hi.", "voice": "kavya", "response_format": "pcm",
            "stream": True, "sampling": {"max_tokens": 14}}
    async with aiohttp.ClientSession(headers=AUTH) as s:
        await _speech_outcome(s, server_url, _with(base, field, value))
        assert await _speech_outcome(s, server_url, {**base, "sampling": {"max_tokens": 7}}) == "audio"
    assert pipeline.engine.health.state == "ready"


@engine
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


@engine
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


@engine
async def test_stream_interval_reaches_vllm(pipeline):
    """vLLM hands over its first token at once, then one delta per ``stream_interval`` new
    tokens, and the rest at the end: one delta per SNAC frame after the first token."""
    prompt = pipeline.profile.build_prompt(pipeline.engine.tokenizer, "Hi.", "kavya")
    for interval, sizes in ((7, [1, 7, 7, 1]), (1, [1] * 16)):
        sampling = SamplingOptions(max_tokens=16, min_tokens=16, seed=5,
                                   stream_interval=interval)
        got = [len(ids) async for ids in pipeline.engine.generate(prompt, sampling)]
        assert got == sizes, (interval, got)


# -- the HTTP edges, over a fake engine ---------------------------------------------------

HEADER_FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                       suppress_health_check=list(HealthCheck))
V1_PATHS = [b"GET /v1/voices", b"POST /v1/voices", b"POST /v1/voices?name=x",
            b"POST /v1/audio/speech", b"GET /v1/stream", b"GET /v1/nowhere",
            b"GET /v1/audio/speech"]


def _assert_client_error(status: int, headers: dict, body: bytes, ctx) -> None:
    """A 4xx with the JSON error body and a known client-error code."""
    assert 400 <= status < 500, (status, body[:300], ctx)
    assert headers.get("content-type", "").startswith("application/json"), (headers, body, ctx)
    error = json.loads(body)["error"]
    assert _is_client_error(error) and ERROR_CODES[error["code"]].status == status, (error, ctx)


@pytest.fixture
async def fake():
    async with fake_server(ServerOptions(api_key=API_KEY)) as server:
        yield server


# header values: printable ASCII, tab, and bytes 0x80-0xff (obs-text, not UTF-8 as a rule)
_header_bytes = st.binary(max_size=40).map(
    lambda b: bytes(c for c in b if c == 9 or 32 <= c < 127 or c >= 128))


@given(path=st.sampled_from(V1_PATHS), auth=_header_bytes, ctype=_header_bytes,
       other=_header_bytes, body=st.binary(max_size=64))
@HEADER_FUZZ
async def test_fuzz_headers_never_get_a_5xx(fake, path, auth, ctype, other, body):
    """Arbitrary Authorization, Content-Type and other header values on every /v1/ path:
    401 without the key (JSON), never a 5xx; with the key prefixed, whatever the body and
    content type, a JSON 4xx or a 2xx."""
    for authorization in (auth, b"Bearer " + API_KEY.encode() + auth[:0]):
        head = (path + b" HTTP/1.1\r\nHost: x\r\nAuthorization: " + authorization
                + b"\r\nContent-Type: " + ctype + b"\r\nX-Other: " + other
                + b"\r\nContent-Length: %d" % len(body))
        status, headers, payload = await raw_http(fake.port, head, body)
        ctx = (path, authorization, ctype, other, body)
        assert status < 500, (status, payload[:300], ctx)
        if status >= 400:
            _assert_client_error(status, headers, payload, ctx)
        if authorization == auth and auth.strip() != b"Bearer " + API_KEY.encode():
            assert status == 401, ctx


async def test_non_utf8_authorization_is_a_401_on_every_v1_path(fake):
    for path in V1_PATHS:
        for auth in (b"Bearer \xff\xfe", b"\xc3\x28", b"Bearer " + API_KEY.encode() + b"\xff"):
            head = path + b" HTTP/1.1\r\nHost: x\r\nAuthorization: " + auth
            status, headers, payload = await raw_http(fake.port, head)
            assert status == 401, (path, auth, status, payload)
            _assert_client_error(status, headers, payload, (path, auth))


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
async def test_the_bearer_scheme_is_case_insensitive(fake, scheme):
    async with aiohttp.ClientSession(headers={"Authorization": f"{scheme} {API_KEY}"}) as s:
        async with s.get(fake.url + "/v1/voices") as r:
            assert r.status == 200, await r.text()
        async with s.ws_connect(fake.ws_url):
            pass


@pytest.mark.parametrize("ctype,body", [
    (b"multipart/form-data", b""),  # no boundary
    (b"multipart/form-data", b"--xyz\r\nContent-Disposition: form-data; name=file\r\n\r\nRIFF"),
    (b"multipart/form-data; boundary=xyz", b""),  # empty body
    (b"multipart/form-data; boundary=xyz", b"no boundary anywhere in here"),
    (b"multipart/form-data; boundary=", b"----\r\n"),
    (b"multipart/form-data; boundary=xyz",
     b"--xyz\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nRIFF...unterminated"),
    (b"multipart/form-data; boundary=xyz", b"--xyz--\r\n"),  # no part at all
    (b"multipart/form-data; boundary=xyz", b"--xyz\r\nContent-Disposition: form-data; "
     b"name=\"other\"\r\n\r\nhi\r\n--xyz--\r\n"),  # no 'file' part
    (b"multipart/mixed; boundary=\"a b\"", b"--a b\r\n\r\n\r\n--a b--\r\n"),
])
async def test_malformed_multipart_uploads_are_a_json_4xx(fake, ctype, body):
    head = (b"POST /v1/voices HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode()
            + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: %d" % len(body))
    status, headers, payload = await raw_http(fake.port, head, body)
    _assert_client_error(status, headers, payload, (ctype, body))


_boundary = st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters='"\\'),
                    min_size=0, max_size=12)


@given(boundary=_boundary, parts=st.lists(st.binary(max_size=40), max_size=4),
       tail=st.sampled_from([b"", b"--", b"--\r\n", b"\r\n"]), noise=st.binary(max_size=24))
@HEADER_FUZZ
async def test_fuzz_multipart_bodies_never_get_a_5xx(fake, boundary, parts, tail, noise):
    b = boundary.encode()
    body = b"".join(b"--" + b + b"\r\n" + p + b"\r\n" for p in parts) + b"--" + b + tail + noise
    head = (b"POST /v1/voices HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode()
            + b"\r\nContent-Type: multipart/form-data; boundary=\"" + b + b"\""
            + b"\r\nContent-Length: %d" % len(body))
    status, headers, payload = await raw_http(fake.port, head, body)
    _assert_client_error(status, headers, payload, body)


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_speech_body_over_the_limit_is_a_json_413(fake, chunked):
    body = json.dumps({"input": "x" * (MAX_HTTP_BODY_BYTES + 10)}).encode()
    head = b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode()
    if chunked:
        head += b"\r\nTransfer-Encoding: chunked"
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    else:
        head += b"\r\nContent-Length: %d" % len(body)
    status, headers, payload = await raw_http(fake.port, head, body)
    _assert_client_error(status, headers, payload, "oversized body")
    assert status == 413 and json.loads(payload)["error"]["code"] == "body_too_large"


async def test_unknown_paths_and_methods_are_json_errors(fake):
    async with aiohttp.ClientSession(headers=AUTH) as s:
        for method, path, status, code in [("GET", "/v1/audio/speech", 405, "method_not_allowed"),
                                           ("GET", "/v1/nowhere", 404, "not_found"),
                                           ("GET", "/nowhere", 404, "not_found")]:
            async with s.request(method, fake.url + path) as r:
                body = await r.json()
                assert (r.status, body["error"]["code"]) == (status, code)


async def test_oversized_websocket_messages(fake):
    """Past ``max_message_bytes``: a ``message_too_large`` error, and the socket goes on.
    Past ``max_frame_bytes`` (4 MiB here), the socket is closed with 1009: answering it
    would mean buffering it whole (docs/websocket.md)."""
    ws = await RawWebSocket.connect(fake.port, {"Authorization": f"Bearer {API_KEY}"})
    opts = fake.state.options
    big = json.dumps({"type": "speak", "context_id": "big", "text": "x" * opts.max_message_bytes})
    await ws.send_together([big, {"type": "speak", "context_id": "ok", "text": "Still here.",
                                  "continue": False, "sampling": {"max_tokens": 14}}])
    events: list[dict] = []
    for _ in range(10_000):  # a hang guard only
        op, data = await asyncio.wait_for(ws.receive(), HANG_GUARD_S)
        if op == 0x1:
            events.append(json.loads(data))
        if any(e.get("type") == "done" for e in events):
            break
    assert events[0]["code"] == "message_too_large" and events[0]["context_id"] is None
    assert [e["context_id"] for e in events if e["type"] == "done"] == ["ok"]
    # only the head of a frame past the limit (its length field) and a little payload:
    # the server refuses by the length alone
    ws._writer.write(frame(b"x" * (opts.max_frame_bytes + 1))[:14 + 1024])
    await ws._writer.drain()
    for _ in range(10_000):
        op, data = await asyncio.wait_for(ws.receive(), HANG_GUARD_S)
        if op == 0x8:
            assert int.from_bytes(data[:2], "big") == 1009
            break
    await ws.close()


# valid JSON by the grammar that Python's json cannot load: an int past its 4300 digits
# (ValueError), nesting deeper than its recursion limit (RecursionError)
UNLOADABLE_JSON = ['{"type": "speak", "context_id": "c", "text": "hi", "seed": %s}' % ("9" * 5000),
                   "[" * 5000 + "]" * 5000, '{"a":' * 5000 + "1" + "}" * 5000]


@pytest.mark.parametrize("raw", UNLOADABLE_JSON, ids=["long-int", "deep-list", "deep-object"])
async def test_json_python_cannot_load_is_bad_json_and_the_socket_goes_on(fake, raw, caplog):
    ws = await RawWebSocket.connect(fake.port, {"Authorization": f"Bearer {API_KEY}"})
    await ws.send_together([raw, {"type": "speak", "context_id": "ok", "text": "Still here.",
                                  "continue": False, "sampling": {"max_tokens": 14}}])
    events: list[dict] = []
    for _ in range(10_000):  # a hang guard only
        op, data = await asyncio.wait_for(ws.receive(), HANG_GUARD_S)
        assert op != 0x8, data  # not closed
        if op == 0x1:
            events.append(json.loads(data))
        if any(e.get("type") == "done" for e in events):
            break
    await ws.close()
    assert events[0]["code"] == "bad_json" and events[0]["context_id"] is None
    assert [e["context_id"] for e in events if e["type"] == "done"] == ["ok"]
    assert not [r for r in caplog.records if r.levelno >= 40], caplog.text


@pytest.mark.parametrize("body,ctype", [
    *[(raw.replace('"type": "speak", "context_id": "c", "text"', '"input"'), b"application/json")
      for raw in UNLOADABLE_JSON],
    ('{"input": "hi"}', b"application/json; charset=no-such-charset"),
], ids=["long-int", "deep-list", "deep-object", "unknown-charset"])
async def test_a_speech_body_python_cannot_load_is_a_json_400(fake, body, ctype, caplog):
    head = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + API_KEY.encode() + b"\r\nContent-Type: " + ctype
            + b"\r\nContent-Length: %d" % len(body))
    status, headers, payload = await raw_http(fake.port, head, body.encode())
    _assert_client_error(status, headers, payload, body[:80])
    assert status == 400 and json.loads(payload)["error"]["code"] == "bad_json"
    assert not [r for r in caplog.records if r.levelno >= 40], caplog.text


HUGE = 10**400  # valid JSON, and Python reads it, but no float holds it


@pytest.mark.parametrize("field", ["temperature", "top_p", "repetition_penalty", "top_k"])
async def test_a_number_past_a_float_is_a_bad_field(fake, field, caplog):
    ws = await RawWebSocket.connect(fake.port, {"Authorization": f"Bearer {API_KEY}"})
    await ws.send_together([{"type": "speak", "context_id": "c", "text": "Hi.",
                             "continue": False, "sampling": {field: HUGE}}])
    op, data = await asyncio.wait_for(ws.receive(), HANG_GUARD_S)
    await ws.close()
    event = json.loads(data)
    assert event["type"] == "error" and ERROR_CODES[event["code"]].client_error, event
    async with aiohttp.ClientSession(headers=AUTH) as s:
        for body in ({"input": "Hi.", "speed": HUGE}, {"input": "Hi.", "sampling": {field: HUGE}}):
            async with s.post(fake.url + "/v1/audio/speech", data=json.dumps(body)) as r:
                assert r.status == 400, await r.text()
    assert not [r for r in caplog.records if r.levelno >= 40], caplog.text


async def test_ready_names_the_model_not_its_folder():
    async with fake_server(ServerOptions(), model="/srv/secret/models/my-veena") as server:
        async with aiohttp.ClientSession() as s, s.get(server.url + "/ready") as r:
            body = await r.json()
    assert r.status == 200 and body["model"] == "my-veena"
    assert "/srv" not in json.dumps(body)
