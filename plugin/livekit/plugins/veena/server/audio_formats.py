"""The audio formats of ``POST /v1/audio/speech`` (OpenAI's six) and its ``speed``.

A pure, synchronous core under the async route: one ``AudioEncoder`` per request takes 16-bit
mono PCM chunk by chunk and gives back encoded bytes as soon as the encoder has them, so a
streamed response goes out as it is encoded. PyAV (ffmpeg, installed with
``livekit-agents[codecs]``) does the encoding and the pitch-preserving ``atempo`` stretch;
one filter graph per request keeps the stretch seamless across chunks.
"""

from __future__ import annotations

import contextlib
import struct
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np

SPEED_RANGE = (0.25, 4.0)
"""OpenAI's range for ``speed``."""

_ATEMPO_RANGE = (0.5, 2.0)
"""What one ``atempo`` stage covers in every ffmpeg (newer ones go to 100): wider factors are
a chain of stages, so the result does not depend on the ffmpeg build."""


@dataclass(frozen=True)
class AudioFormat:
    """How one ``response_format`` is written: raw PCM (``container`` None) or a PyAV muxer."""

    name: str
    content_type: str
    container: str | None = None
    codec: str | None = None
    rates: tuple[int, ...] | None = None
    """The sample rates the codec takes (None: any); another rate is resampled to the
    highest one."""
    container_options: tuple[tuple[str, str], ...] = ()


AUDIO_FORMATS: dict[str, AudioFormat] = {
    f.name: f for f in (
        AudioFormat("mp3", "audio/mpeg", "mp3", "libmp3lame",
                    (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
        # Ogg pages of 20 ms, not ffmpeg's default 1 s: a stream must not wait for a page
        AudioFormat("opus", "audio/opus", "ogg", "libopus", (8000, 12000, 16000, 24000, 48000),
                    (("page_duration", "20000"),)),
        AudioFormat("aac", "audio/aac", "adts", "aac",
                    (7350, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000,
                     64000, 88200, 96000)),
        AudioFormat("flac", "audio/flac", "flac", "flac"),
        AudioFormat("wav", "audio/wav"),
        AudioFormat("pcm", "audio/pcm"),
    )}
"""OpenAI's ``response_format`` values, in its order."""

DEFAULT_FORMAT = "mp3"
"""OpenAI's default: a request without ``response_format`` gets MP3."""


def wav_header(sample_rate: int, data_bytes: int = 0xFFFFFFFF - 36) -> bytes:
    """A 16-bit mono WAV header; streamed responses use the 'unknown length' maximum."""
    return (b"RIFF" + struct.pack("<I", min(36 + data_bytes, 0xFFFFFFFF)) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", data_bytes))


def atempo_stages(speed: float) -> list[float]:
    """``speed`` as a product of factors each within one ``atempo`` stage's range."""
    lo, hi = _ATEMPO_RANGE
    stages: list[float] = []
    while speed > hi:
        stages.append(hi)
        speed /= hi
    while speed < lo:
        stages.append(lo)
        speed /= lo
    return stages + [speed]


class _Sink:
    """A write-only, unseekable file for PyAV: what the muxer writes waits here to be taken."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def write(self, data: bytes) -> int:
        self._buf += data
        return len(data)

    def seekable(self) -> bool:
        return False

    def take(self) -> bytes:
        data = bytes(self._buf)
        self._buf.clear()
        return data


class _Tempo:
    """A pitch-preserving time stretch: one ``atempo`` filter graph fed chunk by chunk."""

    def __init__(self, sample_rate: int, speed: float) -> None:
        self._graph = av.filter.Graph()
        node = self._graph.add_abuffer(format="s16", sample_rate=sample_rate, layout="mono",
                                       time_base=Fraction(1, sample_rate))
        for factor in atempo_stages(speed):
            stage = self._graph.add("atempo", f"{factor:.6f}")
            node.link_to(stage)
            node = stage
        node.link_to(self._graph.add("abuffersink"))
        self._graph.configure()
        self._rate = sample_rate
        self._pts = 0

    def push(self, pcm: np.ndarray) -> list[np.ndarray]:
        frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
        frame.sample_rate, frame.pts = self._rate, self._pts
        self._pts += pcm.shape[0]
        self._graph.push(frame)
        return self._pull()

    def finish(self) -> list[np.ndarray]:
        self._graph.push(None)
        return self._pull()

    def _pull(self) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        while True:
            try:
                frame = self._graph.pull()
            except (av.BlockingIOError, av.EOFError):
                return out
            out.append(frame.to_ndarray().reshape(-1).astype(np.int16, copy=False))


class AudioEncoder:
    """16-bit mono PCM in (any chunk size), ``fmt``'s bytes out, optionally stretched.

    ``encode`` returns what is ready now (possibly nothing: codecs work in frames);
    ``finish`` returns the rest. A WAV carries the streamed 'unknown length' header; a
    complete body gets its sizes from ``complete_wav``."""

    def __init__(self, fmt: AudioFormat, sample_rate: int, speed: float = 1.0) -> None:
        self.format = fmt
        self.input_rate = sample_rate
        self.sample_rate = (sample_rate if fmt.rates is None or sample_rate in fmt.rates
                            else max(fmt.rates))
        """The rate of the encoded audio (``X-Sample-Rate``)."""
        self._tempo = _Tempo(sample_rate, speed) if speed != 1.0 else None
        self._header_due = fmt.name == "wav"
        self._sink: _Sink | None = None
        self._pts = 0
        if fmt.container is not None:
            self._sink = _Sink()
            self._container = av.open(self._sink, "w", format=fmt.container,
                                      options=dict(fmt.container_options))
            self._stream = self._container.add_stream(fmt.codec, rate=self.sample_rate,
                                                      layout="mono")

    def encode(self, pcm: bytes) -> bytes:
        samples = np.frombuffer(pcm, np.int16)
        if self._tempo is None:
            return self._emit([samples])
        return self._emit(self._tempo.push(samples)) if samples.size else b""

    def finish(self) -> bytes:
        data = self._emit(self._tempo.finish()) if self._tempo is not None else b""
        if self._header_due:  # no audio at all: still a valid (empty) WAV
            data += self._emit([])
        if self._sink is not None:
            for packet in self._stream.encode(None):
                self._container.mux(packet)
            self._container.close()
            data += self._sink.take()
            self._sink = None
        return data

    def _emit(self, chunks: list[np.ndarray]) -> bytes:
        head = b""
        if self._header_due:
            head, self._header_due = wav_header(self.sample_rate), False
        if self._sink is None:
            return head + b"".join(c.tobytes() for c in chunks)
        for samples in chunks:
            if not samples.size:
                continue
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples)[None, :],
                                               format="s16", layout="mono")
            frame.sample_rate, frame.pts = self.input_rate, self._pts
            self._pts += samples.shape[0]
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        return self._sink.take()

    def close(self) -> None:
        """Free the encoder of a request that ended early (``finish`` not called)."""
        if self._sink is not None:
            self._sink = None
            with contextlib.suppress(av.FFmpegError, ValueError):
                self._container.close()


def complete_wav(data: bytes) -> bytes:
    """A whole WAV body with its real sizes in place of the streamed 'unknown length'."""
    size = len(data) - 44
    return (data[:4] + struct.pack("<I", 36 + size) + data[8:40] + struct.pack("<I", size)
            + data[44:])
