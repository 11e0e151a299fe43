"""Benchmark 5: end to end on the real vLLM engine (tiny random Veena-layout model).

First-audio breakdown per request (queueing + prefill, first window fill, first decode,
emit), real-time factor, the gaps a listener hears after first audio and decode work per kept
step, for requests alone and 4 at once, with the fixed window ramp and with listener-paced
windows (the default), on one engine.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import replace

import numpy as np
from _common import listen, model_dir, report, setup

from livekit.plugins.veena.models.loading import load_pipeline
from livekit.plugins.veena.pipeline.engine_options import EngineOptions
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions
from livekit.plugins.veena.pipeline.scheduler import SchedulerOptions

MODES = {
    "ramp": PipelineOptions(adaptive_windows=False, scheduler=SchedulerOptions(adaptive_batch=False)),
    "adaptive": PipelineOptions(),
}


async def measure(pipeline: Pipeline, mode: str, concurrent: int, tokens: int, repeats: int) -> dict:
    sampling = replace(pipeline.sampling.defaults(), max_tokens=tokens)
    timings, heard, kept = [], [], 0
    decoded = pipeline.scheduler.stats.decoded_steps
    for r in range(repeats):
        syns = [pipeline.synthesize("Benchmark sentence number one.", sampling=sampling,
                                    seed=r * 100 + i) for i in range(concurrent)]
        heard += await asyncio.gather(*(listen(s, pipeline.sample_rate) for s in syns))
        timings += [s.timings for s in syns]
        kept += sum(len(t.steps) for s in syns for t in s.tracks)
    parts = {k: [t.breakdown_ms()[k] for t in timings] for k in timings[0].breakdown_ms()}
    row = {"mode": mode, "concurrent": concurrent}
    row.update({f"{k}_ms_p50": float(np.median(v)) for k, v in parts.items()})
    row["rtf_p50"] = float(np.median([t.real_time_factor for t in timings]))
    row["audio_s"] = float(np.median([t.audio_seconds for t in timings]))
    row["gap_s_after_first_audio"] = float(np.mean([h[1] for h in heard]))
    row["decoded_per_kept"] = (pipeline.scheduler.stats.decoded_steps - decoded) / max(1, kept)
    return row


async def amain(args) -> None:
    with model_dir(args.model) as model:
        await run(args, model)


async def run(args, model: str) -> None:
    first = load_pipeline(model, options=MODES["ramp"], engine_options=EngineOptions.from_env(
        model, max_model_len=2048, max_num_seqs=16))
    # one engine and codec; each mode its own planner options and decode scheduler
    pipelines = {"ramp": first, "adaptive": Pipeline(first.engine, first.codec, first.profile,
                                                     MODES["adaptive"])}
    rows = []
    try:
        for p in pipelines.values():
            await p.start()
        for concurrent in (1, 4):
            for mode, pipeline in pipelines.items():
                rows.append(await measure(pipeline, mode, concurrent, args.tokens, args.repeats))
    finally:
        await pipelines["adaptive"].scheduler.aclose()
        await first.aclose()
    report("e2e", rows, {"model": args.model or "tiny random", "tokens_per_request": args.tokens})


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=210)
    ap.add_argument("--repeats", type=int, default=2)
    setup()
    asyncio.run(amain(ap.parse_args()))
