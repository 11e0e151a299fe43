"""``veena-tts plan``: before a GPU is bought, what a model needs on it, from its config
alone: the weights, each stream's KV cache, LoRA slots, the streams that fit, the settings
to start with, and what only a run on that GPU can tell."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from typing import Any

from ..pipeline.chunking import ChunkerOptions
from ..pipeline.guards import GuardOptions
from ..validation import check_float, check_int
from .fit import (CODEC_RESERVE_BYTES, KV_BLOCK_TOKENS, PROMPT_FIXED_TOKENS,
                  RUNTIME_RESERVE_BYTES, STREAMS_PER_PROCESS, Fit, decode_batch_for,
                  fit_streams, max_num_seqs_for, stream_footprint, workers_for)
from .gpus import GIB, GPUS, MIB, Gpu, find_gpu
from .shape import ModelConfigError, ModelShape, dtype_bytes, read_model_config

logger = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    plan = sub.add_parser(
        "plan", help="what MODEL needs on a GPU (weights, KV cache per stream, streams that "
                     "fit, settings), from its config alone",
        description=__doc__)
    plan.add_argument("--model", required=True,
                      help="a model folder or hub id (only its config.json is read)")
    plan.add_argument("--profile", default=None, help="default: the model's, as serve picks it")
    plan.add_argument("--gpu", action="append", default=[], metavar="NAME",
                      help=f"one of {', '.join(g.name for g in GPUS)} (repeatable; default: "
                           "all of them)")
    plan.add_argument("--gpu-memory-gib", type=float, default=None,
                      help="a GPU of this much memory instead")
    plan.add_argument("--streams", type=int, default=None,
                      help="the concurrent streams wanted: whether they fit, and the settings")
    plan.add_argument("--gpu-memory-utilization", type=float, default=0.85,
                      help="vLLM's share of the GPU (VEENA_GPU_MEMORY_UTILIZATION)")
    plan.add_argument("--dtype", default="auto", help="as VEENA_DTYPE")
    plan.add_argument("--max-loras", type=int, default=0,
                      help="LoRA slots to reserve (VEENA_MAX_LORAS; 0: LoRA off)")
    plan.add_argument("--lora-rank", type=int, default=16, help="VEENA_MAX_LORA_RANK")


def run(args: argparse.Namespace) -> int:
    """Print the plan; a bad option or an unreadable config is one line and exit 2."""
    from ..models.profiles import resolve_profile

    try:
        profile = resolve_profile(args.model, args.profile)
        util = check_float("--gpu-memory-utilization", args.gpu_memory_utilization, 0.0, 1.0,
                           lo_open=True)
        check_int("--max-loras", args.max_loras, 0, 256)
        check_int("--lora-rank", args.lora_rank, 1, 512)
        if args.streams is not None:
            check_int("--streams", args.streams, 1, 1 << 20)
        gpus = [find_gpu(name) for name in args.gpu]
        if args.gpu_memory_gib is not None:
            gib = check_float("--gpu-memory-gib", args.gpu_memory_gib, 0.0, 1 << 16,
                              lo_open=True)
            gpus.append(Gpu(f"a {gib:g} GiB GPU", int(gib * GIB)))
        dtype_bytes(args.dtype if args.dtype != "auto" else "bfloat16")
        config = read_model_config(args.model, getattr(profile, "llm_folder", ""))
        shape = ModelShape.from_config(config)
    except (ValueError, ModelConfigError) as e:
        logger.error("plan: %s", e)
        return 2
    sys.stdout.write(render(args.model, profile, shape, gpus or list(GPUS), util,
                            dtype=args.dtype, streams=args.streams, max_loras=args.max_loras,
                            lora_rank=args.lora_rank))
    return 0


def render(model: str, profile: Any, shape: ModelShape, gpus: list[Gpu], utilization: float,
           *, dtype: str = "auto", streams: int | None = None, max_loras: int = 0,
           lora_rank: int = 16) -> str:
    chunker = ChunkerOptions()
    foot = stream_footprint(shape, profile, chunker, dtype)
    served = shape.served_dtype(dtype)
    size = dtype_bytes(served)
    lines = [
        f"model {model}: profile {profile.name}, {shape.model_type or 'decoder'} with "
        f"{shape.layers} layers, {shape.heads} heads, {shape.kv_heads} KV heads of "
        f"{shape.head_dim}, hidden {shape.hidden}, MLP {shape.intermediate}, vocab {shape.vocab}",
        "",
        "Computed from config.json (no weights read):",
        f"  parameters            {shape.parameters:,} ({served}, {size} bytes each)",
        f"  weights               {shape.weight_bytes(dtype) / GIB:.2f} GiB",
        f"  KV cache per token    {shape.kv_bytes_per_token(dtype) / 1024:.1f} KiB = "
        f"{shape.layers} layers x {shape.kv_heads} KV heads x {shape.head_dim} x 2 (K, V) x "
        f"{size} bytes",
        f"  tokens per stream     {foot.tokens} = prompt {foot.prompt_tokens} "
        f"({_prompt_parts(profile, chunker)}) + audio "
        f"{foot.audio_tokens} (({GuardOptions().runaway_base_s:g} s + {chunker.max_chars} "
        f"characters x {profile.runaway_s_per_char:g} s) x {profile.tokens_per_second:.1f} "
        f"tokens/s), in blocks of {KV_BLOCK_TOKENS}",
        f"  KV cache per stream   {foot.kv_bytes / MIB:.1f} MiB",
        f"  LoRA slot (rank {lora_rank})   {shape.lora_slot_bytes(lora_rank, dtype) / MIB:.1f} "
        f"MiB each; {max_loras} reserved (--max-loras)",
        f"  estimates             {RUNTIME_RESERVE_BYTES / GIB:.1f} GiB inside vLLM's share for "
        f"activations and CUDA graphs; {CODEC_RESERVE_BYTES / GIB:.1f} GiB outside it for the "
        "codec",
    ]
    for gpu in gpus:
        fit = fit_streams(shape, foot, gpu.memory_bytes, utilization, dtype=dtype,
                          max_loras=max_loras, lora_rank=lora_rank)
        lines += ["", *_gpu_lines(gpu, fit, streams)]
    lines += [
        "",
        "Only a run on the GPU tells (bash bench/gpu.sh): whether every stream keeps real time "
        f"({profile.tokens_per_second:.0f} tokens/s each) at that count, first-audio latency "
        "under load, the codec's windows per second, and vLLM's own reserve (its start-up log "
        "prints the KV cache it got).",
    ]
    return "\n".join(lines) + "\n"


def _prompt_parts(profile: Any, chunker: ChunkerOptions) -> str:
    if getattr(profile, "max_context", None):
        return (f"the rest of its {profile.max_context}-token context: the text and a "
                "reference clip's codes")
    return (f"a chunk of {chunker.max_chars} characters, {PROMPT_FIXED_TOKENS} fixed ids"
            f"{', a voice description' if getattr(profile, 'described_voices', False) else ''}"
            f"{', speaker tokens' if getattr(profile, 'num_global_tokens', 0) else ''}")


def _gpu_lines(gpu: Gpu, fit: Fit, wanted: int | None) -> list[str]:
    lines = [
        f"{gpu.name}: {gpu.memory_gib:.1f} GiB; vLLM's share {fit.utilization:g} = "
        f"{fit.share_bytes / GIB:.1f} GiB",
        f"  KV cache              {fit.kv_budget_bytes / GIB:.1f} GiB after weights, LoRA "
        f"{fit.lora_bytes / GIB:.2f} GiB and the reserve",
        f"  streams that fit      {fit.streams}",
    ]
    if not fit.codec_fits:
        lines.append(f"  codec                 only {fit.codec_room_bytes / GIB:.1f} GiB left "
                     "outside vLLM's share: lower --gpu-memory-utilization")
    if fit.streams < 1:
        lines.append("  does not fit          not one stream: a larger GPU, or "
                     "VEENA_TENSOR_PARALLEL_SIZE across several")
        return lines
    target = fit.streams if wanted is None else wanted
    if wanted is not None:
        need = wanted * fit.footprint.kv_bytes
        verdict = ("fit" if wanted <= fit.streams else
                   f"do NOT fit (need {need / GIB:.1f} GiB of KV cache; "
                   f"{math.ceil(wanted / fit.streams)} GPUs)")
        lines.append(f"  {f'{wanted} streams':<22}{verdict}")
        target = min(wanted, fit.streams)
    workers = workers_for(target)
    settings = [f"VEENA_GPU_MEMORY_UTILIZATION={fit.utilization:g}",
                f"VEENA_MAX_NUM_SEQS={max_num_seqs_for(target)}",
                f"VEENA_DECODE_MAX_BATCH={decode_batch_for(target)}"]
    if workers > 1:
        settings += [f"VEENA_SERVER_WORKERS={workers}", "VEENA_SHARED_ENGINE=1"]
    lines.append(f"  start with            {' '.join(settings)}")
    if workers > 1:
        lines.append(f"                        ({target} streams: one process carries about "
                     f"{STREAMS_PER_PROCESS})")
    return lines
