"""Benchmark 4: the shared decode scheduler under 1, 4 and 16 concurrent streams.

Each stream is the product's own ``Pipeline.synthesize`` (request run, planner, decode
scheduler, SNAC codec with random init, stitcher) fed by a paced token source at the
real-time token rate (82 tokens/s, a frame every 85.3 ms) or a multiple of it. Reported:
batch sizes, first audio p50/p95, and underruns: a chunk arriving after the listener's buffer
ran dry (playout starts at first audio).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
import torch

from _common import report, setup
from _paced_engine import PacedEngine
from livekit.plugins.veena.codecs.snac import SnacCodec
from livekit.plugins.veena.engine import SamplingOptions
from livekit.plugins.veena.pipeline import Pipeline, PipelineOptions
from livekit.plugins.veena.profiles import VEENA
from livekit.plugins.veena.scheduler import SchedulerOptions

SPF, RATE = 2048, 24000


async def one_stream(pipeline: Pipeline, sid: int, frames: int):
    """Listen to one stream; return (first audio s, underruns, silence s)."""
    syn = pipeline.synthesize("x" * (frames + 8), sampling=SamplingOptions(max_tokens=frames * 7),
                              seed=sid)
    start = time.perf_counter()
    first_audio, playout_start, played, underruns, silence = None, 0.0, 0.0, 0, 0.0
    async for chunk in syn:
        now = time.perf_counter()
        if first_audio is None:
            first_audio = playout_start = now
        elif now > playout_start + played:  # the buffer ran dry before this chunk arrived
            underruns += 1
            gap = now - (playout_start + played)
            silence += gap
            playout_start += gap
        played += len(chunk.pcm) / RATE
    return first_audio - start, underruns, silence


async def run(codec, streams: int, seconds: float, sched_opts: SchedulerOptions,
              speed: float = 1.0):
    """``speed``: token rate as a multiple of real time (1.0 = exactly 82 tokens/s)."""
    pipeline = Pipeline(PacedEngine(SPF / RATE / speed), codec, VEENA,
                        PipelineOptions(scheduler=sched_opts))
    frames = int(seconds * RATE / SPF)
    results = await asyncio.gather(*(one_stream(pipeline, i, frames) for i in range(streams)))
    await pipeline.aclose()
    fa = np.array([r[0] for r in results]) * 1000
    sizes = pipeline.scheduler.stats.batch_sizes
    return {"streams": streams, "token_rate_x_realtime": speed,
            "first_audio_p50_ms": float(np.percentile(fa, 50)),
            "first_audio_p95_ms": float(np.percentile(fa, 95)),
            "mean_batch": sum(k * v for k, v in sizes.items()) / max(1, sum(sizes.values())),
            "max_batch": max(sizes) if sizes else 0,
            "underruns": int(sum(r[1] for r in results)),
            "silence_s_per_stream": float(np.mean([r[2] for r in results]))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    setup()
    torch.set_num_threads(args.threads)
    codec = SnacCodec.random(device=args.device)
    codec.warmup()
    rows = [asyncio.run(run(codec, int(n), args.seconds, SchedulerOptions(), speed))
            for speed in (1.0, 2.0) for n in args.streams.split(",")]
    report("scheduler", rows, {"seconds_per_stream": args.seconds, "device": args.device})


if __name__ == "__main__":
    main()
