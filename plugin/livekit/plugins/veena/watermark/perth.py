"""Perth's implicit watermark (Resemble AI's ``resemble-perth``), embedding side, ported.

Neuphonic's NeuTTS applies ``PerthImplicitWatermarker().apply_watermark(wav, 24000)`` to
everything it speaks. This is the same computation on the same published weights, written
with ``torch.stft``/``torch.istft`` and ``soxr`` so that it needs neither torchaudio (no build
loads beside vLLM's CPU torch) nor librosa:

resample to the model's rate (32 kHz, soxr ``HQ``, the length ``ceil(n x ratio)`` as librosa
fixes it) -> STFT (Hann, centred, reflect-padded) -> magnitude in normalised dB and phase ->
the encoder's residual (convolutions over the band below ``max_wmark_freq``, zero on frames
quieter than 5 % of the loudest) added to that band -> back to a spectrum -> iSTFT -> resample
back. ``apply`` is the whole-clip operation, its output length included (the iSTFT ends on a
whole hop, so up to one hop of the end is dropped); ``watermark.streaming`` applies it to a
stream with a bounded hold-back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..validation import check_float, check_int
from .weights import PerthWeights

_HEADROOM_DB = 15.0
_MASK_FRACTION = 0.05
_LEAKY_SLOPE = 0.01
_RESAMPLE_QUALITY = "HQ"  # librosa's default ``soxr_hq``


@dataclass(frozen=True)
class PerthConfig:
    """The hyperparameters the embedding path reads from ``hparams.yaml``."""

    sample_rate: int
    n_fft: int
    hop_size: int
    window_size: int
    stft_magnitude_min: float
    max_wmark_freq: float
    hidden_size: int

    @classmethod
    def from_mapping(cls, hp: dict) -> "PerthConfig":
        """Checked by type and range (ValueError naming the field); only a Hann window is
        ported, as the published model uses."""
        if not isinstance(hp, dict):
            raise ValueError("Perth hparams.yaml is not a mapping")
        if hp.get("window_fn") != "hann":
            raise ValueError(f"Perth window_fn {hp.get('window_fn')!r} is not supported (hann)")
        n_fft = check_int("Perth n_fft", hp.get("n_fft"), 16, 1 << 16)
        return cls(
            sample_rate=check_int("Perth sample_rate", hp.get("sample_rate"), 1000, 384000),
            n_fft=n_fft,
            hop_size=check_int("Perth hop_size", hp.get("hop_size"), 1, n_fft),
            window_size=check_int("Perth window_size", hp.get("window_size"), 1, n_fft),
            stft_magnitude_min=check_float("Perth stft_magnitude_min",
                                           hp.get("stft_magnitude_min"), 1e-30, 1.0),
            max_wmark_freq=check_float("Perth max_wmark_freq", hp.get("max_wmark_freq"), 1.0,
                                       hp.get("sample_rate", 0) / 2),
            hidden_size=check_int("Perth hidden_size", hp.get("hidden_size"), 1, 1 << 14),
        )

    @property
    def subband(self) -> int:
        """Frequency bins that carry the watermark (those below ``max_wmark_freq``)."""
        bins = self.n_fft // 2 + 1
        return int(round(bins * self.max_wmark_freq / (self.sample_rate / 2)))

    @property
    def min_db(self) -> float:
        return 20.0 * math.log10(self.stft_magnitude_min)


class PerthWatermarker:
    """The encoder's weights and the transform around them; CPU, float32, thread-safe for
    concurrent ``apply`` calls (no state)."""

    def __init__(self, weights: PerthWeights) -> None:
        import torch
        import yaml

        self.weights = weights
        with weights.hparams.open() as f:
            self.config = PerthConfig.from_mapping(yaml.safe_load(f))
        state = torch.load(weights.checkpoint, map_location="cpu", weights_only=True)
        model = state.get("model") if isinstance(state, dict) else None
        if not isinstance(model, dict):
            raise ValueError(f"{weights.checkpoint} holds no Perth model state")
        self._layers = self._encoder_layers(model)
        self._window = torch.hann_window(self.config.window_size)

    def _encoder_layers(self, model: dict) -> list[tuple]:
        """(weight, bias) per convolution of the encoder, shapes checked: band -> hidden (k 1),
        five hidden -> hidden (k 7), hidden -> band (k 1)."""
        c = self.config
        layers, i = [], 0
        while f"encoder.layers.{i}.conv.weight" in model:
            layers.append((model[f"encoder.layers.{i}.conv.weight"].float(),
                           model[f"encoder.layers.{i}.conv.bias"].float()))
            i += 1
        shapes = [tuple(w.shape) for w, _ in layers]
        want = ([(c.hidden_size, c.subband, 1)] + [(c.hidden_size, c.hidden_size, 7)] * 5
                + [(c.subband, c.hidden_size, 1)])
        if shapes != want:
            raise ValueError(f"Perth encoder layers {shapes} are not the expected {want}")
        return layers

    def grid(self, sample_rate: int) -> int:
        """The fewest samples at ``sample_rate`` that span a whole number of the model's hops
        after resampling: a block starting on this grid sees the same STFT frames and the
        same resampling phase as the whole clip does there (240 at 24 kHz)."""
        step = Fraction(self.config.hop_size * sample_rate, self.config.sample_rate)
        return step.numerator

    def apply(self, audio: np.ndarray, sample_rate: int) -> np.ndarray:
        """The watermarked clip, float32, as Perth's ``apply_watermark`` returns it (its
        length included)."""
        import soxr
        import torch

        x = np.ascontiguousarray(audio, dtype=np.float32)
        rate = self.config.sample_rate
        if sample_rate != rate:
            x = _resampled(soxr, x, sample_rate, rate)
        with torch.inference_mode():
            y = self._embed(torch.from_numpy(x)).numpy()
        if sample_rate != rate:
            y = _resampled(soxr, y, rate, sample_rate)
        return y

    def _embed(self, signal):
        import torch
        import torch.nn.functional as F

        c = self.config
        stft = dict(n_fft=c.n_fft, hop_length=c.hop_size, win_length=c.window_size,
                    window=self._window, center=True, normalized=False, onesided=True)
        spec = torch.stft(signal, pad_mode="reflect", return_complex=True, **stft)
        phase = torch.angle(spec)
        span = -c.min_db + _HEADROOM_DB
        mag = (20 * torch.log10(spec.abs().clip(c.stft_magnitude_min)) - c.min_db) / span
        loudness = mag.sum(dim=0)  # per frame; the watermark skips near-silent frames
        mask = (loudness > loudness.max() * _MASK_FRACTION).float()
        h = mag[None, : c.subband]
        last = len(self._layers) - 1
        for i, (w, b) in enumerate(self._layers):
            h = F.conv1d(h, w, b, padding=(w.shape[-1] - 1) // 2)
            if i < last:
                h = F.leaky_relu(h, _LEAKY_SLOPE)
        mag = mag.clone()
        mag[: c.subband] += h[0] * mask
        db = mag * span + c.min_db
        out = (10.0 ** (db / 20).clip(max=10)) * torch.exp(1.0j * phase)
        return torch.istft(out, return_complex=False, **stft)


def _resampled(soxr, x: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """soxr ``HQ``, cut or zero-padded to ``ceil(n x rate_out / rate_in)`` samples."""
    n = math.ceil(len(x) * rate_out / rate_in)
    y = soxr.resample(x, rate_in, rate_out, quality=_RESAMPLE_QUALITY)
    if len(y) < n:
        y = np.concatenate([y, np.zeros(n - len(y), dtype=y.dtype)])
    return np.ascontiguousarray(y[:n], dtype=np.float32)
