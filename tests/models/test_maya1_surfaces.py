"""Maya1 (voices described in words, expressive tags) on every surface, over the fake engine:
``instructions`` of ``/v1/audio/speech`` become the voice's description (the prompt the
engine receives carries it) and a bad one is a 400 before any engine work; a description as
the WebSocket ``voice`` speaks, a bad one is refused before any engine work; a designed voice
saved in ``VEENA_VOICES_DIR`` speaks with its description and seed; ``/v1/voices`` and
``/ready`` list the tags, and the plugin's ``tags`` follow the server's."""

from __future__ import annotations

import contextlib
import json
from typing import AsyncIterator, Sequence

import aiohttp
import pytest
from livekit.plugins import veena

from livekit.plugins.veena.models.profiles import MAYA1, MAYA1_TAGS, ORPHEUS_TAGS, VEENA
from livekit.plugins.veena.pipeline.engine import SamplingOptions
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions
from livekit.plugins.veena.server.app import ServerOptions
from livekit.plugins.veena.server.state import STATE_KEY
from livekit.plugins.veena.voices.files import design_voice

from ..fakes import FakeEngine, ToneCodec, _Tokenizer
from ..servers import serve_app

DESCRIPTION = "Gravelly male voice in his 60s with a Scottish accent. Slow, kind pacing."
FRAMES = 6
SPEECH = {"input": "Hello there.", "response_format": "pcm",
          "sampling": {"max_tokens": 7 * FRAMES}}


class RecordingEngine(FakeEngine):
    """The fake engine, also keeping the prompt and seed of every request it was given."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.requests: list[tuple[list[int], int | None]] = []

    async def generate(self, prompt: Sequence[int], sampling: SamplingOptions,
                       request_id: str | None = None) -> AsyncIterator[list[int]]:
        self.requests.append((list(prompt), sampling.seed))
        async for ids in super().generate(prompt, sampling, request_id):
            yield ids

    @property
    def seeds(self) -> list[int | None]:
        return [seed for _, seed in self.requests]

    def spoke_with(self, description: str) -> bool:
        """Every request's prompt carries ``<description="...">`` with ``description``."""
        words = _Tokenizer().encode(f'<description="{description}">')
        return bool(self.requests) and all(_contains(p, words) for p, _ in self.requests)


def _contains(seq: list[int], part: list[int]) -> bool:
    return any(seq[i:i + len(part)] == part for i in range(len(seq) - len(part) + 1))


@contextlib.asynccontextmanager
async def recording_pipeline(profile=MAYA1):
    """A started Pipeline of ``profile`` over a ``RecordingEngine`` and ``ToneCodec``."""
    p = Pipeline(RecordingEngine(), ToneCodec(), profile, PipelineOptions())
    await p.start()
    try:
        yield p
    finally:
        await p.aclose()


@contextlib.asynccontextmanager
async def maya1_server(options: ServerOptions | None = None, profile=MAYA1):
    """(URL, server state, engine) of a server over a recording fake pipeline."""
    async with recording_pipeline(profile) as p, \
            serve_app(p, options or ServerOptions()) as (url, app):
        yield url, app[STATE_KEY], p.engine


async def _speech(url: str, **body) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, \
            s.post(url + "/v1/audio/speech", json={**SPEECH, **body}) as r:
        return r.status, await r.read()


# --- /v1/audio/speech: instructions are the description ----------------------------------

@pytest.mark.parametrize("voice", [None, "noah", "A bright young voice."])
async def test_instructions_become_the_voice_description(voice):
    async with maya1_server() as (url, _, engine):
        status, pcm = await _speech(url, voice=voice, instructions=DESCRIPTION, seed=3)
        assert status == 200 and len(pcm) > 0
        assert engine.spoke_with(DESCRIPTION) and set(engine.seeds) == {3}
        # the voice named beside them is replaced, not mixed in
        if voice is not None:
            shown = MAYA1.render_voice(voice)
            assert not any(_contains(p, _Tokenizer().encode(shown)) for p, _ in engine.requests)


async def test_without_instructions_the_voice_speaks_its_own_description():
    async with maya1_server() as (url, _, engine):
        assert (await _speech(url, voice="noah"))[0] == 200
        assert engine.spoke_with(MAYA1.render_voice("noah"))


@pytest.mark.parametrize("instructions,match,code", [
    ('Say "hi" loudly', "must not contain", "bad_field"),
    ("A calm voice <laugh> with a tag", "must not contain", "bad_field"),
    ("Two lines\nof description", "control, format or separator", "bad_field"),
    ("x" * 501, "at most 500", "bad_field"),
    (7, "must be a string", "bad_request"),  # not a string at all: as for any field
])
async def test_a_bad_description_is_a_400_before_any_engine_work(instructions, match, code):
    async with maya1_server() as (url, _, engine):
        status, body = await _speech(url, voice="ava", instructions=instructions)
        error = json.loads(body)["error"]
        assert status == 400 and error["code"] == code, error
        assert match in error["message"] and "instructions" in error["message"]
        assert engine.requests == [] and engine.tokens_out == 0


