"""Benchmark 5: end to end on the real vLLM engine (tiny random Veena-layout model).

First-audio breakdown per request (queueing + prefill, first window fill, first decode,
emit) and real-time factor, for requests alone and 4 at once.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from dataclasses import replace

import numpy as np

from _common import report, setup
from livekit.plugins.veena.engine import EngineOptions
from livekit.plugins.veena.pipeline import Pipeline
from livekit.plugins.veena.tiny_model import make_tiny_model


async def measure(pipeline: Pipeline, concurrent: int, tokens: int, repeats: int) -> dict:
    sampling = replace(pipeline.default_sampling(), max_tokens=tokens)
    timings = []
    for r in range(repeats):
        syns = [pipeline.synthesize("Benchmark sentence number one.", sampling=sampling,
                                    seed=r * 100 + i) for i in range(concurrent)]
        await asyncio.gather(*(s.collect() for s in syns))
        timings += [s.timings for s in syns]
    parts = {k: [t.breakdown_ms()[k] for t in timings] for k in timings[0].breakdown_ms()}
    row = {"concurrent": concurrent}
    row.update({f"{k}_ms_p50": float(np.median(v)) for k, v in parts.items()})
    row["rtf_p50"] = float(np.median([t.real_time_factor for t in timings]))
    row["audio_s"] = float(np.median([t.audio_seconds for t in timings]))
    return row


async def amain(args) -> None:
    model = args.model or str(make_tiny_model(tempfile.mkdtemp(prefix="bench-tiny-"), "veena"))
    pipeline = Pipeline.from_model(model, engine_options=EngineOptions.from_env(
        model, max_model_len=2048, max_num_seqs=16))
    await pipeline.start()
    try:
        rows = [await measure(pipeline, c, args.tokens, args.repeats) for c in (1, 4)]
    finally:
        await pipeline.aclose()
    report("e2e", rows, {"model": model, "tokens_per_request": args.tokens})


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=210)
    ap.add_argument("--repeats", type=int, default=2)
    setup()
    asyncio.run(amain(ap.parse_args()))
