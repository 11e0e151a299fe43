"""SNAC 24 kHz, wrapped for windowed, batched, reproducible decoding.

SNAC's NoiseBlocks draw ``torch.randn`` on every call, so the same codes decode differently
each time and a window's audio would depend on its batch-mates. We replace that draw with
noise keyed by (request seed, block, absolute latent step) (``snac_noise``): overlapping
windows see the same noise at the same instant, a window decodes the same alone or batched,
and windowed decoding converges on the one-pass decode.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from .base import CodecInput
from .cuda_graphs import batch_plan, first_rows, graphed_or_none
from .snac_noise import (
    SEED_MASK,
    NoiseKeys,
    install_keyed_noise,
)
from .snac_streaming import SnacStream, SnacStreamDecoder

logger = logging.getLogger(__name__)

SNAC_24KHZ_CONFIG = {
    "sampling_rate": 24000,
    "encoder_dim": 48,
    "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 1024,
    "decoder_rates": [8, 8, 4, 2],
    "attn_window_size": None,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [4, 2, 1],
    "noise": True,
    "depthwise": True,
}


class SnacCodec:
    """Decodes windows of SNAC frames ([frames, 7] codes in interleave order) to 24 kHz PCM."""

    name = "snac"

    def __init__(
        self,
        model: nn.Module,
        *,
        device: str = "cpu",
        position_levels: Sequence[int] = (0, 1, 2, 2, 1, 2, 2),
        noise: bool = True,
        cuda_graphs: bool = False,
        max_graph_batch: int = 64,
        streaming: bool = False,
    ) -> None:
        """``cuda_graphs``: replay the decoder from a CUDA graph per (padded batch, window
        size) when ``device`` is CUDA (see ``cuda_graphs``); batches above ``max_graph_batch``
        decode eagerly. ``streaming``: decode each request incrementally
        (``snac_streaming``): every step once, the one-pass audio; no CUDA graphs."""
        self.model = model.to(device).eval().float()
        self.device = torch.device(device)
        self.sample_rate = int(model.sampling_rate)
        self.samples_per_step = int(np.prod(model.decoder_rates)) * int(model.vq_strides[0])
        levels = np.asarray(position_levels)
        self._level_cols = [np.flatnonzero(levels == lv) for lv in range(len(model.vq_strides))]
        self._keys = NoiseKeys()
        self._keys.enabled = noise
        install_keyed_noise(self.model.decoder, self._keys)
        self.max_graph_batch = max_graph_batch
        self.streams = SnacStreamDecoder(self.model, self._level_cols, self.device,
                                         self.samples_per_step) if streaming else None
        self.graphs = graphed_or_none(self._decode_tensors, self.device,
                                      cuda_graphs and not streaming, name="snac")

    @property
    def lookahead_steps(self) -> int | None:
        """Streaming: steps after a step whose audio is final (a window's right context)."""
        return self.streams.lookahead_steps if self.streams else None

    def new_stream(self, seed: int) -> SnacStream | None:
        """A request's decoder state where this codec streams (None: it decodes windows)."""
        return self.streams.new_stream(seed) if self.streams else None

    @classmethod
    def load(cls, model: str, *, device: str = "cpu", **kwargs) -> "SnacCodec":
        """Load ``hubertsiuzdak/snac_24khz`` (or a local folder) through ``SNAC.from_pretrained``."""
        from snac import SNAC

        logger.info("loading SNAC codec", extra={"codec_model": model, "device": device})
        return cls(SNAC.from_pretrained(model), device=device, **kwargs)

    @classmethod
    def random(cls, *, seed: int = 0, device: str = "cpu", **kwargs) -> "SnacCodec":
        """The 24 kHz architecture with random weights (tests and benchmarks)."""
        from snac import SNAC

        torch.manual_seed(seed)
        return cls(SNAC(**SNAC_24KHZ_CONFIG), device=device, **kwargs)

    def _levels(self, frames: np.ndarray) -> list[np.ndarray]:
        return [frames[:, cols].reshape(-1) for cols in self._level_cols]

    def _decode_tensors(self, seeds: torch.Tensor, start_steps: torch.Tensor,
                        *codes: torch.Tensor) -> torch.Tensor:
        """Codes per level [B, n] (on the device) -> audio [B, samples]; a pure function of
        its tensors, so it can be captured as a CUDA graph."""
        self._keys.seeds = seeds
        self._keys.start_steps = start_steps
        self._keys.steps = codes[0].shape[1] // len(self._level_cols[0])
        return self.model.decode(list(codes))[:, 0, :]

    def batch_call(self, batch: Sequence[CodecInput]
                   ) -> tuple[Callable[..., torch.Tensor], list[torch.Tensor]]:
        """The decode call for ``batch`` and its device tensors: the graph's, with the batch
        padded to its bucket, or the eager one. Audio rows past ``len(batch)`` are padding."""
        n = len(batch)
        call, rows = batch_plan(self.graphs, self._decode_tensors, n, self.max_graph_batch)
        per_item = [self._levels(np.asarray(item.codes)) for item in batch]
        seeds = np.zeros(rows, dtype=np.int64)
        seeds[:n] = [item.seed & SEED_MASK for item in batch]
        starts = np.zeros(rows, dtype=np.int64)
        starts[:n] = [item.start_step for item in batch]
        arrays = [seeds, starts]
        for lv in range(len(self._level_cols)):
            level = np.zeros((rows, per_item[0][lv].shape[0]), dtype=np.int64)
            level[:n] = np.stack([levels[lv] for levels in per_item])
            arrays.append(level)
        return call, [torch.from_numpy(a).to(self.device) for a in arrays]

    @torch.inference_mode()
    def decode(self, batch: Sequence[CodecInput]) -> list[np.ndarray]:
        if not batch:
            return []
        if batch[0].stream is not None:
            return self.streams.decode(batch)
        call, inputs = self.batch_call(batch)
        return first_rows(call(*inputs), len(batch))

    def blank_window(self, steps: int, seed: int = 0) -> CodecInput:
        """A window of ``steps`` all-zero frames (warm-up and graph captures)."""
        frames = np.zeros((steps, sum(len(c) for c in self._level_cols)), dtype=np.int64)
        return CodecInput(codes=frames, start_step=0, seed=seed)

    def warmup(self) -> None:
        self.decode([self.blank_window(4)])
