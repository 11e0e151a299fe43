"""A voice from a reference clip (BiCodec's speaker path, random weights in the official
layout): the clip is checked and converted, every encoder tensor is loaded by name, the same
clip gives the same 32 ids, and a stream speaks with exactly those globals and no speaker
prompt; through the command line and through the server (tests/server/test_voice_upload.py)."""

import io
import shutil
import struct
import wave
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from livekit.plugins.veena import cli
from livekit.plugins.veena.codecs.bicodec_speaker import PREFIXES, BiCodecSpeakerEncoder
from livekit.plugins.veena.codecs.speaker_frontend import (
    MelSpectrogram,
    _hz_to_mel,
    _mel_to_hz,
    reference_segment,
    volume_normalize,
)
from livekit.plugins.veena.models.profiles import CLONED_VOICE, VEENA3
from livekit.plugins.veena.voices.files import clone_voice, load_voice
from livekit.plugins.veena.voices.reference_clip import (
    ReferenceClipError,
    load_reference_clip,
)

from ..helpers import record_voices


def wav_bytes(samples: np.ndarray, rate: int, width: int = 2) -> bytes:
    """PCM WAV through the standard library; ``samples`` float [frames] or [frames, ch]."""
    samples = np.asarray(samples, np.float64)
    frames = samples if samples.ndim == 2 else samples[:, None]
    scale = float(1 << (8 * width - 1)) - 1
    ints = np.round(np.clip(frames, -1, 1) * scale).astype(np.int64)
    if width == 1:
        raw = (ints + 128).astype(np.uint8).tobytes()
    elif width == 3:
        raw = b"".join(int(v).to_bytes(3, "little", signed=True) for v in ints.ravel())
    else:
        raw = ints.astype(f"<i{width}").tobytes()
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(frames.shape[1])
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(raw)
    return buf.getvalue()


def float_wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    data = np.asarray(samples, "<f4").tobytes()
    return struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", 36 + len(data), b"WAVE", b"fmt ", 16, 3, 1,
                       rate, rate * 4, 4, 32, b"data", len(data)) + data


def speech_like(seconds: float, rate: int = 16000, f0: float = 180.0, seed: int = 0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    voiced = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 8))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)
    return (0.2 * voiced * envelope + 0.01 * rng.normal(size=len(t))).astype(np.float32)


# -- the clip ---------------------------------------------------------------------------------
def test_mel_filter_bank_puts_a_tone_in_its_band():
    mel = MelSpectrogram(16000, 1024, 640, 320, 10, None, 128)
    for hz in (300.0, 1000.0, 4000.0):
        t = np.arange(16000) / 16000
        spec = mel(torch.from_numpy(np.sin(2 * np.pi * hz * t).astype(np.float32))[None])
        assert spec.shape == (1, 128, 51)  # centred frames: 1 + 16000 / 320
        peak = int(spec[0, :, 25].argmax())
        centres = _mel_to_hz(np.linspace(_hz_to_mel(10), _hz_to_mel(8000), 130))[1:-1]
        assert centres[max(0, peak - 1)] <= hz <= centres[min(127, peak + 1)], (hz, peak)


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_pcm_wavs_of_any_width_rate_and_channels(width):
    left = speech_like(2.0, 44100)
    clip = load_reference_clip(wav_bytes(np.stack([left, left * 0.5], 1), 44100, width), 16000)
    assert clip.sample_rate == 16000 and clip.source_rate == 44100 and clip.source_channels == 2
    assert clip.samples.dtype == np.float64 and abs(len(clip.samples) - 32000) <= 16
    # channel 0 (as Spark-TTS reads it, not a mix), resampled: the left channel's level
    ratio = np.sqrt(np.mean(clip.samples**2)) / np.sqrt(np.mean(left**2))
    assert 0.97 < ratio < 1.03


def test_clip_is_not_clipped():
    """Float samples above full scale pass as they are (Spark never clips; its volume rule
    scales the clip back under 1)."""
    loud = speech_like(1.5) * 8.0
    clip = load_reference_clip(float_wav_bytes(loud, 16000), 16000)
    assert np.abs(clip.samples).max() > 1.0
    assert np.abs(volume_normalize(clip.samples)).max() <= 1.0


