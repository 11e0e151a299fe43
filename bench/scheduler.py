"""Benchmark 4: the shared decode scheduler under 1, 4 and 16 concurrent streams.

Each stream is fed SNAC frames at the real-time token rate (82 tokens/s, a frame every
85.3 ms) by a fake token source; windows go through the real planner, scheduler, SNAC codec
(random init) and stitcher. Reported: batch sizes, first audio p50/p95, and underruns: a
chunk arriving after the listener's buffer ran dry (playout starts at first audio).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
import torch

from _common import report, setup
from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.codecs.snac import SnacCodec
from livekit.plugins.veena.scheduler import DecodeScheduler, SchedulerOptions
from livekit.plugins.veena.stitching import Stitcher
from livekit.plugins.veena.windowing import WindowOptions, WindowPlanner

SPF, RATE = 2048, 24000


async def one_stream(sched, sid: int, frames: int, frame_period: float, opts: WindowOptions):
    """Feed one stream at ``frame_period`` s per frame; return (first audio s, underruns, silence s)."""
    rng = np.random.default_rng(sid)
    codes = rng.integers(0, 4096, (frames, 7))
    planner, stitcher = WindowPlanner(opts), Stitcher(SPF, 240)
    queue: asyncio.Queue = asyncio.Queue()
    start = time.perf_counter()

    async def feed():
        for k in range(frames):
            await asyncio.sleep(max(0.0, start + (k + 1) * frame_period - time.perf_counter()))
            for w in planner.add(1):
                queue.put_nowait((w, sched.submit(f"s{sid}", CodecInput(codes[w.start:w.end], w.start, sid))))
        for w in planner.finish():
            queue.put_nowait((w, sched.submit(f"s{sid}", CodecInput(codes[w.start:w.end], w.start, sid))))
        queue.put_nowait(None)

    feeder = asyncio.create_task(feed())
    first_audio, playout_start, played, underruns, silence = None, 0.0, 0.0, 0, 0.0
    while (item := await queue.get()) is not None:
        w, fut = item
        pcm = stitcher.push(w, await fut)
        now = time.perf_counter()
        if first_audio is None:
            first_audio = playout_start = now
        elif now > playout_start + played:  # the buffer ran dry before this chunk arrived
            underruns += 1
            gap = now - (playout_start + played)
            silence += gap
            playout_start += gap
        played += len(pcm) / RATE
    await feeder
    return first_audio - start, underruns, silence


async def run(codec, streams: int, seconds: float, opts: WindowOptions,
              sched_opts: SchedulerOptions, speed: float = 1.0):
    """``speed``: token rate as a multiple of real time (1.0 = exactly 82 tokens/s)."""
    sched = DecodeScheduler(codec, sched_opts)
    frames = int(seconds * RATE / SPF)
    results = await asyncio.gather(*(one_stream(sched, i, frames, SPF / RATE / speed, opts)
                                     for i in range(streams)))
    await sched.aclose()
    fa = np.array([r[0] for r in results]) * 1000
    sizes = sched.stats.batch_sizes
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
    rows = [asyncio.run(run(codec, int(n), args.seconds, WindowOptions(), SchedulerOptions(), speed))
            for speed in (1.0, 2.0) for n in args.streams.split(",")]
    report("scheduler", rows, {"seconds_per_stream": args.seconds, "device": args.device})


if __name__ == "__main__":
    main()
