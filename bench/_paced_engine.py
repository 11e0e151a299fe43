"""A token source paced like an engine at a chosen rate, with the interface the pipeline
uses: benchmarks about decoding drive the product's own Pipeline with it, without vLLM's
speed (or noise) in the figures. Random SNAC frames, seeded by the request's seed."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import AsyncIterator, Sequence

import numpy as np

from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.pipeline.adapters import AdapterSet
from livekit.plugins.veena.pipeline.engine import (
    EngineHealth,
    EngineOptions,
    SamplingOptions,
)


class _Tokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1 + b % 250 for b in text.encode()]


@dataclass
class PacedEngine:
    frame_period_s: float
    """Seconds between frames (2048 / 24000 / speed for a ``speed`` x real-time token rate)."""

    def __post_init__(self) -> None:
        self.options = EngineOptions(model="paced", max_model_len=1 << 20)
        self.tokenizer = _Tokenizer()
        self.adapters = AdapterSet()  # none: the paced engine applies no LoRA
        self.last_output = time.monotonic()
        self.started = True
        self.health = EngineHealth("ready")
        self._ids = itertools.count()

    async def start(self, timeout: float | None = None) -> None:
        return None

    def new_request_id(self, prefix: str = "paced") -> str:
        return f"{prefix}-{next(self._ids)}"

    async def generate(self, prompt: Sequence[int], sampling: SamplingOptions,
                       request_id: str | None = None) -> AsyncIterator[list[int]]:
        """One 7-token frame every ``frame_period_s``, ``max_tokens // 7`` frames."""
        rng = np.random.default_rng(sampling.seed)
        start = time.perf_counter()
        for k in range((sampling.max_tokens or 0) // 7):
            await asyncio.sleep(max(0.0, start + (k + 1) * self.frame_period_s - time.perf_counter()))
            codes = rng.integers(0, 4096, 7)
            self.last_output = time.monotonic()
            yield [VEENA.audio_token_base + p * 4096 + int(c) for p, c in enumerate(codes)]

    async def aclose(self) -> None:
        return None
