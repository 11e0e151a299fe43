"""Benchmark 6: the prepared accelerator run (also runs on CPU at small sizes).

Real-size random weights: a Llama-3B-shaped model with Veena's vocabulary served by vLLM with
``load_format="dummy"`` (no weight files), and SNAC 24 kHz, driven through the product's own
``Pipeline`` (engine, request runs, planner, decode scheduler, codec, stitcher). Random
weights do not follow the SNAC grammar, so this benchmark registers one extra model family
(``any_token``: every 7 generated ids are one frame, code = id mod 4096) through the family
seam; everything else is the shipped code path. Reports host CPU per codec call with and
without CUDA graphs (SNAC and BiCodec), first audio at 1/16/64 streams and the largest number
of concurrent streams that all stay real time (p95 per-stream wall/audio <= 1). Where vLLM is
not installed (the lent GPU machine has no registry, and vLLM's wheel is over what a run may
carry) only the codec calls are measured.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from _common import logger, report, setup

from livekit.plugins.veena.codecs.base import CodecInput, StreamPart
from livekit.plugins.veena.codecs.bicodec import BiCodecCodec
from livekit.plugins.veena.codecs.snac import SnacCodec
from livekit.plugins.veena.models.families import register_family
from livekit.plugins.veena.models.families.snac import SnacFamily, SnacTrack
from livekit.plugins.veena.models.profiles import VEENA, with_overrides
from livekit.plugins.veena.models.tiny_model import (
    make_tiny_model,
    snac_vocab_size,
    write_snac_tokenizer,
)
from livekit.plugins.veena.pipeline.engine import (
    EngineOptions,
    SamplingOptions,
    VllmEngine,
)
from livekit.plugins.veena.pipeline.parsing import ParseStats, TokenTable
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions
from livekit.plugins.veena.pipeline.scheduler import SchedulerOptions

LLAMA_3B = dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                num_attention_heads=24, num_key_value_heads=8, max_position_embeddings=4096,
                rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True)


class AnyTokenTrack(SnacTrack):
    """Every 7 ids are one SNAC frame (code = id mod 4096): random weights keep no grammar."""

    def __init__(self) -> None:
        self.stats = ParseStats()
        self.steps: list[np.ndarray] = []
        self._pending: list[int] = []

    def feed(self, ids: Sequence[int]) -> int:
        self._pending += ids
        self.stats.tokens += len(ids)
        n = len(self._pending) // 7
        for i in range(n):
            self.steps.append(np.asarray(self._pending[7 * i : 7 * i + 7]) % 4096)
        del self._pending[: 7 * n]
        self.stats.frames += n
        return n


@register_family
class AnyTokenFamily(SnacFamily):
    codec = "any_token"

    def new_track(self, table: TokenTable, request_id: str, speaker_globals: Any) -> AnyTokenTrack:
        return AnyTokenTrack()


PROFILE = with_overrides(VEENA, name="veena-any-token", codec="any_token")


def write_3b_config(out: Path) -> None:
    """config.json + tokenizer only: vLLM fills the weights (load_format=dummy)."""
    write_snac_tokenizer(VEENA, out)
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama",
               vocab_size=snac_vocab_size(VEENA), bos_token_id=128000, eos_token_id=128001,
               torch_dtype="bfloat16", **LLAMA_3B)
    (out / "config.json").write_text(json.dumps(cfg))


async def one_stream(pipeline: Pipeline, sid: int, tokens: int) -> tuple[float, float]:
    """(first audio ms, wall / audio) of one stream through the product's pipeline."""
    sampling = SamplingOptions(temperature=1.0, top_p=1.0, max_tokens=tokens, min_tokens=tokens,
                               seed=sid, repetition_penalty=1.0)
    syn = pipeline.synthesize(f"Benchmark stream {sid}.", sampling=sampling, seed=sid)
    async for _ in syn:
        pass
    return syn.timings.first_audio_ms, syn.timings.real_time_factor


