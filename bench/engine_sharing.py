"""Benchmark: N serving processes on one device, each with its own vLLM engine (``serve
--workers N``) or all front ends of one engine core (``--shared-engine``) (#21).

Each front-end process builds the product's ``VllmEngine`` as a worker does (its own engine
on 1/N of the memory share, or attached to the launcher's core through
``server/shared_engine``) and, once every process is ready, runs ``--requests`` concurrent
requests of ``--tokens`` tokens each (EOS ignored). Per mode: the tokens per second of all
processes together, each request's token rate over its life as a share of one real-time SNAC
stream (82 tokens/s: p5 and median; below 1.0 a listener would hear gaps), first token p50 /
p95, and the front ends' CPU per token. On a GPU (a Llama-3B-shaped model, random weights
through vLLM's dummy load) it answers what N engines taking turns on the device cost against
one batch; on a CPU (the tiny model) only that both paths run.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import logger, report, setup

from livekit.plugins.veena.models.loading import engine_options_of
from livekit.plugins.veena.pipeline.engine import SamplingOptions, VllmEngine

TOKENS_PER_S = 82  # one real-time SNAC stream: 7 tokens per 85.3 ms frame
PROFILE = "veena"  # the 3B-shaped folder has no manifest: the profile is named


def front_end(index: int, count: int, model: str, requests: int, tokens: int,
              core: dict | None, ready, go, results) -> None:
    """One serving process: its engine up, then its requests once every process is up."""
    setup()
    if core is None:  # its own engine, on its share of the device, as a worker's
        share = float(os.environ["VEENA_GPU_MEMORY_UTILIZATION"]) / count
        os.environ["VEENA_GPU_MEMORY_UTILIZATION"] = repr(share)
    results.put(asyncio.run(_serve(index, model, requests, tokens, core, ready, go)))


async def _serve(index: int, model: str, requests: int, tokens: int, core: dict | None,
                 ready, go) -> dict:
    engine = VllmEngine(engine_options_of(model, PROFILE), core=core)
    try:
        await engine.start()
        prompt = engine.tokenizer.encode("Benchmark stream.", add_special_tokens=False)
        await _request(engine, prompt, 8, f"warm-{index}")  # first-request paths
        ready.set()
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        cpu, wall = time.process_time(), time.perf_counter()
        runs = await asyncio.gather(*(_request(engine, prompt, tokens, f"r{index}-{i}")
                                      for i in range(requests)))
        return {"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall,
                "runs": runs}
    finally:
        await engine.aclose()


async def _request(engine: VllmEngine, prompt: list[int], tokens: int, rid: str) -> dict:
    sampling = SamplingOptions(temperature=1.0, top_p=1.0, max_tokens=tokens,
                               min_tokens=tokens, seed=0, repetition_penalty=1.0)
    started, first, got = time.perf_counter(), None, 0
    async for ids in engine.generate(prompt, sampling, rid):
        if first is None:
            first = time.perf_counter()
        got += len(ids)
    end = time.perf_counter()
    return {"first_s": first - started, "tokens": got,
            "rate_x": (got - 1) / (end - first) / TOKENS_PER_S if end > first else 0.0}


def run_mode(shared: bool, processes: int, model: str, requests: int, tokens: int) -> dict:
    from livekit.plugins.veena.server.shared_engine import SharedEngineCore

    ctx = mp.get_context("spawn")
    go, results, procs, readies = ctx.Event(), ctx.Queue(), [], []

    def start(index: int, core: dict | None = None) -> mp.process.BaseProcess:
        ready = ctx.Event()
        proc = ctx.Process(target=front_end, args=(index, processes, model, requests, tokens,
                                                   core, ready, go, results))
        proc.start()
        procs.append(proc)
        readies.append(ready)
        return proc

    core = (SharedEngineCore.launch(model, PROFILE, processes, start) if shared
            else None)
    try:
        if not shared:
            for index in range(processes):  # each sizes its KV cache from what is free
                start(index)
                while not readies[-1].wait(0.5):
                    if not procs[-1].is_alive():
                        raise RuntimeError(f"front end {index} ended while starting")
        for ready, proc in zip(readies, procs):
            while not ready.wait(0.5):
                if not proc.is_alive():
                    raise RuntimeError("a front end ended while starting")
        go.set()
        outs = [results.get(timeout=1800) for _ in procs]
    finally:
        for proc in procs:
            proc.join(120)
            if proc.is_alive():
                proc.kill()
        if core is not None:
            core.shutdown()
    runs = [r for o in outs for r in o["runs"]]
    rates = np.array([r["rate_x"] for r in runs])
    firsts = np.array([r["first_s"] for r in runs]) * 1000
    tokens_out = sum(r["tokens"] for r in runs)
    return {"engines": "shared" if shared else "separate", "processes": processes,
            "requests": len(runs), "tokens_per_request_min": min(r["tokens"] for r in runs),
            "tokens_per_s": tokens_out / max(o["wall_s"] for o in outs),
            "rate_x_realtime_p5": float(np.percentile(rates, 5)),
            "rate_x_realtime_p50": float(np.percentile(rates, 50)),
            "first_token_p50_ms": float(np.percentile(firsts, 50)),
            "first_token_p95_ms": float(np.percentile(firsts, 95)),
            "frontend_cpu_us_per_token": sum(o["cpu_s"] for o in outs) * 1e6 / tokens_out}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--requests", type=int, default=None,
                    help="concurrent requests per process (default: 128 on a GPU, 2 on a CPU)")
    ap.add_argument("--tokens", type=int, default=None,
                    help="tokens per request (default: 246 on a GPU, 3 s of audio; 24 on a CPU)")
    ap.add_argument("--modes", default="separate,shared")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    if args.processes < 1:
        ap.error("--processes must be at least 1")
    import torch

    cuda = torch.cuda.is_available()
    requests = args.requests or (128 if cuda else 2)
    tokens = args.tokens or (246 if cuda else 24)
    with tempfile.TemporaryDirectory(prefix="veena-engine-sharing-") as scratch:
        model = Path(scratch)
        if cuda:
            _write_3b(model)
            env = {"VEENA_LOAD_FORMAT": "dummy", "VEENA_DTYPE": "bfloat16",
                   "VEENA_GPU_MEMORY_UTILIZATION": "0.6"}
        else:
            from livekit.plugins.veena.models.tiny_model import make_tiny_model

            make_tiny_model(model, PROFILE)
            env = {"VEENA_GPU_MEMORY_UTILIZATION": "0.3"}
        env.update(VEENA_MAX_MODEL_LEN="1024",
                   VEENA_MAX_NUM_SEQS=str(requests * args.processes))
        os.environ.update(env)  # the same engine options in every process
        rows = []
        for mode in args.modes.split(","):
            logger.info("engine sharing: %s", mode)
            rows.append(run_mode(mode == "shared", args.processes, str(model), requests,
                                 tokens))
    report(f"engine_sharing{args.label}", rows, {
        "device": torch.cuda.get_device_name() if cuda else "cpu (tiny model)",
        "model": "Llama-3B-shaped, random (vLLM dummy load)" if cuda else "tiny random Llama",
        "requests_per_process": requests, "tokens_per_request": tokens,
        "setup": "separate: each process its own engine on 1/N of the memory share, started "
                 "one after another; shared: one engine core, each process one front end; "
                 "rate_x_realtime: a request's tokens per second after its first, over 82"})


def _write_3b(out: Path) -> None:
    from gpu_bench import write_3b_config  # the same shape as the GPU benchmark's engine

    write_3b_config(out)


if __name__ == "__main__":
    main()
