"""Finite scalar quantisation's decode side (``vector_quantize_pytorch.ResidualFSQ``'s
layout): indices back to vectors. BiCodec's speaker tokens and NeuCodec's audio codes both
use it, so the implicit codebook is built in one place."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


def level_codes(indices: torch.Tensor, levels: Sequence[int]) -> torch.Tensor:
    """Indices [...] -> their codes [..., len(levels)], each in [-1, 1): digit ``i`` of the
    index in the mixed radix ``levels`` (first level least significant), centred and scaled
    by half its level."""
    lv = torch.tensor(list(levels), device=indices.device)
    basis = torch.cumprod(torch.tensor([1, *levels[:-1]], device=indices.device), 0)
    half = lv // 2
    return (((indices[..., None] // basis) % lv) - half).float() / half


class ResidualFSQ(nn.Module):
    """Residual FSQ indices [..., quantizers] -> vectors [..., dim] (``project_out``)."""

    def __init__(self, levels: Sequence[int], num_quantizers: int, dim: int) -> None:
        super().__init__()
        self.levels = tuple(int(v) for v in levels)
        self.project_out = nn.Linear(len(levels), dim)
        codebook = level_codes(torch.arange(int(torch.tensor(self.levels).prod())), self.levels)
        self.register_buffer("implicit_codebook", codebook, persistent=False)
        lv = torch.tensor(self.levels, dtype=torch.float32)
        scales = torch.stack([(lv - 1) ** -q for q in range(num_quantizers)])
        self.register_buffer("scales", scales, persistent=False)

    @property
    def codebook_size(self) -> int:
        return int(self.implicit_codebook.shape[0])

    def output_from_indices(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, tokens, quantizers] -> [B, tokens, dim]."""
        codes = self.implicit_codebook[ids] * self.scales[None, None]
        return self.project_out(codes.sum(dim=2))
