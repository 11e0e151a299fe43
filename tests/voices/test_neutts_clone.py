"""A NeuTTS voice is a reference: ``veena-tts voice clone CLIP --text ...`` encodes the clip
with NeuCodec's encoder (tiny random weights, the real loading code) and writes its codes
and transcript; every way a clone can be wrong is a clear error (exit 2 / ValueError). No
engine starts."""

import io
import json
import wave

import numpy as np
import pytest

from livekit.plugins.veena import cli
from livekit.plugins.veena.models.loading import load_pipeline
from livekit.plugins.veena.models.profiles import NEUTTS
from livekit.plugins.veena.voices.call_voice import resolve_voice, voice_file_at
from livekit.plugins.veena.voices.files import VoiceFileError, clone_voice, load_voice
from livekit.plugins.veena.voices.reference_clip import ReferenceClipError

SAID = "This is the reference clip, read aloud."


def wav_bytes(seconds: float, rate: int = 24000, level: float = 0.3) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    x = level * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((x * 32767).astype(np.int16).tobytes())
    return buf.getvalue()


@pytest.fixture(scope="module")
def model_dir(tiny_neutts_dir) -> str:
    """The tiny NeuTTS model: its NeuCodec checkpoint has the encoder's tensors and a tiny
    w2v-bert-2.0 beside them."""
    return tiny_neutts_dir


@pytest.fixture(scope="module")
def pipeline(model_dir):
    return load_pipeline(model_dir)  # the engine is never started


def test_voice_clone_writes_codes_and_transcript(model_dir, pipeline, tmp_path):
    clip = tmp_path / "clip.wav"
    clip.write_bytes(wav_bytes(2.0))
    out = tmp_path / "me.json"
    assert cli.main(["voice", "clone", str(clip), "--text", f"  {SAID}\n", "--model", model_dir,
                     "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["profile"] == "neutts" and data["voice"] == SAID
    # the encoder's own codes of the same clip (24 kHz, resampled to its 16 kHz)
    from livekit.plugins.veena.models.loading import speaker_encoder
    from livekit.plugins.veena.voices.reference_clip import load_reference_clip

    encoder = speaker_encoder(pipeline)
    want = encoder.encode(load_reference_clip(clip.read_bytes(), 16000).samples)
    assert data["speaker_globals"] == want and len(want) == 100  # 2 s at 50 codes/s
    voice = resolve_voice(NEUTTS, str(out), lookup=voice_file_at(NEUTTS))
    assert (voice.voice, voice.speaker_globals) == (SAID, tuple(want))


def test_voice_clone_without_its_transcript_exits_2(model_dir, tmp_path, caplog):
    clip = tmp_path / "clip.wav"
    clip.write_bytes(wav_bytes(2.0))
    code = cli.main(["voice", "clone", str(clip), "--model", model_dir, "-o",
                     str(tmp_path / "x.json")])
    assert code == 2 and "word for word (--text)" in caplog.text
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("wav, why", [
    (wav_bytes(0.5), "too_short"), (wav_bytes(31.0, rate=8000), "too_long"),
    (wav_bytes(2.0, level=0.0), "silent"), (b"not audio at all", "not_wav"),
])
async def test_a_bad_clip_is_refused(pipeline, wav, why):
    with pytest.raises(ReferenceClipError) as e:
        await clone_voice(pipeline, wav, text=SAID)
    assert e.value.reason == why


@pytest.mark.parametrize("text", [None, "", "   ", "bad\x07bell", "x" * 1001])
async def test_a_bad_transcript_is_refused_before_any_encoding(pipeline, text):
    with pytest.raises(ValueError):
        await clone_voice(pipeline, wav_bytes(2.0), text=text)


def test_a_voice_file_without_its_codes_or_text_is_refused(tmp_path):
    path = tmp_path / "v.json"
    base = {"format_version": 1, "profile": "neutts", "model": "m"}
    path.write_text(json.dumps({**base, "voice": SAID}))
    with pytest.raises(VoiceFileError):
        load_voice(path, NEUTTS)
    path.write_text(json.dumps({**base, "voice": "", "speaker_globals": list(range(60))}))
    with pytest.raises(ValueError, match="transcript"):
        resolve_voice(NEUTTS, str(path), lookup=voice_file_at(NEUTTS))
    path.write_text(json.dumps({**base, "voice": SAID, "speaker_globals": [70000] * 60}))
    with pytest.raises(VoiceFileError):
        load_voice(path, NEUTTS)


@pytest.mark.parametrize("voice, why", [
    ("just some words", "reference clip's codes and transcript"),  # a transcript, no codes
    ("missing.json", "no voice file"),
])
def test_say_refuses_a_voice_that_is_not_a_reference_before_any_engine_work(
        model_dir, tmp_path, caplog, voice, why):
    given = str(tmp_path / voice) if voice.endswith(".json") else voice
    code = cli.main(["say", "Hello.", "--model", model_dir, "--voice", given,
                     "-o", str(tmp_path / "a.wav")])
    assert code == 2 and why in caplog.text
    assert not (tmp_path / "a.wav").exists()
