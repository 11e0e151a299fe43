"""BiCodec's decode side (Spark-TTS), written here with the official checkpoint's parameter
names, so ``BiCodec/model.safetensors`` loads into it directly.

Only what turns tokens into audio: semantic ids -> factorised VQ codebook -> 1x1 conv;
32 global ids -> residual FSQ codes -> speaker vector; a speaker-conditioned ConvNeXt
prenet and a DAC-style wave generator (hop 320, 16 kHz). No encoder, no speaker encoder
network, no mel transform: nothing here needs torchaudio.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.parametrizations import weight_norm

from .fsq import ResidualFSQ

# The decode-relevant part of the official config.yaml (audio_tokenizer section).
DEFAULT_CONFIG = {
    "quantizer": {"input_dim": 1024, "codebook_size": 8192, "codebook_dim": 8},
    "speaker_encoder": {"out_dim": 1024, "latent_dim": 128, "token_num": 32,
                        "fsq_levels": [4, 4, 4, 4, 4, 4], "fsq_num_quantizers": 1},
    "prenet": {"input_channels": 1024, "vocos_dim": 384, "vocos_intermediate_dim": 2048,
               "vocos_num_layers": 12, "out_channels": 1024, "condition_dim": 1024,
               "sample_ratios": [1, 1], "use_tanh_at_final": False},
    "decoder": {"input_channel": 1024, "channels": 1536, "rates": [8, 5, 4, 2],
                "kernel_sizes": [16, 11, 8, 4]},
}


def _wn_conv(*args, **kwargs) -> nn.Module:
    return weight_norm(nn.Conv1d(*args, **kwargs))


class Snake1d(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


class FactorizedVQ(nn.Module):
    """Semantic ids -> 1024-dim latents (``quantizer.*`` in the checkpoint)."""

    def __init__(self, input_dim: int, codebook_size: int, codebook_dim: int, **_) -> None:
        super().__init__()
        self.codebook = nn.Embedding(codebook_size, codebook_dim)
        self.out_project = _wn_conv(codebook_dim, input_dim, kernel_size=1)

    def detokenize(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out_project(F.embedding(ids, self.codebook.weight).transpose(1, 2))


class SpeakerDecoder(nn.Module):
    """32 global ids -> a speaker vector (``speaker_encoder.quantizer/project``)."""

    def __init__(self, out_dim: int, latent_dim: int, token_num: int, fsq_levels: Sequence[int],
                 fsq_num_quantizers: int, **_) -> None:
        super().__init__()
        self.quantizer = ResidualFSQ(fsq_levels, fsq_num_quantizers, latent_dim)
        self.project = nn.Linear(latent_dim * token_num, out_dim)

    def detokenize(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, 32] (one quantizer) -> [B, out_dim].

        The projection's input is the codes laid out latent dimension first (``[B, latent,
        32]`` flattened), as Spark-TTS's ``SpeakerEncoder.detokenize`` lays them out: a
        token-first flatten feeds the projection a permuted vector, a different speaker."""
        z = self.quantizer.output_from_indices(ids[:, :, None])  # [B, 32, latent]
        return self.project(z.transpose(1, 2).reshape(z.shape[0], -1))


class AdaLayerNorm(nn.Module):
    def __init__(self, condition_dim: int, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps, self.dim = eps, dim
        self.scale = nn.Linear(condition_dim, dim)
        self.shift = nn.Linear(condition_dim, dim)
        nn.init.ones_(self.scale.weight)
        nn.init.zeros_(self.shift.weight)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x, (self.dim,), eps=self.eps)
        return x * self.scale(cond)[:, None] + self.shift(cond)[:, None]


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int, intermediate_dim: int, layer_scale: float,
                 condition_dim: int | None) -> None:
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = AdaLayerNorm(condition_dim, dim) if condition_dim else nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, intermediate_dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(intermediate_dim, dim)
        self.gamma = nn.Parameter(layer_scale * torch.ones(dim))

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None) -> torch.Tensor:
        y = self.dwconv(x).transpose(1, 2)
        y = self.norm(y, cond) if isinstance(self.norm, AdaLayerNorm) else self.norm(y)
        y = self.gamma * self.pwconv2(self.act(self.pwconv1(y)))
        return x + y.transpose(1, 2)


