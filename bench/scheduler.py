"""Benchmark 4: windows that follow the listener against the fixed ramp, on the product's
decode path.

Each stream is the product's own ``Pipeline.synthesize`` (request run, window planner,
decode scheduler, SNAC codec with random init, stitcher) fed by a paced token source at a
multiple of the real-time token rate (1.0 = 82 tokens/s, a frame every 85.3 ms; ``inf`` = all
tokens at once). Each row runs both planners in one process, one after the other, on the same
codec: ``ramp`` is the fixed 2, 2, 4, 8, 8... ramp with batches up to 16, ``adaptive`` the
listener-paced planner with the measured batch limit (the defaults). Reported per mode: first
audio, gaps the listener hears after first audio (it plays what it has and pauses when dry),
and decode work per kept step (``decoded_per_kept``: 1.0 is a one-pass decode).
"""

from __future__ import annotations

import argparse
import asyncio
import math

import numpy as np
import torch
from _common import listen, report, setup
from _paced_engine import PacedEngine

from livekit.plugins.veena.codecs.snac import SnacCodec
from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.pipeline.engine_options import SamplingOptions
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions
from livekit.plugins.veena.pipeline.scheduler import SchedulerOptions
from livekit.plugins.veena.pipeline.windowing import WindowOptions

SPF, RATE = 2048, 24000
MODES = {
    "ramp": PipelineOptions(adaptive_windows=False, scheduler=SchedulerOptions(adaptive_batch=False)),
    "adaptive": PipelineOptions(),
    # the first window larger (VEENA_SNAC_WINDOW_FIRST): first audio later by the extra
    # frames, and every later window may be that large without a gap at exactly real time
    "adaptive_first4": PipelineOptions(snac_window=WindowOptions(first=4, new=8, left=2, right=2)),
    "adaptive_first8": PipelineOptions(snac_window=WindowOptions(first=8, new=8, left=2, right=2)),
}


async def run(codec, mode: str, streams: int, seconds: float, speed: float) -> dict:
    period = 0.0 if math.isinf(speed) else SPF / RATE / speed
    pipeline = Pipeline(PacedEngine(period), codec, VEENA, MODES[mode])
    frames = int(seconds * RATE / SPF)
    sampling = SamplingOptions(max_tokens=frames * 7)
    results = await asyncio.gather(*(
        listen(pipeline.synthesize("x" * (frames + 8), sampling=sampling, seed=i), RATE)
        for i in range(streams)))
    await pipeline.aclose()
    stats = pipeline.scheduler.stats
    fa = np.array([r[0] for r in results]) * 1000
    sizes = stats.batch_sizes
    return {"mode": mode, "streams": streams,
            "token_rate_x_realtime": None if math.isinf(speed) else speed,  # None: all at once
            "first_audio_p50_ms": float(np.percentile(fa, 50)),
            "first_audio_p95_ms": float(np.percentile(fa, 95)),
            "gap_s_after_first_audio": float(np.mean([r[1] for r in results])),
            "decoded_per_kept": stats.decoded_steps / (frames * streams),
            "windows": stats.windows,
            "mean_batch": stats.windows / max(1, stats.batches),
            "max_batch": max(sizes) if sizes else 0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", default="1,4")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--speeds", default="0.9,1.0,1.2,2.0,inf",
                    help="token rates as multiples of real time; inf: all tokens at once")
    ap.add_argument("--modes", default="ramp,adaptive",
                    help="planners to run, of: " + ", ".join(MODES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    setup()
    torch.set_num_threads(args.threads)
    codec = SnacCodec.random(device=args.device)
    codec.warmup()
    rows = [asyncio.run(run(codec, mode, int(n), args.seconds, float(speed)))
            for n in args.streams.split(",") for speed in args.speeds.split(",")
            for mode in args.modes.split(",")]
    report("scheduler", rows, {"seconds_per_stream": args.seconds, "device": args.device,
                               "threads": args.threads})


if __name__ == "__main__":
    main()
