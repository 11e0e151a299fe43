"""SNAC's decoder noise, made a pure function of (request seed, block, absolute latent step).

SNAC's NoiseBlocks draw ``torch.randn`` on every call, so the same codes decode differently
each time and a window's audio would depend on its batch-mates. Both decoders of this
package (the windowed ``snac`` and the incremental ``snac_streaming``) must draw the same
noise at the same instant, so the draw, the drop-in block and the keys it reads live here.
"""

from __future__ import annotations

import math

import torch
from torch import nn

SEED_MASK = 0x7FFFFFFF
"""Seeds are keyed as 31-bit integers: a request's seed is masked with this first."""

_MASK31 = SEED_MASK


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 31-bit integer hash (xorshift-multiply), exact in int64 without overflow."""
    x = x & _MASK31
    x = ((x >> 15) ^ x) * 0x2C1B3C6D & _MASK31
    x = ((x >> 12) ^ x) * 0x297A2D39 & _MASK31
    return (x >> 15) ^ x


def keyed_normal(seeds: torch.Tensor, salt: int, steps: torch.Tensor) -> torch.Tensor:
    """Standard normal noise that is a pure function of (seed, salt, step); shape [B, T]."""
    key = _mix(seeds.to(torch.int64) * 0x9E37 + salt)[:, None]
    h1 = _mix(key + steps * 2)
    h2 = _mix(key ^ _mix(steps * 2 + 1))
    u1 = (h1.to(torch.float64) + 0.5) / float(1 << 31)
    u2 = (h2.to(torch.float64) + 0.5) / float(1 << 31)
    return (torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)).to(torch.float32)


class NoiseKeys:
    """What the keyed noise blocks need to know about the batch being decoded."""

    def __init__(self) -> None:
        self.seeds: torch.Tensor | None = None
        self.start_steps: torch.Tensor | None = None
        self.steps: int = 1
        self.enabled = True


class KeyedNoiseBlock(nn.Module):
    """Drop-in for ``snac.layers.NoiseBlock`` (same ``linear`` weights), keyed noise.

    ``salt`` tells the blocks of one decoder apart; ``keys`` is shared by all of them and
    set by the caller before each decode."""

    def __init__(self, original: nn.Module, salt: int, keys: NoiseKeys) -> None:
        super().__init__()
        self.linear = original.linear
        self.salt = salt
        self.keys = keys

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keys = self.keys
        if not keys.enabled or keys.seeds is None or keys.start_steps is None:
            return x
        _, _, t = x.shape
        per_step = t // keys.steps
        steps = keys.start_steps[:, None] * per_step + torch.arange(
            t, dtype=torch.int64, device=x.device
        )
        noise = keyed_normal(keys.seeds, self.salt, steps).to(x.dtype)[:, None, :]
        return x + noise * self.linear(x)


def install_keyed_noise(decoder: nn.Module, keys: NoiseKeys) -> None:
    """Replace every ``NoiseBlock`` under ``decoder`` by a ``KeyedNoiseBlock`` reading
    ``keys``, each with a salt of its own (its order in the decoder)."""
    from snac.layers import NoiseBlock

    salt = 0
    for module in list(decoder.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, NoiseBlock):
                salt += 1
                setattr(module, name, KeyedNoiseBlock(child, salt * 7919, keys))