def test_quiet_clip_keeps_its_pre_rescale_magnitudes():
    """Spark's rule for a clip peaking under 0.1: raise it to a 0.1 peak, but measure the loud
    tail on the magnitudes from before the rise, so the clip is scaled as if it were still
    quiet (louder than a re-measured one)."""
    quiet = speech_like(3.0).astype(np.float64) * 0.05 / np.abs(speech_like(3.0)).max()
    mags = np.sort(np.abs(quiet))
    loud = mags[mags > 0.01]
    volume = np.mean(loud[int(0.9 * len(loud)):int(0.99 * len(loud))])
    raised = quiet / mags[-1] * 0.1
    want = raised * np.clip(0.2 / volume, 0.1, 10)
    want = want / np.abs(want).max() if np.abs(want).max() > 1 else want
    assert np.allclose(volume_normalize(quiet), want, rtol=1e-12)


def test_float_wav():
    clip = load_reference_clip(float_wav_bytes(speech_like(1.5), 16000), 16000)
    assert len(clip.samples) == 24000 and clip.source_channels == 1


@pytest.mark.parametrize("data,reason", [
    (b"", "empty"),
    (b"ID3\x04\x00" + b"\x00" * 100, "not_wav"),
    (b"RIFF\x10\x00\x00\x00WAVEjunk", "not_wav"),
    (wav_bytes(speech_like(0.5), 16000), "too_short"),
    (wav_bytes(speech_like(31.0, 8000), 8000), "too_long"),
    (wav_bytes(np.zeros(32000), 16000), "silent"),
    (wav_bytes(np.zeros((0,)), 16000), "empty"),
    # finite but absurd float samples: soxr overflowed and every id came out -2**63, which
    # the client heard as "cannot_clone" (a SNAC model, or no speaker encoder)
    (float_wav_bytes(np.full(32000, 1e30), 44100), "unsupported"),
])
def test_bad_clips_are_refused_with_a_reason(data, reason):
    with pytest.raises(ReferenceClipError) as e:
        load_reference_clip(data, 16000)
    assert e.value.reason == reason


# -- the encoder --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bicodec_dir(tiny_spark_dir) -> Path:
    return Path(tiny_spark_dir) / "BiCodec"


@pytest.fixture(scope="module")
def encoder(bicodec_dir) -> BiCodecSpeakerEncoder:
    torch.set_num_threads(2)
    return BiCodecSpeakerEncoder.load(str(bicodec_dir))


def test_every_encoder_tensor_is_loaded_by_its_official_name(encoder, bicodec_dir):
    state = load_file(str(bicodec_dir / "model.safetensors"))
    ours = encoder.model.state_dict()
    wanted = [k for k in state if k.startswith(PREFIXES)]
    assert len(wanted) == len(ours) > 200
    for key in wanted:
        assert torch.equal(ours[key], state[key]), key
    for key in ("speaker_encoder.speaker_encoder.layer2.se_res2block.1.convs.6.weight",
                "speaker_encoder.perceiver_sampler.layers.1.1.2.weight",
                "speaker_encoder.perceiver_sampler.norm.gamma",
                "speaker_encoder.quantizer.project_in.weight"):
        assert key in wanted


def test_a_missing_encoder_tensor_is_an_error(bicodec_dir, tmp_path):
    folder = tmp_path / "BiCodec"
    folder.mkdir()
    shutil.copy(bicodec_dir / "config.yaml", folder / "config.yaml")
    state = load_file(str(bicodec_dir / "model.safetensors"))
    del state["speaker_encoder.perceiver_sampler.layers.0.0.to_kv.weight"]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="lacks speaker-encoder tensors"):
        BiCodecSpeakerEncoder.load(str(folder))


def test_same_clip_same_ids_in_range(encoder):
    clip = speech_like(10.0)
    ids = encoder.encode(clip)
    assert ids == encoder.encode(clip.copy())
    assert len(ids) == 32 and all(isinstance(i, int) and 0 <= i < 4096 for i in ids)
    other = encoder.encode(speech_like(10.0, f0=90.0, seed=5) * 0.3 + speech_like(10.0, f0=300.0))
    assert other != ids


