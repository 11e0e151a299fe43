"""A reference clip for voice cloning: WAV bytes in, checked mono samples at the codec's rate.

Everything a user can upload is checked here, before any model work: the container (RIFF
WAVE; PCM 8/16/24/32-bit or IEEE float 32/64, plain or WAVE_FORMAT_EXTENSIBLE), the length
(1 to 30 s by default) and the level (a silent clip has no voice to take).

The clip is then read as Spark-TTS reads a reference (``sparktts/utils/audio.py``,
``load_audio``): float64 samples as soundfile gives them, channel 0 of a multi-channel file
(not a mix), other rates resampled with soxr at "VHQ", and no clipping. The length and
silence limits are ours (Spark takes any clip); the volume rule follows in the speaker
encoder (``codecs.speaker_frontend.volume_normalize``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MIN_SECONDS = 1.0
MAX_SECONDS = 30.0
SILENCE_PEAK = 1e-3
"""A clip whose peak stays below this (about -60 dBFS) is silence."""
MAX_FLOAT_PEAK = 1000.0
"""A float WAV may go past full scale (the clip is never clipped); 60 dB past it is not
audio but garbage, refused as ``unsupported``."""

_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE


class ReferenceClipError(ValueError):
    """The clip cannot give a voice; ``reason`` says why in one word (the API's error code
    suffix): empty, not_wav, unsupported, too_short, too_long, silent."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ReferenceClip:
    samples: np.ndarray
    """Mono float64 at ``sample_rate``: channel 0 of the file, resampled, never clipped."""
    sample_rate: int
    source_rate: int
    source_channels: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sample_rate


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    """RIFF WAVE bytes -> (float64 [frames, channels], sample rate), scaled as soundfile
    scales them (PCM in [-1, 1); float samples as stored, NaN read as 0, infinities as +-1)."""
    if not data:
        raise ReferenceClipError("empty", "the reference clip is empty")
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ReferenceClipError("not_wav", "the reference clip is not a WAV file (no RIFF/WAVE header)")
    fmt, payload, pos = None, None, 12
    while pos + 8 <= len(data):
        chunk_id, size = data[pos:pos + 4], struct.unpack("<I", data[pos + 4:pos + 8])[0]
        body = data[pos + 8:pos + 8 + size]
        if chunk_id == b"fmt ":
            fmt = body
        elif chunk_id == b"data":
            payload = body
            break
        pos += 8 + size + (size & 1)
    if fmt is None or len(fmt) < 16 or payload is None:
        raise ReferenceClipError("not_wav", "the WAV file has no 'fmt ' or 'data' chunk")
    tag, channels, rate, _, block, bits = struct.unpack("<HHIIHH", fmt[:16])
    if tag == _EXTENSIBLE and len(fmt) >= 26:
        tag = struct.unpack("<H", fmt[24:26])[0]  # the sub-format GUID starts with the tag
    if channels < 1 or rate < 1 or block < 1:
        raise ReferenceClipError("not_wav", "the WAV header is malformed (channels, rate or block size 0)")
    kinds = {(_PCM, 8): "u1", (_PCM, 16): "<i2", (_PCM, 24): "i3", (_PCM, 32): "<i4",
             (_FLOAT, 32): "<f4", (_FLOAT, 64): "<f8"}
    kind = kinds.get((tag, bits))
    if kind is None:
        raise ReferenceClipError("unsupported", f"unsupported WAV encoding (format {tag}, "
                                 f"{bits} bits): use PCM 8/16/24/32-bit or float 32/64")
    if block != channels * bits // 8:
        raise ReferenceClipError("not_wav", "the WAV header's block size does not match its format")
    frames = len(payload) // block
    raw = payload[:frames * block]
    if kind == "i3":
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        ints = (b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16))
        audio = (np.where(ints >= 1 << 23, ints - (1 << 24), ints) / float(1 << 23))
    elif kind == "u1":
        audio = (np.frombuffer(raw, np.uint8).astype(np.float64) - 128.0) / 128.0
    elif kind.startswith("<i"):
        audio = np.frombuffer(raw, kind).astype(np.float64) / float(1 << (bits - 1))
    else:
        audio = np.frombuffer(raw, kind).astype(np.float64)
    audio = np.nan_to_num(audio, nan=0.0, posinf=1.0, neginf=-1.0)
    if audio.size and float(np.abs(audio).max()) > MAX_FLOAT_PEAK:
        # (float samples only can): the resampler overflows and the encoder gives nonsense
        raise ReferenceClipError("unsupported", "float samples far outside [-1, 1] (peak "
                                 f"{float(np.abs(audio).max()):.3g}): not audio as a WAV holds it")
    return audio.astype(np.float64).reshape(-1, channels), rate


def load_reference_clip(data: bytes, sample_rate: int, *, min_seconds: float = MIN_SECONDS,
                        max_seconds: float = MAX_SECONDS) -> ReferenceClip:
    """Check and convert an uploaded clip; every refusal is a ``ReferenceClipError``."""
    audio, rate = read_wav(data)
    if audio.shape[0] == 0:
        raise ReferenceClipError("empty", "the WAV file holds no audio frames")
    seconds = audio.shape[0] / rate
    if seconds < min_seconds:
        raise ReferenceClipError("too_short", f"the reference clip is {seconds:.2f} s long; "
                                 f"at least {min_seconds:g} s of speech is needed")
    if seconds > max_seconds:
        raise ReferenceClipError("too_long", f"the reference clip is {seconds:.1f} s long; "
                                 f"at most {max_seconds:g} s is taken")
    mono = np.ascontiguousarray(audio[:, 0])  # Spark reads channel 0, it does not mix
    if float(np.abs(mono).max()) < SILENCE_PEAK:
        raise ReferenceClipError("silent", "the reference clip is silent (peak below -60 dBFS"
                                 + (" on its first channel)" if audio.shape[1] > 1 else ")"))
    if rate != sample_rate:
        import soxr

        mono = soxr.resample(mono, rate, sample_rate, quality="VHQ")
    return ReferenceClip(mono, sample_rate, rate, audio.shape[1])

