"""NeuTTS on the server's surfaces, over a scripted engine and the real tiny NeuCodec (its
encoder too): ``POST /v1/voices?name=...&text=...`` clones a voice from a clip and what it
says; the OpenAI route and the WebSocket then speak it by name at 24 kHz; the OpenAI route
speaks a saved NeuTTS voice in each of its formats (streamed or not) at 24 kHz, the same
audio as its WAV; a clone without its transcript, an unknown voice and a reference too long
for the context are HTTP 400s."""

import io
import json
import shutil
import wave
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from livekit.plugins.veena.codecs.neucodec import NeuCodecCodec
from livekit.plugins.veena.models.profiles import NEUTTS
from livekit.plugins.veena.pipeline.guards import GuardOptions
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions
from livekit.plugins.veena.server.app import ServerOptions
from livekit.plugins.veena.server.audio_formats import AUDIO_FORMATS
from livekit.plugins.veena.voices.files import VoiceFile

from ..fakes import ScriptedEngine
from ..helpers import same_audio
from ..servers import serve
from ..voices.test_neutts_clone import wav_bytes
from .test_audio_formats import decode

GOLDEN_CODEC = Path(__file__).parents[1] / "golden" / "neucodec"
SAID = "This is the reference clip, read aloud."
REFERENCE = tuple(int(c) for c in np.random.default_rng(5).integers(0, 65536, 120))


@pytest.fixture
def tokenizer(neutts_tokenizer):
    return neutts_tokenizer


@pytest.fixture
async def server(tokenizer, tmp_path):
    base = tokenizer.convert_tokens_to_ids("<|speech_0|>")
    end = tokenizer.convert_tokens_to_ids("<|SPEECH_GENERATION_END|>")
    codes = np.random.default_rng(1).integers(0, 65536, 60)
    engine = ScriptedEngine([[base + int(c) for c in codes] + [end]], delta=5)
    engine.tokenizer = tokenizer
    codec_dir = tmp_path / "neucodec"
    shutil.copytree(GOLDEN_CODEC, codec_dir)
    p = Pipeline(engine, NeuCodecCodec.load(str(codec_dir)), NEUTTS,
                 PipelineOptions(freeze_gc_heap=False, guards=GuardOptions(silence_s=0.0)))
    p.codec_model = str(codec_dir)  # where its encoder is read (load_pipeline sets it)
    async with serve(p, ServerOptions(voices_dir=str(tmp_path / "voices"))) as url:
        yield url, engine
    await p.aclose()


