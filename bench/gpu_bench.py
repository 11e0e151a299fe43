"""Benchmark 6: the prepared accelerator run (also runs on CPU at small sizes).

Real-size random weights: a Llama-3B-shaped model with Veena's vocabulary served by vLLM with
``load_format="dummy"`` (no weight files), and SNAC 24 kHz. Random weights do not follow the
SNAC grammar, so every 7 generated ids are taken as one frame (code = id mod 4096): the work
per token, window and frame is the real pipeline's (engine, planner, scheduler, codec,
stitcher). Reports first audio at 1/16/64 streams and the largest number of concurrent
streams that all stay real time (p95 per-stream wall/audio <= 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _common import report, setup
from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.codecs.snac import SnacCodec
from livekit.plugins.veena.engine import EngineOptions, SamplingOptions, VllmEngine
from livekit.plugins.veena.profiles import VEENA
from livekit.plugins.veena.scheduler import DecodeScheduler, SchedulerOptions
from livekit.plugins.veena.stitching import Stitcher
from livekit.plugins.veena.tiny_model import _build_tokenizer, _save_tokenizer, _snac_named_ids, make_tiny_model
from livekit.plugins.veena.windowing import WindowOptions, WindowPlanner

SPF, RATE = 2048, 24000
LLAMA_3B = dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                num_attention_heads=24, num_key_value_heads=8, max_position_embeddings=4096,
                rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True)


def write_3b_config(out: Path) -> None:
    """config.json + tokenizer only: vLLM fills the weights (load_format=dummy)."""
    vocab = VEENA.vocab_end + (-VEENA.vocab_end % 64)
    _save_tokenizer(_build_tokenizer(_snac_named_ids(VEENA, vocab), vocab, ["<|begin_of_text|>",
                    "<|end_of_text|>"]), out, "<|begin_of_text|>", "<|end_of_text|>")
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=vocab,
               bos_token_id=128000, eos_token_id=128001, torch_dtype="bfloat16", **LLAMA_3B)
    (out / "config.json").write_text(json.dumps(cfg))


async def one_stream(engine, sched, sid: int, tokens: int, opts: WindowOptions):
    prompt = VEENA.build_prompt(engine.tokenizer, f"Benchmark stream {sid}.", "kavya")
    sampling = SamplingOptions(temperature=1.0, top_p=1.0, max_tokens=tokens, min_tokens=tokens,
                               seed=sid, repetition_penalty=1.0)
    planner, stitcher = WindowPlanner(opts), Stitcher(SPF, 240)
    frames: list[np.ndarray] = []
    pending: list[int] = []
    futs = []
    start = time.perf_counter()
    async for ids in engine.generate(prompt, sampling):
        pending += ids
        while len(pending) >= 7:
            frames.append(np.asarray(pending[:7]) % 4096)
            del pending[:7]
            for w in planner.add(1):
                futs.append((w, sched.submit(f"s{sid}", CodecInput(np.stack(frames[w.start:w.end]), w.start, sid))))
    for w in planner.finish():
        futs.append((w, sched.submit(f"s{sid}", CodecInput(np.stack(frames[w.start:w.end]), w.start, sid))))
    first, audio = None, 0
    for w, fut in futs:
        audio += len(stitcher.push(w, await fut))
        first = first or time.perf_counter()
    wall = time.perf_counter() - start
    return (first - start) * 1000, wall / (audio / RATE)


async def level(engine, codec, streams: int, tokens: int, opts: WindowOptions) -> dict:
    sched = DecodeScheduler(codec, SchedulerOptions(max_batch=64, max_wait_ms=2.0))
    res = await asyncio.gather(*(one_stream(engine, sched, i, tokens, opts) for i in range(streams)))
    await sched.aclose()
    fa, rtf = np.array([r[0] for r in res]), np.array([r[1] for r in res])
    sizes = sched.stats.batch_sizes
    return {"streams": streams, "first_audio_p50_ms": float(np.percentile(fa, 50)),
            "first_audio_p95_ms": float(np.percentile(fa, 95)),
            "rtf_p95": float(np.percentile(rtf, 95)), "real_time": bool(np.percentile(rtf, 95) <= 1.0),
            "mean_decode_batch": sum(k * v for k, v in sizes.items()) / max(1, sum(sizes.values()))}


async def amain(args) -> None:
    cuda = torch.cuda.is_available() and not args.small
    device = "cuda" if cuda else "cpu"
    workdir = Path(tempfile.mkdtemp(prefix="veena-gpu-bench-"))
    if cuda:
        write_3b_config(workdir)
        eopts = EngineOptions(model=str(workdir), dtype="bfloat16", max_model_len=2048,
                              gpu_memory_utilization=0.6, max_num_seqs=256, load_format="dummy")
        levels, tokens = [1, 16, 64, 128, 256], 246  # 3 s of audio per stream
    else:
        make_tiny_model(workdir, "veena")
        eopts = EngineOptions.from_env(str(workdir), max_model_len=1024, max_num_seqs=8)
        levels, tokens = [1, 2], 70
    codec = SnacCodec.random(device=device)
    codec.warmup()
    engine = VllmEngine(eopts)
    await engine.start()
    rows = []
    deadline = time.monotonic() + args.budget_s
    try:
        for n in levels:
            if time.monotonic() > deadline:
                break
            rows.append(await level(engine, codec, n, tokens, WindowOptions()))
            if not rows[-1]["real_time"] and n > 64:
                break
    finally:
        await engine.aclose()
    real = [r["streams"] for r in rows if r["real_time"]]
    report("gpu" if cuda else "gpu_cpu_small", rows,
           {"device": torch.cuda.get_device_name() if cuda else "cpu (small sizes)",
            "max_real_time_streams_tested": max(real) if real else 0,
            "model": "Llama-3B-shaped, random (vLLM dummy load)" if cuda else "tiny random"})


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="CPU-sized run (CI)")
    ap.add_argument("--budget-s", type=float, default=300.0)
    setup()
    asyncio.run(amain(ap.parse_args()))
