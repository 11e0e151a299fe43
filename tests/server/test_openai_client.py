"""``POST /v1/audio/speech`` as the official ``openai`` client uses it (sync, async and
``with_streaming_response``), against the server over the fake engine: the default format is
MP3, every format decodes (PyAV) at its rate, ``speed`` changes the length, SSE events
parse, and every value the server cannot honour is a ``BadRequestError`` naming the valid
ones. The sync client runs in a thread so the in-process server keeps serving."""

import asyncio
import base64
import io
import json

import av
import httpx
import numpy as np
import openai
import pytest

from livekit.plugins.veena.server.app import ServerOptions

from ..fakes import fake_server
from ..servers import API_KEY

FRAMES = 40
"""SNAC frames per request: about 3.4 s of audio, long enough to measure a stretch."""
EXTRA = {"sampling": {"max_tokens": 7 * FRAMES}, "seed": 1}


@pytest.fixture
async def url():
    async with fake_server(ServerOptions(api_key=API_KEY)) as server:
        yield server.url + "/v1"


def _sync(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0)


def _async(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key=API_KEY, max_retries=0)


def decoded(data: bytes, fmt: str = "mp3", rate: int = 24000) -> tuple[str, int, float]:
    """(container format, sample rate, seconds) of an answer, read back with PyAV."""
    if fmt == "pcm":
        return "pcm", rate, len(data) / 2 / rate
    with av.open(io.BytesIO(data)) as c:
        samples = sum(f.samples for f in c.decode(audio=0))
        stream_rate = c.streams.audio[0].rate
        return c.format.name, stream_rate, samples / stream_rate


def _create(client: openai.OpenAI, **kw):
    return client.audio.speech.create(model="veena", voice="kavya", input="Hello there.",
                                      extra_body=EXTRA, **kw)


async def test_sync_client_default_is_mp3(url):
    """OpenAI's default: a request without response_format gets MP3 (saved as .mp3 it plays)."""
    answer = await asyncio.to_thread(_create, _sync(url))
    assert answer.response.headers["content-type"] == "audio/mpeg"
    assert answer.response.headers["x-sample-rate"] == "24000"
    container, rate, seconds = decoded(answer.content)
    assert (container, rate) == ("mp3", 24000) and seconds > 1.0


@pytest.mark.parametrize("fmt,container,content_type", [
    ("mp3", "mp3", "audio/mpeg"), ("opus", "ogg", "audio/opus"), ("aac", "aac", "audio/aac"),
    ("flac", "flac", "audio/flac"), ("wav", "wav", "audio/wav"), ("pcm", "pcm", "audio/pcm")])
@pytest.mark.parametrize("stream", [False, True])
async def test_async_client_every_format(url, fmt, container, content_type, stream):
    """Each format, whole and streamed (``stream`` is this server's extension), decodes to
    the same length of audio."""
    client = _async(url)
    answer = await client.audio.speech.create(
        model="veena", voice="kavya", input="Hello there.", response_format=fmt,
        extra_body={**EXTRA, "stream": stream})
    assert answer.response.headers["content-type"] == content_type
    got, rate, seconds = decoded(answer.content, fmt)
    _, _, reference = decoded((await client.audio.speech.create(
        model="veena", voice="kavya", input="Hello there.", response_format="pcm",
        extra_body=EXTRA)).content, "pcm")
    assert got == container
    assert rate == (48000 if fmt == "opus" else 24000)  # Ogg Opus decodes at 48 kHz
    assert seconds == pytest.approx(reference, abs=0.1)  # codec padding only
    await client.close()


@pytest.mark.parametrize("speed", [2.0, 0.5, 4.0, 0.25])
async def test_speed_stretches_the_audio(url, speed):
    client = _async(url)

    async def seconds(s: float) -> float:
        answer = await client.audio.speech.create(
            model="veena", voice="kavya", input="Hello there.", response_format="wav",
            speed=s, extra_body=EXTRA)
        return decoded(answer.content, "wav")[2]

    normal, stretched = await seconds(1.0), await seconds(speed)
    assert stretched == pytest.approx(normal / speed, rel=0.05, abs=0.05)
    await client.close()