async def level(pipeline: Pipeline, streams: int, tokens: int) -> dict:
    before = dict(pipeline.scheduler.stats.batch_sizes)
    res = await asyncio.gather(*(one_stream(pipeline, i, tokens) for i in range(streams)))
    fa, rtf = np.array([r[0] for r in res]), np.array([r[1] for r in res])
    sizes = {k: v - before.get(k, 0) for k, v in pipeline.scheduler.stats.batch_sizes.items()}
    return {"streams": streams, "first_audio_p50_ms": float(np.percentile(fa, 50)),
            "first_audio_p95_ms": float(np.percentile(fa, 95)),
            "rtf_p95": float(np.percentile(rtf, 95)), "real_time": bool(np.percentile(rtf, 95) <= 1.0),
            "mean_decode_batch": sum(k * v for k, v in sizes.items()) / max(1, sum(sizes.values()))}


def _window(kind: str, steps: int, i: int, rng: np.random.Generator) -> CodecInput:
    if kind == "snac":
        return CodecInput(rng.integers(0, 4096, (steps, 7)), start_step=i, seed=i)
    return CodecInput(rng.integers(0, 8192, steps), start_step=i, seed=i,
                      speaker=rng.integers(0, 4096, 32))


def codec_call_cost(device: str, calls: int, frames_list: Sequence[int],
                    batches: Sequence[int], kind: str = "snac") -> list[dict]:
    """Host CPU per decode call (this thread's CPU time from the call until it returns,
    without waiting for the GPU), eager and replayed from CUDA graphs, per window size (SNAC
    frames or BiCodec semantic tokens) and batch, with the largest difference between the
    two decodes (#21). Graphs are off on CPU, so there both columns are eager."""
    rng = np.random.default_rng(0)
    make = SnacCodec.random if kind == "snac" else BiCodecCodec.random
    codecs = {"eager": make(seed=1, device=device),
              "graphs": make(seed=1, device=device, cuda_graphs=True)}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    for frames in frames_list:
        for n in batches:
            batch = [_window(kind, frames, i, rng) for i in range(n)]
            row: dict[str, Any] = {"codec": kind, "window_frames": frames, "batch": n}
            audio = {}
            for label, codec in codecs.items():
                audio[label] = np.stack(codec.decode(batch))  # warm up; captures a graph
                with torch.inference_mode():
                    call, inputs = codec.batch_call(batch)
                    cpu = wall = 0.0
                    for _ in range(calls):
                        sync()
                        c0, t0 = time.thread_time(), time.perf_counter()
                        call(*inputs)
                        cpu += time.thread_time() - c0
                        sync()
                        wall += time.perf_counter() - t0
                row[f"{label}_host_cpu_ms"] = 1e3 * cpu / calls
                row[f"{label}_wall_ms"] = 1e3 * wall / calls
            row["host_cpu_ratio"] = row["graphs_host_cpu_ms"] / row["eager_host_cpu_ms"]
            row["max_abs_diff"] = float(np.abs(audio["graphs"] - audio["eager"]).max())
            rows.append(row)
    graphs = codecs["graphs"].graphs
    logger.info("%s graphs: %s", kind, graphs.stats if graphs is not None else "off (not CUDA)")
    return rows


