"""The speech route's encoders, without a server: every format decodes back (PyAV) at the
rate it declares and with the audio's length, in any chunking; ``speed`` changes the length
and keeps the pitch."""

import io

import av
import numpy as np
import pytest

from livekit.plugins.veena.server.audio_formats import (
    AUDIO_FORMATS,
    AudioEncoder,
    atempo_stages,
    complete_wav,
)

RATE = 24000


def sine(freq: float, seconds: float, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * freq * t) * 12000).astype(np.int16)


def encode(fmt: str, pcm: np.ndarray, speed: float = 1.0, chunk: int = 2048) -> tuple[bytes, int]:
    enc = AudioEncoder(AUDIO_FORMATS[fmt], RATE, speed)
    out = b"".join(enc.encode(pcm[i:i + chunk].tobytes()) for i in range(0, len(pcm), chunk))
    return out + enc.finish(), enc.sample_rate


def decode(data: bytes, fmt: str, rate: int) -> tuple[np.ndarray, int]:
    """Mono float samples and their rate (a pcm body is raw 16-bit at ``rate``)."""
    if fmt == "pcm":
        return np.frombuffer(data, np.int16).astype(np.float32), rate
    with av.open(io.BytesIO(data)) as c:
        frames = [f.to_ndarray().reshape(-1).astype(np.float32) for f in c.decode(audio=0)]
        return np.concatenate(frames), c.streams.audio[0].rate


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[np.argmax(spectrum)])


@pytest.mark.parametrize("fmt", list(AUDIO_FORMATS))
@pytest.mark.parametrize("speed", [1.0, 2.0, 0.5])
def test_each_format_decodes_with_its_length_and_pitch(fmt, speed):
    pcm = sine(440, 1.0)
    data, rate = encode(fmt, pcm, speed)
    samples, decoded_rate = decode(data, fmt, rate)
    if fmt != "opus":  # an Ogg Opus stream always decodes at 48 kHz
        assert decoded_rate == rate == RATE
    seconds = len(samples) / decoded_rate
    # codec padding (an MP3's or AAC's priming frames) is a few tens of milliseconds
    assert seconds == pytest.approx(1.0 / speed, abs=0.1)
    assert dominant_hz(samples, decoded_rate) == pytest.approx(440, abs=10)


def test_wav_sizes_are_streamed_unknown_and_completed_for_a_whole_body():
    data, _ = encode("wav", sine(440, 0.1))
    assert data[:4] == b"RIFF" and int.from_bytes(data[40:44], "little") == 0xFFFFFFFF - 36
    whole = complete_wav(data)
    assert int.from_bytes(whole[40:44], "little") == len(whole) - 44 == 2400 * 2
    assert int.from_bytes(whole[4:8], "little") == len(whole) - 8


@pytest.mark.parametrize("fmt", list(AUDIO_FORMATS))
def test_no_audio_finishes_cleanly(fmt):
    """A turn may end with no audio at all (an abort, a tiny token budget)."""
    data = AudioEncoder(AUDIO_FORMATS[fmt], RATE, 1.5).finish()
    if fmt == "wav":
        assert len(data) == 44 and complete_wav(data)[40:44] == b"\0\0\0\0"


def test_streamed_formats_give_bytes_before_the_end():
    """A streamed response must not wait for ``finish``: every compressed format has bytes
    out after a few seconds of input."""
    for fmt in ("mp3", "opus", "aac", "flac"):
        enc = AudioEncoder(AUDIO_FORMATS[fmt], RATE, 1.0)
        early = b"".join(enc.encode(c.tobytes()) for c in np.split(sine(300, 3.0), 30))
        assert len(early) > 1000, fmt
        enc.close()


@pytest.mark.parametrize("speed", [0.25, 0.3, 0.5, 1.7, 2.0, 3.0, 4.0])
def test_atempo_stages_multiply_to_the_speed_within_one_stage_range(speed):
    stages = atempo_stages(speed)
    assert np.prod(stages) == pytest.approx(speed)
    assert all(0.5 <= s <= 2.0 for s in stages)