async def test_clone_by_name_then_speak_it_over_openai_and_websocket(server):
    url, engine = server
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/voices", data=wav_bytes(2.0),
                          params={"name": "me", "text": SAID}) as r:
            assert r.status == 200, await r.text()
            body = await r.json()
        assert body["voice"] == SAID and len(body["speaker_globals"]) == 100
        async with s.post(f"{url}/v1/audio/speech", json={
                "model": "neutts", "input": "Hello over HTTP.", "voice": "me",
                "response_format": "wav"}) as r:
            assert r.status == 200, await r.text()
            data = await r.read()
        with wave.open(io.BytesIO(data)) as w:
            assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
            assert w.getnframes() == 60 * 480
        start = engine.tokenizer.convert_tokens_to_ids("<|SPEECH_GENERATION_START|>")
        prompt = engine.requests[-1][1]
        base = engine.tokenizer.convert_tokens_to_ids("<|speech_0|>")
        assert prompt[prompt.index(start) + 1:] == [base + c for c in body["speaker_globals"]]
        async with s.ws_connect(url.replace("http://", "ws://") + "/v1/stream") as ws:
            await ws.send_json({"type": "speak", "context_id": "a", "text": "Hello there.",
                                "voice": "me", "continue": False})
            audio, done = 0, None
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY:  # [1][b"a"][int16 PCM]
                    assert msg.data[:2] == b"\x01a"
                    audio += len(msg.data) - 2
                else:
                    event = json.loads(msg.data)
                    if event["type"] in ("done", "cancelled", "error"):
                        done = event
                        break
        assert done["type"] == "done", done
        assert audio == 60 * 480 * 2  # int16 PCM at 24 kHz
        ws_prompt = engine.requests[-1][1]
        assert ws_prompt[ws_prompt.index(start) + 1:] == prompt[prompt.index(start) + 1:]
        async with s.get(f"{url}/metrics") as r:  # the server's metrics count NeuTTS streams
            m = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                 for line in (await r.text()).splitlines() if line and line[0] != "#"}
        assert m['veena_requests_total{outcome="done"}'] == 2  # the OpenAI route and the socket
        assert m["veena_first_audio_seconds_count"] == 2 and m["veena_first_audio_seconds_sum"] > 0
        assert m["veena_active_streams"] == 0


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("fmt", [f for f in AUDIO_FORMATS if f != "wav"])
async def test_a_saved_voice_speaks_in_every_openai_format(server, tmp_path, fmt, stream):
    """Each of the route's formats (``wav`` is the test above) for a NeuTTS voice: its
    content type, 24 kHz (an Ogg Opus stream always decodes at 48 kHz), the 60 scripted
    steps' 1.2 s, and the WAV's samples (``pcm`` and lossless ``flac``: within the bounds
    of two decodes of the same tokens, ``same_audio``); the lossy ones their length within
    their codec padding (an MP3's or AAC's priming frames) and its loudness."""
    url, engine = server
    VoiceFile("neutts", "tiny", SAID, REFERENCE).save(tmp_path / "voices" / "me.json")
    start = engine.tokenizer.convert_tokens_to_ids("<|SPEECH_GENERATION_START|>")
    base = engine.tokenizer.convert_tokens_to_ids("<|speech_0|>")
    async with aiohttp.ClientSession() as s:
        bodies = {}
        for f in ("wav", fmt):
            async with s.post(f"{url}/v1/audio/speech", json={
                    "model": "neutts", "input": "Hello over HTTP.", "voice": "me",
                    "response_format": f, "stream": stream}) as r:
                assert r.status == 200, await r.text()
                assert r.headers["Content-Type"] == AUDIO_FORMATS[f].content_type
                bodies[f] = await r.read()
            prompt = engine.requests[-1][1]  # the saved voice's reference, continued
            assert prompt[prompt.index(start) + 1:] == [base + c for c in REFERENCE]
    with wave.open(io.BytesIO(bodies["wav"])) as w:
        assert w.getframerate() == 24000
    wav, _ = decode(bodies["wav"], "wav", 24000)
    assert len(wav) == 60 * 480
    got, rate = decode(bodies[fmt], fmt, 24000)
    assert rate == (48000 if fmt == "opus" else 24000)
    if fmt in ("pcm", "flac"):
        assert same_audio(got, wav)
    else:
        assert len(got) / rate == pytest.approx(len(wav) / 24000, abs=0.1)
        # PyAV decodes these as floats of full scale 1.0: as loud as the WAV, not silence
        loudness = np.sqrt(np.mean(got**2)) / np.sqrt(np.mean((wav / 32768) ** 2))
        assert 0.5 < loudness < 2, loudness


@pytest.mark.parametrize("params, code", [
    ({"name": "x"}, "cannot_clone"),  # no transcript
    ({"name": "x", "text": "   "}, "cannot_clone"),
])
async def test_a_clone_without_its_transcript_is_a_400(server, params, code):
    url, _ = server
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/voices", data=wav_bytes(2.0), params=params) as r:
            assert r.status == 400 and (await r.json())["error"]["code"] == code


async def test_unknown_voice_and_a_reference_too_long_are_400s(server, tmp_path):
    url, _ = server
    voices = tmp_path / "voices"
    voices.mkdir(exist_ok=True)
    (voices / "long.json").write_text(json.dumps({
        "format_version": 1, "profile": "neutts", "model": "m",
        "voice": ("A long transcript of the reference clip, " * 24).strip(),
        "speaker_globals": [7] * 720}))
    async with aiohttp.ClientSession() as s:
        for voice in ("nobody", "long"):
            async with s.post(f"{url}/v1/audio/speech", json={
                    "model": "neutts", "input": "Hello.", "voice": voice}) as r:
                body = await r.json()
                assert r.status == 400, (voice, body)
                if voice == "long":
                    assert "context tokens" in body["error"]["message"]
