"""The contract every codec meets, so the decode scheduler can batch windows of any codec."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Protocol, Sequence

import numpy as np


@dataclass
class CodecInput:
    """One window: codec steps (SNAC frames or BiCodec semantic tokens) of one request."""

    codes: np.ndarray
    """SNAC: int array [frames, 7] in interleave order; BiCodec: int array [tokens]."""
    start_step: int
    """Index of ``codes[0]`` in the utterance, so position-keyed noise matches one pass."""
    seed: int
    speaker: np.ndarray | None = None
    """BiCodec: the 32 global ids of the utterance; unused by SNAC."""

    def batch_key(self) -> Hashable:
        return self.codes.shape


class Codec(Protocol):
    name: str
    sample_rate: int
    samples_per_step: int

    def decode(self, batch: Sequence[CodecInput]) -> list[np.ndarray]:
        """Decode windows that share ``batch_key()``; one float32 array per window."""
        ...

    def warmup(self) -> None: ...
