"""CUDA graphs for a codec's decode call, one per input shape.

A SNAC decode issues about 670 small kernels whatever the batch size, so on a GPU the host
CPU that launches them bounds how many windows a process decodes per second, not the GPU. The
planner uses a small fixed set of window sizes and the scheduler batches up to a power of two,
so the shapes repeat: each is captured once and then replayed with one launch. Off on CPU.

A capture that fails, or whose replay differs from the eager call it was captured from, turns
graphs off for that codec (a logged warning, then plain eager calls): a graph can only make
decoding cheaper, never different.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

logger = logging.getLogger(__name__)

Shape = tuple[tuple[tuple[int, ...], torch.dtype], ...]


def batch_bucket(n: int, max_bucket: int) -> int | None:
    """The padded batch size a graph is captured for: the next power of two, or None above
    ``max_bucket`` (such a batch runs eagerly)."""
    bucket = 1 << max(0, n - 1).bit_length()
    return bucket if bucket <= max_bucket else None


def batch_plan(graphs: "GraphedCall | None", eager: Callable[..., torch.Tensor], n: int,
               max_bucket: int) -> tuple[Callable[..., torch.Tensor], int]:
    """The call for a batch of ``n`` windows and how many rows to give it: the graph's, with
    the batch padded to its bucket, or the eager one with ``n`` rows."""
    rows = batch_bucket(n, max_bucket) if graphs is not None else None
    return (graphs, rows) if graphs is not None and rows is not None else (eager, n)


def first_rows(audio: torch.Tensor, n: int) -> list[np.ndarray]:
    """Audio [rows, samples] on any device -> its first ``n`` rows (the rest is padding).
    On CUDA the decode thread sleeps until the GPU is done (a blocking-sync event) instead
    of spinning inside the copy, which counts the GPU's whole decode time as host CPU."""
    rows = audio[:n].float()
    if rows.is_cuda:
        done = torch.cuda.Event(blocking=True)
        done.record()
        done.synchronize()
    return list(rows.cpu().numpy())


@dataclass
class GraphStats:
    captures: int = 0
    replays: int = 0
    eager_calls: int = 0


@dataclass
class _Captured:
    graph: "torch.cuda.CUDAGraph"
    inputs: tuple[torch.Tensor, ...]
    output: torch.Tensor


class GraphedCall:
    """``fn(*tensors) -> tensor`` on CUDA, replayed from a graph captured per input shape.

    ``fn`` must be a pure function of its tensor inputs with fixed shapes (no host sync, no
    data-dependent shapes). Every graph shares one memory pool and may be replayed in any
    order, so a replay's output is copied out of the pool before it is returned (another
    graph's replay may reuse that memory)."""

    def __init__(self, fn: Callable[..., torch.Tensor], *, name: str, max_graphs: int = 64,
                 atol: float = 1e-4) -> None:
        self._fn = fn
        self._name = name
        self._max_graphs = max_graphs
        self._atol = atol
        self._graphs: dict[Shape, _Captured] = {}
        self._pool = None
        self._lock = threading.Lock()
        self.enabled = True
        self.stats = GraphStats()

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        shape: Shape = tuple((tuple(t.shape), t.dtype) for t in inputs)
        with self._lock:
            captured = self._graphs.get(shape)
            if captured is None and self.enabled and len(self._graphs) < self._max_graphs:
                captured = self._capture(shape, inputs)
            if captured is None:
                self.stats.eager_calls += 1
                return self._fn(*inputs)
            for static, value in zip(captured.inputs, inputs):
                static.copy_(value)
            captured.graph.replay()
            self.stats.replays += 1
            return captured.output.clone()

    def _capture(self, shape: Shape, inputs: Sequence[torch.Tensor]) -> _Captured | None:
        """Warm up on a side stream (as PyTorch requires), capture, then check one replay
        against the eager result on the same inputs. A graph records CUDA work only: a call
        on CPU tensors would capture nothing and replay its first answer for every input (seen
        on a GPU machine), so such a call is never captured."""
        try:
            if not all(t.is_cuda for t in inputs):
                raise ValueError("CUDA graphs record CUDA work only; inputs are on "
                                 + ", ".join(sorted({str(t.device) for t in inputs})))
            static = tuple(t.detach().clone() for t in inputs)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    expected = self._fn(*static).clone()
            torch.cuda.current_stream().wait_stream(side)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                output = self._fn(*static)
            graph.replay()
            diff = float((output.float() - expected.float()).abs().max()) if output.numel() else 0.0
        except Exception:  # noqa: BLE001 - any capture failure means: decode eagerly
            logger.warning("CUDA graph capture failed; decoding without graphs",
                           extra={"codec": self._name, "shape": str(shape)}, exc_info=True)
            self.enabled = False
            return None
        if not diff <= self._atol:
            logger.warning("CUDA graph replay differs from the eager decode; decoding without "
                           "graphs", extra={"codec": self._name, "shape": str(shape),
                                            "max_abs_diff": diff})
            self.enabled = False
            return None
        captured = _Captured(graph, static, output)
        self._graphs[shape] = captured
        self.stats.captures += 1
        logger.info("captured a CUDA graph", extra={"codec": self._name, "shape": str(shape),
                                                    "graphs": len(self._graphs)})
        return captured


def batch_buckets(max_batch: int, max_bucket: int) -> list[int]:
    """The padded sizes that batches of 1 to ``max_batch`` windows replay at (a batch of 3
    replays as 4); batches past ``max_bucket`` decode eagerly."""
    buckets = {batch_bucket(n, max_bucket) for n in range(1, max_batch + 1)}
    return sorted(b for b in buckets if b is not None)


def capture_windows(codec, window_steps: Sequence[int], max_batch: int) -> int:
    """Capture now, before any stream, the graph of every (batch bucket up to ``max_batch``,
    window of ``window_steps``) shape: a capture while serving holds the decode thread for
    tens of milliseconds, and every stream's next window waits behind it. ``codec`` has
    ``graphs``, ``max_graph_batch``, ``blank_window(steps, seed)`` and ``decode``. Returns how
    many graphs were captured."""
    graphs = codec.graphs
    if graphs is None:
        return 0
    before = graphs.stats.captures
    for rows in batch_buckets(max_batch, codec.max_graph_batch):
        for steps in window_steps:
            codec.decode([codec.blank_window(steps, seed=i) for i in range(rows)])
    return graphs.stats.captures - before


def graphed_or_none(fn: Callable[..., torch.Tensor], device: torch.device, enabled: bool, *,
                    name: str) -> GraphedCall | None:
    """A ``GraphedCall`` where graphs are asked for and the device is CUDA, else None."""
    if not enabled or device.type != "cuda":
        return None
    return GraphedCall(fn, name=name)