async def test_with_streaming_response_streams_mp3(url):
    """``with_streaming_response`` reads the answer as it is encoded."""
    def run() -> tuple[str, list[bytes]]:
        with _sync(url).audio.speech.with_streaming_response.create(
                model="veena", voice="kavya", input="Hello there.", speed=1.5,
                extra_body={**EXTRA, "stream": True}) as r:
            return r.headers["content-type"], list(r.iter_bytes())

    content_type, chunks = await asyncio.to_thread(run)
    assert content_type == "audio/mpeg" and len(chunks) >= 1
    container, _, seconds = decoded(b"".join(chunks))
    assert container == "mp3" and seconds > 1.0


@pytest.mark.parametrize("fmt", ["mp3", "pcm"])
async def test_sse_events_carry_the_audio(url, fmt):
    """``stream_format="sse"``: ``speech.audio.delta`` events with base64 audio, then one
    ``speech.audio.done`` with usage; the deltas joined are the format's audio."""
    client = _async(url)
    async with client.audio.speech.with_streaming_response.create(
            model="veena", voice="kavya", input="Hello there.", response_format=fmt,
            stream_format="sse", extra_body=EXTRA) as r:
        assert r.headers["content-type"] == "text/event-stream"
        lines = [line async for line in r.iter_lines()]
    events = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done" and set(events[-1]["usage"]) == {
        "input_tokens", "output_tokens", "total_tokens"}
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert decoded(audio, fmt)[2] > 1.0
    await client.close()


@pytest.mark.parametrize("kw,names", [
    ({"response_format": "ogg"}, ["mp3", "opus", "aac", "flac", "wav", "pcm"]),
    ({"stream_format": "json"}, ["audio", "sse"]),
    ({"speed": 5.0}, ["0.25", "4.0"]),
    ({"speed": 0.1}, ["0.25", "4.0"]),
    ({"extra_body": {"speed": True}}, ["0.25", "4.0"]),
    ({"extra_body": {"speed": "fast"}}, ["0.25", "4.0"]),
    ({"instructions": "Speak like a pirate."}, ["instructions", "description"]),
])
async def test_bad_values_are_bad_requests_naming_the_valid_ones(url, kw, names):
    def run():
        return _sync(url).audio.speech.create(model="veena", voice="kavya", input="Hi.", **kw)

    with pytest.raises(openai.BadRequestError) as info:
        await asyncio.to_thread(run)
    error = info.value.body["error"] if "error" in info.value.body else info.value.body
    assert error["code"] == "bad_field"
    for name in names:
        assert name in error["message"], error["message"]


async def test_nan_speed_is_refused(url):
    """JSON has no NaN, but Python's JSON reader takes one: it must not pass as a speed."""
    async with httpx.AsyncClient() as http:
        r = await http.post(url + "/audio/speech", content=b'{"input": "Hi.", "speed": NaN}',
                            headers={"Authorization": f"Bearer {API_KEY}",
                                     "Content-Type": "application/json"})
    assert r.status_code == 400 and "speed" in r.json()["error"]["message"]


async def test_empty_instructions_and_openai_voice_object_are_taken(url):
    """An empty ``instructions`` asks for nothing; ``{"id": name}`` is OpenAI's voice form."""
    client = _async(url)
    answer = await client.audio.speech.create(
        model="veena", voice={"id": "kavya"}, input="Hi.", instructions="",
        response_format="pcm", extra_body=EXTRA)
    await client.close()
    assert np.frombuffer(answer.content, np.int16).size > 0


async def test_null_formats_stand_for_the_defaults(url):
    """Null is absent, as for every optional field: MP3 audio, not events."""
    async with httpx.AsyncClient() as http:
        r = await http.post(url + "/audio/speech",
                            json={"input": "Hi.", "response_format": None,
                                  "stream_format": None, "speed": None, **EXTRA},
                            headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg"
    assert decoded(r.content)[0] == "mp3"