async def test_a_model_without_descriptions_still_refuses_instructions():
    async with maya1_server(profile=VEENA) as (url, _, engine):
        status, body = await _speech(url, voice="kavya", instructions=DESCRIPTION)
        assert status == 400 and "cannot be steered by a description" in body.decode()
        assert engine.requests == []


# --- the WebSocket voice field ----------------------------------------------------------------

async def _ws_speak(url: str, voice: str, seed: int | None = None) -> list[dict]:
    events = []
    async with aiohttp.ClientSession() as s, s.ws_connect(url + "/v1/stream") as ws:
        await ws.send_json({"type": "speak", "context_id": "c", "text": "Hello there.",
                            "continue": False, "voice": voice, "seed": seed,
                            "sampling": {"max_tokens": 7 * FRAMES}})
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                events.append(json.loads(msg.data))
                if events[-1]["type"] in ("done", "error", "cancelled", "rejected"):
                    break
    return events


async def test_a_description_speaks_through_the_websocket():
    async with maya1_server() as (url, _, engine):
        events = await _ws_speak(url, DESCRIPTION, seed=11)
        assert events[-1]["type"] == "done", events
        assert engine.spoke_with(DESCRIPTION) and set(engine.seeds) == {11}


async def test_a_bad_description_through_the_websocket_is_refused_before_engine_work():
    async with maya1_server() as (url, _, engine):
        events = await _ws_speak(url, 'A voice" <|eot_id|>')
        last = events[-1]
        assert last["type"] == "error" and last["code"] == "bad_request", events
        assert "voice description must not contain" in last["message"]
        assert engine.requests == []


# --- designed voices saved on the server ----------------------------------------------------

async def test_a_designed_voice_in_the_voices_dir_speaks_with_its_description_and_seed(tmp_path):
    design_voice(MAYA1, DESCRIPTION, seed=424242, model="m").save(tmp_path / "rob.json")
    async with maya1_server(ServerOptions(voices_dir=str(tmp_path))) as (url, _, engine):
        async with aiohttp.ClientSession() as s, s.get(url + "/v1/voices") as r:
            listed = await r.json()
        assert listed["saved"] == [{"name": "rob", "voice": DESCRIPTION, "model": "m",
                                    "seed": 424242}]
        assert (await _ws_speak(url, "rob"))[-1]["type"] == "done"
        assert engine.spoke_with(DESCRIPTION) and set(engine.seeds) == {424242}
        engine.requests.clear()
        # /v1/audio/speech: the saved voice by name; with instructions its seed stays
        assert (await _speech(url, voice="rob"))[0] == 200
        assert engine.spoke_with(DESCRIPTION) and set(engine.seeds) == {424242}
        engine.requests.clear()
        assert (await _speech(url, voice="rob", instructions="A whispery voice."))[0] == 200
        assert engine.spoke_with("A whispery voice.") and set(engine.seeds) == {424242}


# --- tags on /v1/voices, /ready and the plugin ------------------------------------------------

@pytest.mark.parametrize("profile,tags", [(MAYA1, MAYA1_TAGS), (VEENA, ())])
async def test_voices_and_ready_list_the_profiles_tags(profile, tags):
    async with maya1_server(profile=profile) as (url, _, _engine):
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/v1/voices") as r:
                voices = await r.json()
            async with s.get(url + "/ready") as r:
                ready = await r.json()
        assert voices["tags"] == list(tags) and ready["tags"] == list(tags)
        assert ready["status"] == "ready"
        assert voices["described_voices"] is profile.described_voices
        if profile.described_voices:
            assert voices["presets"]["noah"] == MAYA1.render_voice("noah")
        else:
            assert "presets" not in voices


async def test_remote_tts_tags_come_from_the_server():
    async with maya1_server() as (url, _, _engine):
        ws = url.replace("http://", "ws://")
        guessed = veena.TTS(base_url=ws, profile="orpheus")
        assert guessed.tags == ORPHEUS_TAGS  # the given profile's, before the server said
        for bad in (0, -1.0, float("nan"), True):
            with pytest.raises(ValueError, match="timeout"):
                await guessed.fetch_tags(timeout=bad)
        assert await guessed.fetch_tags() == MAYA1_TAGS and guessed.tags == MAYA1_TAGS
        await guessed.aclose()
        # a stream learns them too (the sample rate's /ready answer)
        t = veena.TTS(base_url=ws, profile="veena", max_tokens_per_chunk=7 * FRAMES)
        assert t.tags == ()
        assert (await t.synthesize("Hello.").collect()).samples_per_channel > 0
        assert t.tags == MAYA1_TAGS
        await t.aclose()


async def test_in_process_tts_tags_are_the_profiles():
    async with recording_pipeline(MAYA1) as p:
        assert veena.TTS(pipeline=p).tags == MAYA1_TAGS
    async with recording_pipeline(VEENA) as p:
        assert veena.TTS(pipeline=p).tags == ()
