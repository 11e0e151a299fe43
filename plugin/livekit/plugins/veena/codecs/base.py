"""The contract every codec meets, so the decode scheduler can batch windows of any codec."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Protocol, Sequence

import numpy as np


@dataclass(frozen=True)
class StreamPart:
    """What one window does to its stream: feed the steps of its codes past the first
    ``skip`` (fed by earlier windows), end the stream after them (``flush``: no step
    follows), and hand out the audio through step ``keep_end`` (everything left when
    ``last``)."""

    stream: Any
    """The request's decoder state (``snac_streaming.SnacStream``)."""
    skip: int
    keep_end: int
    flush: bool
    last: bool


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
    stream: StreamPart | None = None
    """A streaming codec's part of its request's stream: the codec decodes only the steps
    it has not seen and keeps its state there."""
    context_steps: int = 0
    """The first ``context_steps`` of ``codes`` come before the utterance (NeuCodec: the
    reference clip's last codes, the first windows' left context): decoded, but the window's
    audio starts after them, at ``start_step``."""

    def batch_key(self) -> Hashable:
        if self.stream is not None:  # a hint: the codec regroups by the streams' real state
            return ("stream", self.work_steps, self.stream.flush, self.start_step == 0)
        if self.context_steps:
            return (*self.codes.shape, self.context_steps)
        return self.codes.shape

    @property
    def work_steps(self) -> int:
        """Steps the codec decodes for this window (a stream's steps already fed: none)."""
        return self.codes.shape[0] - (self.stream.skip if self.stream is not None else 0)

    @property
    def cost_steps(self) -> int:
        """The window shape whose measured cost this window's decode is (planners ask
        for a window of ``size`` new steps plus its context): its steps; for a stream, the
        steps it decodes plus its right context, so a first window (all of its steps new)
        counts as the steady window that decodes as many, not as a cheap one-step one."""
        if self.stream is None:
            return int(self.codes.shape[0])
        right = self.start_step + self.codes.shape[0] - self.stream.keep_end
        return self.work_steps + max(0, right)


class Codec(Protocol):
    name: str
    sample_rate: int
    samples_per_step: int

    def decode(self, batch: Sequence[CodecInput]) -> list[np.ndarray]:
        """Decode windows that share ``batch_key()``; one float32 array per window."""
        ...

    def warmup(self) -> None: ...
