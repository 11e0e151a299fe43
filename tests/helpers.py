"""Small helpers shared by tests."""

from __future__ import annotations

import asyncio

import numpy as np

from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.stitching import Stitcher
from livekit.plugins.veena.windowing import WindowOptions, WindowPlanner


async def engine_settled(pipeline, timeout: float = 2.0) -> bool:
    """True once the engine holds no live or unfinished request (polled up to ``timeout``)."""
    for _ in range(int(timeout / 0.02)):
        if not pipeline.engine.live_request_ids and pipeline.engine.num_unfinished_requests == 0:
            return True
        await asyncio.sleep(0.02)
    return False


def windowed_decode(codec, codes, opts: WindowOptions, seed: int, crossfade: int,
                    speaker=None) -> tuple[np.ndarray, list]:
    """Decode ``codes`` step by step through the real planner and stitcher."""
    planner = WindowPlanner(opts)
    stitcher = Stitcher(codec.samples_per_step, crossfade)
    windows = []
    for _ in range(len(codes)):
        windows += planner.add(1)
    windows += planner.finish()
    out = []
    for w in windows:
        (audio,) = codec.decode([CodecInput(codes[w.start:w.end], w.start, seed, speaker)])
        out.append(stitcher.push(w, audio))
    out.append(stitcher.finish())
    return np.concatenate(out), windows
