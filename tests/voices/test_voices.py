"""Saved voices: capture -> file -> every later stream decodes with exactly those globals
(in-process, through the server by name, and from the command line's checks); a file for
another profile, a wrong count, out-of-range ids or bad JSON is a clear error before any
engine work."""

import json
import re

import aiohttp
import pytest
from livekit.plugins import veena

from livekit.plugins.veena import cli
from livekit.plugins.veena.models import loading
from livekit.plugins.veena.models.profiles import VEENA, VEENA3
from livekit.plugins.veena.server.app import ServerOptions
from livekit.plugins.veena.voices.files import (
    FORMAT_VERSION,
    VoiceFile,
    VoiceFileError,
    capture_voice,
    load_voice,
)

from ..helpers import record_voices
from ..servers import serve

GOOD = {"format_version": FORMAT_VERSION, "profile": "veena3", "model": "m", "voice": "kavya",
        "speaker_globals": list(range(100, 132))}


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize("data,match", [
    ("{not json", "not valid JSON"),
    ([1, 2], "JSON object"),
    ({**GOOD, "format_version": 2}, "format_version"),
    ({**GOOD, "profile": "veena"}, "profile"),
    ({**GOOD, "speaker_globals": list(range(31))}, "exactly 32"),
    ({**GOOD, "speaker_globals": [4096] * 32}, r"\[0, 4095\]"),
    ({**GOOD, "speaker_globals": [1.0] * 32}, "integer"),
    ({**GOOD, "voice": "nobody"}, "unknown voice"),
    ({**GOOD, "model": 3}, "model"),
])
def test_bad_voice_files_are_clear_errors_before_any_engine_work(tmp_path, data, match,
                                                                  monkeypatch, caplog):
    path = _write(tmp_path, "bad.json", data)
    with pytest.raises(VoiceFileError, match=match):
        load_voice(path, VEENA3)
    with pytest.raises(ValueError, match=match):  # the plugin refuses it at construction
        veena.TTS(base_url="ws://127.0.0.1:9", profile="veena3", voice=str(path))
    # the command line: the voice file's own error (exit 2), and no pipeline was ever built
    built = []
    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **kw: built.append(a))
    (tmp_path / "model").mkdir()
    assert cli.main(["say", "hi", "--voice", str(path), "--model", str(tmp_path / "model"),
                     "--profile", "veena3", "-o", str(tmp_path / "x.wav")]) == 2
    assert not built
    assert any(re.search(match, r.getMessage()) for r in caplog.records if r.levelname == "ERROR")


def test_a_snac_profile_takes_no_voice_file(tmp_path):
    path = _write(tmp_path, "v.json", {**GOOD, "profile": "veena"})
    with pytest.raises(VoiceFileError, match="speaker_globals"):
        load_voice(path, VEENA)
    assert VoiceFile(**{**GOOD, "speaker_globals": tuple(GOOD["speaker_globals"])}).save(
        tmp_path / "ok.json").is_file()


@pytest.mark.engine
async def test_capture_save_and_speak_with_exactly_those_globals(spark_pipeline, tmp_path,
                                                                 monkeypatch):
    saved = await capture_voice(spark_pipeline, "नमस्ते।", "arjun", seed=5)
    path = saved.save(tmp_path / "arjun.json")
    assert load_voice(path, VEENA3) == saved and len(saved.speaker_globals) == 32
    given = record_voices(monkeypatch, spark_pipeline)
    t = veena.TTS(pipeline=spark_pipeline, voice=str(path), max_tokens_per_chunk=40,
                  voice_scope="turn")  # a voice file pins the voice in either scope
    assert t.speaker_globals == saved.speaker_globals
    for _ in range(2):
        stream = t.stream()
        stream.push_text("यह एक वाक्य है।")
        stream.end_input()
        assert sum([ev.frame.samples_per_channel async for ev in stream]) > 0
        assert stream.speaker_globals == saved.speaker_globals
        await stream.aclose()
    assert given and all(g == ("arjun", saved.speaker_globals) for g in given)
    given.clear()
    async with serve(spark_pipeline, ServerOptions(voices_dir=str(tmp_path))) as url:
        async with aiohttp.ClientSession() as s, s.get(url + "/v1/voices") as r:
            listing = await r.json()
        assert listing["saved"] == [{"name": "arjun", "voice": "arjun", "model": saved.model}]
        remote = veena.TTS(base_url=url.replace("http://", "ws://"), profile="veena3",
                           voice="arjun", max_tokens_per_chunk=40)
        frame = await remote.synthesize("यह एक वाक्य है।").collect()
        assert frame.samples_per_channel > 0
        await remote.aclose()
    assert given and all(g == ("arjun", saved.speaker_globals) for g in given)