def test_work_is_bounded_by_the_reference_segment():
    """Any clip becomes Spark-TTS's 6 s reference segment (tiled if shorter), so the encoder
    does the same work for a 1 s or a 30 s upload."""
    for seconds in (1.2, 6.0, 30.0):
        seg = reference_segment(speech_like(seconds), 16000, 6.0, 320)
        assert len(seg) == 96000
    short = speech_like(1.2)
    assert np.array_equal(reference_segment(short, 16000, 6.0, 320)[:len(short)], short)


# -- speaking with it ---------------------------------------------------------------------------
@pytest.mark.engine
async def test_clone_then_speak_with_exactly_those_globals(spark_pipeline, tmp_path):
    p = spark_pipeline
    saved = await clone_voice(p, wav_bytes(speech_like(3.0, 22050), 22050), model="tiny")
    assert saved.voice == CLONED_VOICE and len(saved.speaker_globals) == 32
    path = saved.save(tmp_path / "clone.json")
    again = load_voice(path, VEENA3)
    assert again == saved
    syn = p.synthesize("एक छोटा वाक्य।", voice=again.voice, speaker_globals=again.speaker_globals,
                       seed=3, sampling=replace(p.sampling.defaults(), max_tokens=100))
    pcm = await syn.collect()
    assert len(pcm) > 0 and len(syn.vllm_request_ids) == 1  # no capture request: globals given
    assert syn.tracks[0].framer.globals_ == list(saved.speaker_globals)
    prompt = p.family.prompt(p.engine.tokenizer, "x", CLONED_VOICE, saved.speaker_globals)
    speaker = p.engine.tokenizer.convert_tokens_to_ids("<|start_speaker|>")
    assert speaker not in prompt  # only the globals condition the model


@pytest.mark.engine
def test_a_cloned_voice_needs_its_globals(spark_pipeline):
    with pytest.raises(ValueError, match="needs its speaker globals"):
        spark_pipeline.synthesize("hello", voice=CLONED_VOICE)


def test_cli_clone(tiny_spark_dir, tiny_model_dir, tmp_path, capsys):
    ref = tmp_path / "ref.wav"
    ref.write_bytes(wav_bytes(speech_like(4.0), 16000))
    out = tmp_path / "v.json"
    assert cli.main(["voice", "clone", str(ref), "-o", str(out), "--model", tiny_spark_dir]) == 0
    saved = load_voice(out, VEENA3)
    assert saved.voice == CLONED_VOICE
    assert cli.main(["voice", "clone", str(ref), "-o", str(tmp_path / "w.json"),
                     "--model", tiny_spark_dir]) == 0
    assert load_voice(tmp_path / "w.json", VEENA3) == saved  # deterministic
    short = tmp_path / "short.wav"
    short.write_bytes(wav_bytes(speech_like(0.4), 16000))
    assert cli.main(["voice", "clone", str(short), "-o", str(tmp_path / "x.json"),
                     "--model", tiny_spark_dir]) == 2
    assert cli.main(["voice", "clone", str(ref), "-o", str(tmp_path / "y.json"),
                     "--model", tiny_model_dir]) == 2  # a SNAC model has no speaker encoder
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "y.json").exists()
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.engine
async def test_plugin_speaks_a_cloned_voice_file_in_process_and_remote(spark_pipeline, tmp_path,
                                                                       monkeypatch):
    from livekit.plugins import veena

    from livekit.plugins.veena.server.app import ServerOptions

    from ..servers import serve

    saved = await clone_voice(spark_pipeline, wav_bytes(speech_like(2.0), 16000), model="tiny")
    path = saved.save(tmp_path / "guest.json")
    with pytest.raises(ValueError, match="cloned voice"):
        veena.TTS(pipeline=spark_pipeline, voice=CLONED_VOICE)  # "" alone has no globals
    given = record_voices(monkeypatch, spark_pipeline)
    t = veena.TTS(pipeline=spark_pipeline, voice=str(path), max_tokens_per_chunk=30)
    frame = await t.synthesize("यह एक वाक्य है।").collect()
    assert frame.samples_per_channel > 0
    async with serve(spark_pipeline, ServerOptions()) as url:
        remote = veena.TTS(base_url=url.replace("http://", "ws://"), profile="veena3",
                           voice=str(path), max_tokens_per_chunk=30)
        frame = await remote.synthesize("यह एक वाक्य है।").collect()
        assert frame.samples_per_channel > 0
        await remote.aclose()
    assert len(given) >= 2 and all(g == (CLONED_VOICE, saved.speaker_globals) for g in given)
