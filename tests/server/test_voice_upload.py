"""POST /v1/voices: a WAV reference clip in, a voice file out. Every bad upload is a 4xx
with a JSON body and the server stays healthy; a good one (raw body or multipart form) gives
32 globals, and with ?name= it is saved and speakable by that name."""

import json
import struct

import aiohttp
import numpy as np
import pytest

from livekit.plugins.veena.models.profiles import CLONED_VOICE, VEENA3
from livekit.plugins.veena.protocol import speak_message
from livekit.plugins.veena.server.app import ServerOptions
from livekit.plugins.veena.voices.files import load_voice

from ..servers import serve
from ..voices.test_voice_clone import speech_like, wav_bytes

pytestmark = pytest.mark.engine


async def _post(s, url, data, **kw):
    async with s.post(f"{url}/v1/voices", data=data, **kw) as r:
        return r.status, await r.json()


@pytest.mark.parametrize("data,status,code", [
    (b"", 400, "empty_audio"),
    (b"<html>not audio</html>", 415, "not_wav"),
    (wav_bytes(speech_like(0.5), 16000), 400, "audio_too_short"),
    (wav_bytes(speech_like(31.0, 8000), 8000), 400, "audio_too_long"),
    (wav_bytes(np.zeros(32000), 16000), 400, "silent_audio"),
    (b"x" * 5000, 415, "not_wav"),
    (b"RIFF\x00\x00\x00\x00WAVEfmt \x10\x00\x00\x00"  # MS ADPCM: a real WAV we do not read
     + struct.pack("<HHIIHH", 2, 1, 16000, 8000, 256, 4) + b"data\x00\x00\x00\x00", 415,
     "unsupported_audio"),
])
async def test_bad_uploads_are_4xx_and_the_server_stays_healthy(spark_pipeline, data, status, code):
    async with serve(spark_pipeline, ServerOptions(max_voice_upload_bytes=4000 * 1024)) as url, \
            aiohttp.ClientSession() as s:
        got, body = await _post(s, url, data, headers={"Content-Type": "audio/wav"})
        assert (got, body["error"]["code"], body["error"]["retryable"]) == (status, code, False)
        assert body["error"]["message"]
        async with s.get(f"{url}/health") as r:
            assert r.status == 200


async def test_upload_limit_is_413(spark_pipeline):
    async with serve(spark_pipeline, ServerOptions(max_voice_upload_bytes=10_000)) as url, \
            aiohttp.ClientSession() as s:
        got, body = await _post(s, url, wav_bytes(speech_like(2.0), 16000))
        assert got == 413 and body["error"]["code"] == "upload_too_large"


async def test_clone_by_upload_then_speak_by_name(spark_pipeline, tmp_path):
    clip = wav_bytes(speech_like(3.0, 24000), 24000)
    async with serve(spark_pipeline, ServerOptions(voices_dir=str(tmp_path))) as url, \
            aiohttp.ClientSession() as s:
        got, raw = await _post(s, url, clip, headers={"Content-Type": "audio/wav"})
        assert got == 200 and raw["voice"] == CLONED_VOICE and len(raw["speaker_globals"]) == 32
        form = aiohttp.FormData()
        form.add_field("file", clip, filename="ref.wav", content_type="audio/wav")
        got, named = await _post(s, url, form, params={"name": "guest"})
        assert got == 200 and named["name"] == "guest"
        assert named["speaker_globals"] == raw["speaker_globals"]  # same clip, same voice
        assert load_voice(tmp_path / "guest.json", VEENA3).speaker_globals == tuple(raw["speaker_globals"])
        got, again = await _post(s, url, clip, params={"name": "guest"})
        assert got == 409 and again["error"]["code"] == "voice_exists"
        got, bad = await _post(s, url, clip, params={"name": "../etc"})
        assert got == 400 and bad["error"]["code"] == "bad_field"
        async with s.get(f"{url}/v1/voices") as r:
            assert "guest" in [v["name"] for v in (await r.json())["saved"]]
        async with s.ws_connect(url.replace("http://", "ws://") + "/v1/stream") as ws:
            await ws.send_json(speak_message("c", "नमस्ते।", False, {
                "voice": "guest", "seed": 1, "sampling": {"max_tokens": 30}}))
            audio, end = 0, None
            while end is None:
                msg = await ws.receive(timeout=600)
                if msg.type == aiohttp.WSMsgType.BINARY:
                    audio += len(msg.data)
                else:
                    event = json.loads(msg.data)
                    if event["type"] in ("done", "error"):
                        end = event
            assert end["type"] == "done" and audio > 0


async def test_a_snac_server_cannot_clone(pipeline):
    async with serve(pipeline, ServerOptions()) as url, aiohttp.ClientSession() as s:
        got, body = await _post(s, url, wav_bytes(speech_like(2.0), 16000))
        assert got == 400 and body["error"]["code"] == "cannot_clone"


async def test_a_cloned_voice_without_its_globals_is_refused(spark_pipeline):
    async with serve(spark_pipeline, ServerOptions()) as url, aiohttp.ClientSession() as s:
        async with s.ws_connect(url.replace("http://", "ws://") + "/v1/stream") as ws:
            await ws.send_json(speak_message("c", "नमस्ते।", False, {"voice": CLONED_VOICE}))
            for _ in range(100_000):  # keep-alives until the answer: a hang guard only
                event = json.loads((await ws.receive(timeout=60)).data)
                if event["type"] not in ("waiting", "voice", "words"):
                    break
        assert event["type"] == "error" and event["retryable"] is False
        assert "cloned voice" in event["message"]
