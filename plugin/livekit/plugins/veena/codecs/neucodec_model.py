"""NeuCodec's decode side (NeuTTS Air; XCodec2 is the same decoder at 16 kHz), written here
with the published checkpoint's parameter names, so ``pytorch_model.bin`` of
``neuphonic/neucodec`` loads into it directly.

FSQ index -> ``generator.quantizer.project_out`` -> ``fc_post_a`` -> a Vocos backbone (a
convolution, two ResNet blocks, transformer blocks with bidirectional attention, two ResNet
blocks, LayerNorm) -> an iSTFT head (n_fft = 4 hops, "same" padding). GroupNorm and attention
span the whole window, so every sample depends on every frame: there is no exact streaming.

The reference (``neucodec`` 0.0.6) hands the transformer's rotary embedding (torchtune's,
which expects ``[b, s, h, d]``) tensors laid out ``[b, h, t, d]``: each head is rotated by an
angle of its head index, the same at every time step, for queries and keys alike, so the
attention scores are unchanged. This port therefore has no rotary embedding;
``tests/codecs/test_neucodec_golden.py`` proves the outputs equal.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Mapping

import torch
from torch import nn
from torch.nn import functional as F

from .fsq import ResidualFSQ

logger = logging.getLogger(__name__)

CONFIG_FILE = "veena_codec.json"
"""Sizes of a checkpoint that is not the published size (tiny test models); the published
checkpoints have none and take the defaults."""


@dataclass(frozen=True)
class NeuCodecConfig:
    """The decoder's sizes; the defaults are the published NeuCodec's."""

    hidden_dim: int = 1024
    depth: int = 12
    heads: int = 16
    vq_dim: int = 2048
    levels: tuple[int, ...] = (4,) * 8
    hop_length: int = 480
    sample_rate: int = 24000

    @property
    def n_fft(self) -> int:
        return 4 * self.hop_length

    @property
    def codebook_size(self) -> int:
        size = 1
        for level in self.levels:
            size *= level
        return size

    def validate(self) -> "NeuCodecConfig":
        for f in fields(self):
            value = getattr(self, f.name)
            values = value if isinstance(value, tuple) else (value,)
            if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                                 for v in values):
                raise ValueError(f"NeuCodec config {f.name} must be positive integers, "
                                 f"not {value!r}")
        if self.hidden_dim % 32 or self.hidden_dim % self.heads:
            raise ValueError("NeuCodec hidden_dim must divide by 32 (GroupNorm) and by heads")
        return self

    @classmethod
    def tiny(cls) -> "NeuCodecConfig":
        """A few-MB decoder of the same structure, for tests and tiny models."""
        return cls(hidden_dim=64, depth=2, heads=4, vq_dim=32)

    @classmethod
    def from_dict(cls, data: Mapping) -> "NeuCodecConfig":
        if not isinstance(data, Mapping):
            raise ValueError("NeuCodec config must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"NeuCodec config has unknown keys {sorted(unknown)}")
        values = dict(data)
        if "levels" in values:
            if not isinstance(values["levels"], (list, tuple)):
                raise ValueError("NeuCodec config levels must be a list of integers")
            values["levels"] = tuple(values["levels"])
        return cls(**values).validate()

    def to_dict(self) -> dict:
        return {**asdict(self), "levels": list(self.levels)}


XCODEC2_CONFIG = NeuCodecConfig(hop_length=320, sample_rate=16000)
"""XCodec2 (Llasa): the same decoder at 16 kHz, hop 320 (``xcodec2`` 0.1.5's golden output:
``tests/codecs/test_neucodec_golden.py``)."""


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


class _Attention(nn.Module):
    """Bidirectional multi-head self-attention over the whole window."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim, bias=False)
        self.c_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class _MLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim, bias=False)
        self.fc2 = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.silu(self.fc1(x)))


class _TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.att_norm = _RMSNorm(dim)
        self.ffn_norm = _RMSNorm(dim)
        self.att = _Attention(dim, heads)
        self.mlp = _MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.att(self.att_norm(x))
        return x + self.mlp(self.ffn_norm(x))


class _ResnetBlock(nn.Module):
    """GroupNorm (32 groups, over the whole window) -> swish -> conv, twice, plus the input."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(32, dim, eps=1e-6)
        self.conv1 = nn.Conv1d(dim, dim, kernel_size=3, padding=1)
        self.norm2 = nn.GroupNorm(32, dim, eps=1e-6)
        self.conv2 = nn.Conv1d(dim, dim, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        return x + self.conv2(F.silu(self.norm2(h)))


class _Backbone(nn.Module):
    def __init__(self, c: NeuCodecConfig) -> None:
        super().__init__()
        dim = c.hidden_dim
        self.embed = nn.Conv1d(dim, dim, kernel_size=7, padding=3)
        self.prior_net = nn.Sequential(_ResnetBlock(dim), _ResnetBlock(dim))
        self.transformers = nn.Sequential(*[_TransformerBlock(dim, c.heads)
                                            for _ in range(c.depth)])
        self.final_layer_norm = nn.LayerNorm(dim, eps=1e-6)
        self.post_net = nn.Sequential(_ResnetBlock(dim), _ResnetBlock(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, dim, T] -> [B, T, dim]."""
        x = self.prior_net(self.embed(x))
        x = self.transformers(x.transpose(1, 2)).transpose(1, 2)
        return self.final_layer_norm(self.post_net(x).transpose(1, 2))