class VocosBackbone(nn.Module):
    def __init__(self, input_channels: int, dim: int, intermediate_dim: int, num_layers: int,
                 condition_dim: int | None = None) -> None:
        super().__init__()
        self.embed = nn.Conv1d(input_channels, dim, kernel_size=7, padding=3)
        self.norm = AdaLayerNorm(condition_dim, dim) if condition_dim else nn.LayerNorm(dim, eps=1e-6)
        self.convnext = nn.ModuleList(
            ConvNeXtBlock(dim, intermediate_dim, 1 / num_layers, condition_dim)
            for _ in range(num_layers))
        self.final_layer_norm = nn.LayerNorm(dim, eps=1e-6)
        for m in self.modules():
            if isinstance(m, (nn.Conv1d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        for m in self.modules():
            if isinstance(m, AdaLayerNorm):
                nn.init.ones_(m.scale.weight)
                nn.init.zeros_(m.shift.weight)

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        """[B, C, T] -> [B, T, dim]"""
        x = self.embed(x).transpose(1, 2)
        x = self.norm(x, cond) if isinstance(self.norm, AdaLayerNorm) else self.norm(x)
        x = x.transpose(1, 2)
        for block in self.convnext:
            x = block(x, cond)
        return self.final_layer_norm(x.transpose(1, 2))


class _Resample(nn.Module):
    """Spark's SamplingBlock at ratio 1 (the released prenet): parameter-free identity of
    ``conv + skip + skip``, i.e. 3x its input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 3.0 * x


class Prenet(nn.Module):
    """Spark's feature Decoder, used as BiCodec's prenet (``prenet.*``)."""

    def __init__(self, input_channels: int, vocos_dim: int, vocos_intermediate_dim: int,
                 vocos_num_layers: int, out_channels: int, condition_dim: int | None = None,
                 sample_ratios: Sequence[int] = (1, 1), use_tanh_at_final: bool = False) -> None:
        super().__init__()
        if any(r != 1 for r in sample_ratios):
            raise ValueError("only the released prenet (sample_ratios of 1) is supported")
        self.linear_pre = nn.Linear(input_channels, vocos_dim)
        self.downsample = nn.Sequential(*(
            nn.Sequential(_Resample(), VocosBackbone(vocos_dim, vocos_dim, vocos_intermediate_dim, 2))
            for _ in sample_ratios))
        self.vocos_backbone = VocosBackbone(vocos_dim, vocos_dim, vocos_intermediate_dim,
                                            vocos_num_layers, condition_dim)
        self.linear = nn.Linear(vocos_dim, out_channels)
        self.use_tanh_at_final = use_tanh_at_final

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        x = self.linear_pre(x.transpose(1, 2))
        for resample, backbone in self.downsample:  # [B, T, C] -> [B, C, T] -> [B, T, C]
            x = backbone(resample(x.transpose(1, 2)))
        x = self.vocos_backbone(x.transpose(1, 2), cond)
        x = self.linear(x).transpose(1, 2)
        return torch.tanh(x) if self.use_tanh_at_final else x


class _ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(dim), _wn_conv(dim, dim, kernel_size=7, dilation=dilation, padding=3 * dilation),
            Snake1d(dim), _wn_conv(dim, dim, kernel_size=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class _UpBlock(nn.Module):
    def __init__(self, input_dim: int, output_dim: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(input_dim),
            weight_norm(nn.ConvTranspose1d(input_dim, output_dim, kernel_size=kernel_size,
                                           stride=stride, padding=(kernel_size - stride) // 2)),
            _ResidualUnit(output_dim, 1), _ResidualUnit(output_dim, 3), _ResidualUnit(output_dim, 9))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class WaveGenerator(nn.Module):
    """DAC-style generator (``decoder.*``): 1024-dim latents at 50 Hz -> 16 kHz audio."""

    def __init__(self, input_channel: int, channels: int, rates: Sequence[int],
                 kernel_sizes: Sequence[int], d_out: int = 1) -> None:
        super().__init__()
        layers: list[nn.Module] = [_wn_conv(input_channel, channels, kernel_size=7, padding=3)]
        for i, (k, s) in enumerate(zip(kernel_sizes, rates)):
            layers.append(_UpBlock(channels // 2**i, channels // 2 ** (i + 1), k, s))
        out_dim = channels // 2 ** len(rates)
        layers += [Snake1d(out_dim), _wn_conv(out_dim, d_out, kernel_size=7, padding=3), nn.Tanh()]
        self.model = nn.Sequential(*layers)
        self.hop = math.prod(rates)
        for m in self.modules():
            if isinstance(m, nn.Conv1d):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class BiCodecDecoder(nn.Module):
    """The decode path of ``BiCodec``; submodule names match the official checkpoint."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__()
        cfg = {**DEFAULT_CONFIG, **(config or {})}
        self.quantizer = FactorizedVQ(**cfg["quantizer"])
        self.speaker_encoder = SpeakerDecoder(**cfg["speaker_encoder"])
        self.prenet = Prenet(**cfg["prenet"])
        self.decoder = WaveGenerator(**cfg["decoder"])
        self.num_global_tokens = cfg["speaker_encoder"]["token_num"]

    def detokenize(self, semantic: torch.Tensor, globals_: torch.Tensor) -> torch.Tensor:
        """semantic [B, T], globals [B, 32] -> audio [B, 1, T * 320]."""
        z = self.quantizer.detokenize(semantic)
        speaker = self.speaker_encoder.detokenize(globals_)
        x = self.prenet(z, speaker) + speaker[:, :, None]
        return self.decoder(x)