def streamed_call_cost(device: str, calls: int, frames_list: Sequence[int],
                       batches: Sequence[int]) -> list[dict]:
    """Host CPU per streamed SNAC call (``VEENA_SNAC_STREAMING``): ``batch`` streams at the
    same point, each fed ``new_frames`` frames per call, in steady state (their first
    8 frames fed before timing); per call and per frame kept, beside the windowed rows."""
    rng = np.random.default_rng(0)
    codec = SnacCodec.random(seed=1, device=device, streaming=True)
    reach = codec.lookahead_steps
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    for frames in frames_list:
        for n in batches:
            total = 8 + frames * (calls + 1)
            codes = [rng.integers(0, 4096, (total, 7)) for _ in range(n)]
            streams = [codec.new_stream(i) for i in range(n)]

            def call(start: int, count: int) -> None:
                codec.decode([
                    CodecInput(c[start:start + count], start, i,
                               stream=StreamPart(s, 0, max(0, start + count - reach), False,
                                                 False))
                    for i, (c, s) in enumerate(zip(codes, streams))])

            call(0, 8)
            call(8, frames)  # warm at this size
            cpu = wall = 0.0
            for k in range(calls):
                sync()
                c0, t0 = time.thread_time(), time.perf_counter()
                call(8 + frames * (k + 1), frames)
                cpu += time.thread_time() - c0
                sync()
                wall += time.perf_counter() - t0
            rows.append({"codec": "snac streamed", "new_frames": frames, "batch": n,
                         "host_cpu_ms": 1e3 * cpu / calls, "wall_ms": 1e3 * wall / calls,
                         "host_cpu_ms_per_frame": 1e3 * cpu / calls / (frames * n)})
    return rows


async def amain(args) -> None:
    cuda = torch.cuda.is_available() and not args.small
    device = "cuda" if cuda else "cpu"
    with tempfile.TemporaryDirectory(prefix="veena-gpu-bench-") as scratch:
        await run(args, cuda, device, Path(scratch))


async def run(args, cuda: bool, device: str, workdir: Path) -> None:
    where = {"device": torch.cuda.get_device_name() if cuda else "cpu (small sizes)"}
    report("gpu_codec_calls" if cuda else "gpu_codec_calls_cpu_small",
           codec_call_cost(device, calls=20, frames_list=(6, 12, 36), batches=(1, 16, 64))
           if cuda else codec_call_cost(device, calls=2, frames_list=(6,), batches=(1, 2)),
           where)
    report("gpu_streamed_calls" if cuda else "gpu_streamed_calls_cpu_small",
           streamed_call_cost(device, 20, (1, 2, 8), (1, 16, 64))
           if cuda else streamed_call_cost(device, 2, (1,), (1, 2)), where)
    # BiCodec windows: first (10 + 20 right), steady (40 + 50 + 20), largest (40 + 160 + 20)
    report("gpu_bicodec_calls" if cuda else "gpu_bicodec_calls_cpu_small",
           codec_call_cost(device, 20, (30, 110, 220), (1, 16, 64), kind="bicodec")
           if cuda else codec_call_cost(device, 2, (30,), (1, 2), kind="bicodec"), where)
    if importlib.util.find_spec("vllm") is None:
        logger.warning("vLLM is not installed here: the engine part is skipped")
        return
    if cuda:
        write_3b_config(workdir)
        eopts = EngineOptions(model=str(workdir), dtype="bfloat16", max_model_len=2048,
                              gpu_memory_utilization=0.6, max_num_seqs=256, load_format="dummy")
        levels, tokens = [1, 16, 64, 128, 256], 246  # 3 s of audio per stream
    else:
        make_tiny_model(workdir, "veena")
        eopts = EngineOptions.from_env(str(workdir), max_model_len=1024, max_num_seqs=8)
        levels, tokens = [1, 2], 70
    codec = SnacCodec.random(device=device, cuda_graphs=True)
    pipeline = Pipeline(VllmEngine(eopts), codec, PROFILE,
                        PipelineOptions(codec_device=device,
                                        scheduler=SchedulerOptions(max_batch=64, max_wait_ms=2.0)))
    await pipeline.start()
    rows = []
    deadline = time.monotonic() + args.budget_s
    try:
        for n in levels:
            if time.monotonic() > deadline:
                break
            rows.append(await level(pipeline, n, tokens))
            if not rows[-1]["real_time"] and n > 64:
                break
    finally:
        await pipeline.aclose()
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