class _ISTFT(nn.Module):
    """Inverse STFT with "same" padding: T frames -> T hops of samples (torch.istft pads
    only as ``center``, whose edges fail its overlap check here)."""

    def __init__(self, n_fft: int, hop: int) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        # the checkpoint's copy (``generator.head.istft.window``) is this same window
        self.register_buffer("window", torch.hann_window(n_fft), persistent=False)

    def forward(self, spec: torch.Tensor) -> torch.Tensor:
        """Complex [B, n_fft // 2 + 1, T] -> [B, T * hop]."""
        frames = torch.fft.irfft(spec, self.n_fft, dim=1) * self.window[None, :, None]
        t = spec.shape[-1]
        length = (t - 1) * self.hop + self.n_fft
        pad = (self.n_fft - self.hop) // 2

        def overlap_add(x: torch.Tensor) -> torch.Tensor:
            return F.fold(x, output_size=(1, length), kernel_size=(1, self.n_fft),
                          stride=(1, self.hop))[:, 0, 0, pad:length - pad]

        envelope = self.window.square()[None, :, None].expand(1, -1, t)
        return overlap_add(frames) / overlap_add(envelope)


class _Head(nn.Module):
    def __init__(self, dim: int, n_fft: int, hop: int) -> None:
        super().__init__()
        self.out = nn.Linear(dim, n_fft + 2)
        self.istft = _ISTFT(n_fft, hop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, dim] -> [B, T * hop]: log-magnitude (capped at 100) and phase per bin."""
        log_mag, phase = self.out(x).transpose(1, 2).chunk(2, dim=1)
        mag = torch.exp(log_mag).clamp(max=1e2)
        return self.istft(torch.polar(mag, phase))


class _Generator(nn.Module):
    """``generator.*`` of the checkpoint, its decode side."""

    def __init__(self, c: NeuCodecConfig) -> None:
        super().__init__()
        self.quantizer = ResidualFSQ(c.levels, 1, c.vq_dim)
        self.backbone = _Backbone(c)
        self.head = _Head(c.hidden_dim, c.n_fft, c.hop_length)


class NeuCodecDecoder(nn.Module):
    """FSQ codes [B, T] -> audio [B, T * hop] (``NeuCodec.decode_code``)."""

    def __init__(self, config: NeuCodecConfig | None = None) -> None:
        super().__init__()
        self.config = (config or NeuCodecConfig()).validate()
        self.generator = _Generator(self.config)
        self.fc_post_a = nn.Linear(self.config.vq_dim, self.config.hidden_dim)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        emb = self.fc_post_a(self.generator.quantizer.output_from_indices(codes[..., None]))
        return self.generator.head(self.generator.backbone(emb.transpose(1, 2)))


_DECODER_PREFIXES = ("generator.quantizer.project_out.", "generator.backbone.",
                     "generator.head.", "fc_post_a.")


def read_state(path: Path) -> dict[str, torch.Tensor]:
    """A checkpoint file's tensors: ``*.safetensors`` or a torch pickle read with
    ``weights_only`` (no code runs from the file)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"{path} is not a NeuCodec state dict")
    return state


def checkpoint_file(folder: Path) -> Path:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return folder / name
    raise ValueError(f"{folder} has no NeuCodec checkpoint (model.safetensors or "
                     "pytorch_model.bin)")


def read_config(folder: Path, default: NeuCodecConfig | None = None) -> NeuCodecConfig:
    """``veena_codec.json``'s sizes where the folder has one, else ``default`` (the
    published sizes)."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        return default or NeuCodecConfig()
    try:
        return NeuCodecConfig.from_dict(json.loads(path.read_text("utf-8")))
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from None


def load_decoder(folder: Path, config: NeuCodecConfig | None = None) -> NeuCodecDecoder:
    """The decoder from a checkpoint folder in the published layout (encoder tensors and
    ``fc_post_s``/``SemanticDecoder`` ignored); ValueError naming the first tensor that is
    missing or of another shape than ``config``'s."""
    model = NeuCodecDecoder(read_config(folder, config))
    path = checkpoint_file(folder)
    state = {k: v for k, v in read_state(path).items()
             if k.startswith(_DECODER_PREFIXES) and k != "generator.head.istft.window"}
    load_checked(model, state, f"NeuCodec checkpoint {path} ({model.config})")
    unknown = sorted(set(state) - set(model.state_dict()))
    if unknown:  # the reference loads non-strictly ("once we clean up the checkpoints")
        logger.warning("NeuCodec checkpoint has tensors this decoder does not use",
                       extra={"codec_model": str(path), "tensors": unknown[:8],
                              "count": len(unknown)})
    return model.eval()


def load_checked(module: nn.Module, state: Mapping[str, torch.Tensor], where: str) -> None:
    """Load every tensor ``module`` has from ``state`` (in float32); ValueError naming the
    first one missing or of another shape. Tensors it does not have are left alone."""
    expected = module.state_dict()
    for key, tensor in expected.items():
        if key not in state:
            raise ValueError(f"{where} lacks {key}")
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise ValueError(f"{where}: {key} has shape {tuple(state[key].shape)}, "
                             f"expected {tuple(tensor.shape)}")
    module.load_state_dict({k: state[k].float() for k in expected})
