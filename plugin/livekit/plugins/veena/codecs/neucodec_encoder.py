"""NeuCodec's encoder (``NeuCodec.encode_code``): a 16 kHz reference clip -> its 50 Hz FSQ
codes, which a NeuTTS prompt continues (voice cloning). XCodec2's (``XCodec2Model.encode_code``,
Llasa's cloning) is the same encoder but for one step: its w2v-bert-2.0 features are taken from
the clip with 160 zeros (10 ms) on each side (``variant="xcodec2"``).

Two views of the clip, joined per 20 ms frame: w2v-bert-2.0's hidden state 16 (through its
own feature extractor, from ``transformers``) through a small convolutional ``SemanticEncoder``,
and a BigCodec-style acoustic encoder (SnakeBeta activations with anti-aliased 2x resampling,
strides 2, 2, 4, 4, 5); then ``fc_prior`` and the quantizer's ``project_in`` and FSQ. The
parameter names are the published checkpoint's (``CodecEnc.*``, ``SemanticEncoder_module.*``,
``fc_prior.*``, ``generator.quantizer.project_in.*``; weight norm as ``weight_g``/``weight_v``
or as torch's ``parametrizations.weight.original0/1``, folded at load; SnakeBeta's beta as
``beta`` or, XCodec2's name, ``bias``). The w2v-bert-2.0 model
is the checkpoint's own ``semantic_model.*`` tensors where it has them all (XCodec2's does: then
only w2v-bert-2.0's config and feature extractor are read), else its own folder or hub id.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .neucodec_model import checkpoint_file, load_checked, read_state

logger = logging.getLogger(__name__)

SAMPLE_RATE = 16000
HOP = 320  # samples per code at 16 kHz
SEMANTIC_LAYER = 16
W2V_BERT = "facebook/w2v-bert-2.0"
MIN_SECONDS, MAX_SECONDS = 1.0, 30.0
FEATURE_PAD = {"neucodec": 0, "xcodec2": 160}
"""Zeros on each side of the clip for its w2v-bert-2.0 features, per codec variant (XCodec2's
``encode_code`` pads 160; NeuCodec's none)."""


class _SnakeBeta(nn.Module):
    """x + sin^2(a x) / b, a and b per channel, stored as logarithms."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.alpha.exp()[None, :, None], self.beta.exp()[None, :, None]
        return x + torch.sin(x * a).pow(2) / (b + 1e-9)


def kaiser_sinc_taps(taps: int = 12, cutoff: float = 0.25, half_width: float = 0.3
                     ) -> torch.Tensor:
    """A windowed-sinc low-pass filter [1, 1, taps] (Kaiser window, its beta from the
    transition width as in Kaiser's formula), normalised to unit gain: the published
    checkpoint stores these taps, and a new (tiny) one gets them from here."""
    half = taps // 2
    attenuation = 2.285 * (half - 1) * math.pi * 4 * half_width + 7.95
    if attenuation > 50:
        beta = 0.1102 * (attenuation - 8.7)
    elif attenuation >= 21:
        beta = 0.5842 * (attenuation - 21) ** 0.4 + 0.07886 * (attenuation - 21)
    else:
        beta = 0.0
    t = torch.arange(-half, half) + 0.5 if taps % 2 == 0 else torch.arange(taps) - half
    h = 2 * cutoff * torch.kaiser_window(taps, periodic=False, beta=beta) \
        * torch.sinc(2 * cutoff * t)
    return (h / h.sum()).view(1, 1, taps)


class _Resample(nn.Module):
    """2x up (transposed) or down (strided) through a 12-tap low-pass filter per channel,
    edges replicated; the filter taps are the checkpoint's."""

    def __init__(self, up: bool) -> None:
        super().__init__()
        self.up = up
        self.register_buffer("filter", kaiser_sinc_taps())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        taps = self.filter.expand(x.shape[1], -1, -1)
        if not self.up:
            return F.conv1d(F.pad(x, (5, 6), mode="replicate"), taps, stride=2,
                            groups=x.shape[1])
        y = 2 * F.conv_transpose1d(F.pad(x, (5, 5), mode="replicate"), taps, stride=2,
                                   groups=x.shape[1])
        return y[..., 15:-15]


class _Lowpass(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lowpass = _Resample(up=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lowpass(x)


class _AntiAliased(nn.Module):
    """SnakeBeta at twice the rate (``Activation1d``)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.act = _SnakeBeta(channels)
        self.upsample = _Resample(up=True)
        self.downsample = _Lowpass()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.downsample(self.act(self.upsample(x)))


class _ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            _AntiAliased(dim), nn.Conv1d(dim, dim, 7, dilation=dilation, padding=3 * dilation),
            _AntiAliased(dim), nn.Conv1d(dim, dim, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class _EncoderBlock(nn.Module):
    def __init__(self, dim: int, stride: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            *[_ResidualUnit(dim // 2, d) for d in (1, 3, 9)], _AntiAliased(dim // 2),
            nn.Conv1d(dim // 2, dim, 2 * stride, stride=stride,
                      padding=stride // 2 + stride % 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class _AcousticEncoder(nn.Module):
    """``CodecEnc.*``: 16 kHz samples [B, 1, T] -> [B, T / 320, hidden]."""

    def __init__(self, ngf: int, hidden: int, strides: tuple[int, ...] = (2, 2, 4, 4, 5)) -> None:
        super().__init__()
        dims = [ngf * 2 ** (i + 1) for i in range(len(strides))]
        self.conv_blocks = nn.Sequential(
            nn.Conv1d(1, ngf, 7, padding=3), *[_EncoderBlock(d, s) for d, s in zip(dims, strides)])
        self.conv_final_block = nn.Sequential(_AntiAliased(dims[-1]),
                                              nn.Conv1d(dims[-1], hidden, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_final_block(self.conv_blocks(x)).transpose(1, 2)


class _SemanticEncoder(nn.Module):
    """``SemanticEncoder_module.*``. The reference's first ReLU is in place, so its
    residual adds the rectified input, as here."""

    def __init__(self, channels: int, code_dim: int, inner: int) -> None:
        super().__init__()
        self.initial_conv = nn.Conv1d(channels, inner, 3, padding=1, bias=False)
        self.residual_blocks = nn.Sequential(nn.ReLU(), nn.Conv1d(inner, inner, 3, padding=1),
                                             nn.ReLU(), nn.Conv1d(inner, inner, 3, padding=1))
        self.final_conv = nn.Conv1d(inner, code_dim, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.initial_conv(x))
        return self.final_conv(self.residual_blocks(x) + x)


def fsq_indices(z: torch.Tensor, levels: tuple[int, ...]) -> torch.Tensor:
    """Vectors [..., len(levels)] -> FSQ indices [...], bounded twice as ``ResidualFSQ``
    (1.17.8) does (once for the residual, once inside its only layer)."""
    lv = torch.tensor(levels, dtype=z.dtype, device=z.device)
    half_l = (lv - 1) * (1 + 1e-3) / 2
    offset = torch.where(lv % 2 == 0, 0.5, 0.0).to(z.dtype)
    shift = torch.atanh(offset / half_l)

    def bound(v: torch.Tensor) -> torch.Tensor:
        return torch.tanh(v + shift) * half_l - offset

    half = torch.div(lv, 2, rounding_mode="floor")
    digits = torch.round(bound(bound(z))) + half  # 0..level-1
    basis = torch.cumprod(torch.tensor((1, *levels[:-1]), device=z.device), 0)
    return (digits.long() * basis).sum(dim=-1)


_WEIGHT_NORM = ((".weight_v", ".weight_g"),  # torch.nn.utils.weight_norm
                (".parametrizations.weight.original1", ".parametrizations.weight.original0"))
"""(direction, magnitude) key endings of the two weight-norm layouts (dim 0)."""


def _fold_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weight norm's magnitude and direction (either layout, ``_WEIGHT_NORM``) -> ``weight``."""
    out = {}
    for key, value in state.items():
        for v_end, g_end in _WEIGHT_NORM:
            if key.endswith(v_end):  # in float32: a float16 checkpoint's fold loses bits
                value, g = value.float(), state[key[:-len(v_end)] + g_end].float()
                norm = value.flatten(1).norm(dim=1).view(-1, *[1] * (value.dim() - 1))
                out[key[:-len(v_end)] + ".weight"] = value * (g / norm)
                break
            if key.endswith(g_end):
                break
        else:
            out[key] = value
    return out


def _snake_beta_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """XCodec2 names SnakeBeta's beta ``bias`` (``CodecEnc.*.act.bias``); NeuCodec ``beta``."""
    return {(k[:-len("bias")] + "beta" if k.startswith("CodecEnc.") and k.endswith(".act.bias")
             else k): v for k, v in state.items()}


class _Heads(nn.Module):
    """The checkpoint's encoder tensors, under their published names."""

    def __init__(self, ngf: int, acoustic: int, semantic_in: int, semantic: int, vq_dim: int,
                 levels: int) -> None:
        super().__init__()
        self.CodecEnc = _AcousticEncoder(ngf, acoustic)
        self.SemanticEncoder_module = _SemanticEncoder(semantic_in, semantic, semantic)
        self.fc_prior = nn.Linear(semantic + acoustic, vq_dim)
        self.generator = nn.Module()
        self.generator.quantizer = nn.Module()
        self.generator.quantizer.project_in = nn.Linear(vq_dim, levels)


def _check_variant(variant: str) -> None:
    if variant not in FEATURE_PAD:
        raise ValueError(f"codec variant must be one of {sorted(FEATURE_PAD)}, "
                         f"not {variant!r}")


def _semantic_model(own: dict[str, torch.Tensor], w2v: str) -> Any:
    """w2v-bert-2.0 up to hidden state 16: built from ``w2v``'s config and the checkpoint's
    own tensors (``own``) where they are all there; else ``w2v``'s weights, with those of
    ``own`` it has over them."""
    from transformers import AutoConfig, Wav2Vec2BertModel

    if own:
        config = AutoConfig.from_pretrained(w2v)
        config.num_hidden_layers = SEMANTIC_LAYER  # the layers after it are never run
        with torch.device("meta"):  # its tensor names, nothing allocated
            needed = set(Wav2Vec2BertModel(config).state_dict())
        if needed <= set(own):
            model = Wav2Vec2BertModel(config)
            load_checked(model, own, "codec checkpoint (its semantic_model)")
            return model
    model = Wav2Vec2BertModel.from_pretrained(w2v)
    model.encoder.layers = model.encoder.layers[:SEMANTIC_LAYER]
    if own:
        model.load_state_dict(own, strict=False)
    return model


class NeuCodecEncoder:
    """Reference clip (16 kHz mono float) -> NeuCodec codes [frames] (``encode_code``)."""

    sample_rate = SAMPLE_RATE

    def __init__(self, heads: _Heads, semantic_model: Any, feature_extractor: Any,
                 levels: tuple[int, ...] = (4,) * 8, device: str = "cpu",
                 variant: str = "neucodec") -> None:
        _check_variant(variant)
        self.heads = heads.to(device).eval().float()
        self.semantic_model = semantic_model.to(device).eval().float()
        self.feature_extractor = feature_extractor
        self.levels = levels
        self.device = torch.device(device)
        self.variant = variant
        self.name = "XCodec2" if variant == "xcodec2" else "NeuCodec"

    @classmethod
    def load(cls, codec_model: str, *, device: str = "cpu", w2v_bert: str | None = None,
             variant: str = "neucodec") -> "NeuCodecEncoder":
        """The encoder tensors from a NeuCodec (``variant`` "neucodec") or XCodec2 ("xcodec2")
        checkpoint folder (``codec_dir``); w2v-bert-2.0's config and feature extractor from
        ``w2v_bert``, else a ``w2v-bert-2.0`` folder beside the checkpoint, else its hub id.
        Its weights are the checkpoint's own ``semantic_model.*`` tensors where it has all
        that hidden state 16 needs, else that folder's (then the checkpoint's own tensors,
        where it has some, win, as in the reference's loading). ValueError for missing
        tensors or wrong shapes."""
        from transformers import AutoFeatureExtractor

        from .neucodec import codec_dir

        _check_variant(variant)
        folder = codec_dir(codec_model)
        state = _snake_beta_names(_fold_weight_norm(read_state(checkpoint_file(folder))))
        w2v = w2v_bert or (str(folder / "w2v-bert-2.0") if (folder / "w2v-bert-2.0").is_dir()
                           else W2V_BERT)
        own = {k[len("semantic_model."):]: v for k, v in state.items()
               if k.startswith("semantic_model.")}
        semantic_model = _semantic_model(own, w2v)
        heads = _heads_for(state, semantic_model.config.hidden_size)
        logger.info("loaded codec encoder", extra={"codec_model": str(folder), "w2v_bert": w2v,
                                                   "variant": variant})
        return cls(heads, semantic_model, AutoFeatureExtractor.from_pretrained(w2v),
                   device=device, variant=variant)

    def check(self, wav: Any, sample_rate: Any) -> np.ndarray:
        """The clip as float32 samples, or ValueError saying what it is not (before any of
        it reaches torch)."""
        if isinstance(sample_rate, bool) or sample_rate != SAMPLE_RATE:
            raise ValueError(f"the {self.name} encoder takes {SAMPLE_RATE} Hz audio, "
                             f"not {sample_rate!r}: resample the clip first")
        wav = np.asarray(wav)
        if wav.ndim != 1 or not np.issubdtype(wav.dtype, np.floating):
            raise ValueError("a reference clip must be mono float samples (one dimension)")
        if not np.isfinite(wav).all():
            raise ValueError("a reference clip must not hold NaN or infinite samples")
        seconds = len(wav) / SAMPLE_RATE
        if not MIN_SECONDS <= seconds <= MAX_SECONDS:
            raise ValueError(f"a reference clip must last {MIN_SECONDS:g}-{MAX_SECONDS:g} s, "
                             f"not {seconds:.2f} s")
        if np.abs(wav).max() < 1e-4:
            raise ValueError("the reference clip is silent")
        return wav.astype(np.float32)

    @torch.inference_mode()
    def encode_reference(self, wav: np.ndarray, sample_rate: int) -> np.ndarray:
        """Codes [frames] (int64, 0..65535) of a mono clip at 16 kHz; ValueError for a clip
        that is not one (wrong rate, shape, length, NaN, silence)."""
        wav = self.check(wav, sample_rate)
        # as the reference: to a whole hop, and a whole hop more where it already is one
        wav = np.pad(wav, (0, HOP - len(wav) % HOP))
        pad = FEATURE_PAD[self.variant]
        features = self.feature_extractor(np.pad(wav, (pad, pad)) if pad else wav,
                                          sampling_rate=SAMPLE_RATE, return_tensors="pt")
        hidden = self.semantic_model(features.input_features.to(self.device),
                                     output_hidden_states=True).hidden_states[SEMANTIC_LAYER]
        h = self.heads
        semantic = h.SemanticEncoder_module(hidden.transpose(1, 2))
        acoustic = h.CodecEnc(torch.from_numpy(wav)[None, None].to(self.device)).transpose(1, 2)
        n = min(semantic.shape[-1], acoustic.shape[-1])
        joined = torch.cat([semantic[..., :n], acoustic[..., :n]], dim=1).transpose(1, 2)
        z = h.generator.quantizer.project_in(h.fc_prior(joined))
        return fsq_indices(z, self.levels)[0].cpu().numpy().astype(np.int64)

    def encode(self, samples: np.ndarray) -> list[int]:
        """``encode_reference`` at this encoder's rate, as a list (the voice-clone path's
        shape)."""
        return [int(c) for c in self.encode_reference(samples, SAMPLE_RATE)]


def _heads_for(state: dict[str, torch.Tensor], semantic_in: int) -> _Heads:
    """Sizes read from the checkpoint's own tensors, then every tensor checked."""
    try:
        ngf = state["CodecEnc.conv_blocks.0.weight"].shape[0]
        acoustic = state["CodecEnc.conv_final_block.1.weight"].shape[0]
        semantic = state["SemanticEncoder_module.final_conv.weight"].shape[0]
        vq_dim, levels = state["fc_prior.weight"].shape[0], \
            state["generator.quantizer.project_in.weight"].shape[0]
    except KeyError as e:
        raise ValueError(f"NeuCodec checkpoint lacks the encoder tensor {e.args[0]}") from None
    heads = _Heads(ngf, acoustic, semantic_in, semantic, vq_dim, levels)
    load_checked(heads, state, "NeuCodec checkpoint (its encoder)")
    return heads


TINY_W2V_BERT = {"hidden_size": 32, "num_hidden_layers": SEMANTIC_LAYER, "num_attention_heads": 2,
                 "intermediate_size": 64, "output_hidden_size": 32}
W2V_BERT_FEATURES = {"feature_size": 80, "num_mel_bins": 80, "padding_side": "right",
                     "padding_value": 1, "return_attention_mask": True, "sampling_rate": 16000,
                     "stride": 2}
"""w2v-bert-2.0's published preprocessor_config.json."""


def tiny_encoder_state(folder: Path, vq_dim: int, levels: int, seed: int = 0
                       ) -> dict[str, torch.Tensor]:
    """Random encoder tensors under their published names (weight norm folded: a plain
    ``weight`` loads as well), with a tiny random w2v-bert-2.0 written to
    ``folder/w2v-bert-2.0``; for tiny models and tests."""
    from transformers import SeamlessM4TFeatureExtractor, Wav2Vec2BertConfig, Wav2Vec2BertModel

    torch.manual_seed(seed)
    w2v = Wav2Vec2BertModel(Wav2Vec2BertConfig(**TINY_W2V_BERT))
    w2v.save_pretrained(folder / "w2v-bert-2.0")
    SeamlessM4TFeatureExtractor(**W2V_BERT_FEATURES).save_pretrained(folder / "w2v-bert-2.0")
    half = vq_dim // 2
    return _Heads(2, half, TINY_W2V_BERT["hidden_size"], half, vq_dim, levels).state_dict()
