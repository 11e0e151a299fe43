"""What vLLM is started with: ``AsyncEngineArgs`` from ``EngineOptions``, in one place, so
that an engine, a shared engine core and its front ends (``server/shared_engine``) build the
same config; the CPU KV cache in bytes, and LoRA sized for the adapters registered."""

from __future__ import annotations

from dataclasses import replace

from ..validation import MAX_DURATION_S, check_float, check_int, is_int
from .adapters import VLLM_LORA_RANKS, AdapterSet, served_rank
from .engine_options import EngineOptions, has_cuda


def engine_args(opts: EngineOptions):
    """vLLM's ``AsyncEngineArgs`` for ``opts``: one place, so that a shared engine core and
    its front ends (``server/shared_engine``) build the same config."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    cpu_cache = {} if has_cuda() else {"kv_cache_memory_bytes": _kv_cache_bytes(opts)}
    lora = _lora_args(opts)

    return AsyncEngineArgs(
        model=opts.model,
        tokenizer=opts.tokenizer or opts.model,
        dtype=opts.dtype,
        max_model_len=opts.max_model_len,
        gpu_memory_utilization=opts.gpu_memory_utilization,
        enforce_eager=opts.enforce_eager,
        seed=opts.seed,
        tensor_parallel_size=opts.tensor_parallel_size,
        max_num_seqs=opts.max_num_seqs,
        load_format=opts.load_format,
        disable_log_stats=True,
        **cpu_cache,
        **lora,
    )


def with_adapters(opts: EngineOptions, adapters: AdapterSet) -> EngineOptions:
    """``opts`` with LoRA settled for the adapters registered so far: on where any is
    (unless set off), and a ``max_lora_rank`` that holds the largest (``served_rank``)."""
    enable = opts.enable_lora if opts.enable_lora is not None else len(adapters) > 0
    rank = opts.max_lora_rank
    if enable and rank is None:
        rank = served_rank(adapters.max_rank)
    return replace(opts, enable_lora=enable, max_lora_rank=rank)


def _lora_args(opts: EngineOptions) -> dict:
    if not opts.enable_lora:
        return {"enable_lora": False}
    max_loras = check_int("max_loras", opts.max_loras, 1, 256)
    rank = opts.max_lora_rank if opts.max_lora_rank is not None else 16
    if not is_int(rank) or rank not in VLLM_LORA_RANKS:
        raise ValueError(f"max_lora_rank must be one of {', '.join(map(str, VLLM_LORA_RANKS))}, "
                         f"got {rank!r}")
    cpu = opts.max_cpu_loras
    if cpu is not None:
        cpu = check_int("max_cpu_loras", cpu, max_loras, 4096)
    check_float("adapter_wait_s", opts.adapter_wait_s, 0.0, MAX_DURATION_S, lo_open=True)
    return {"enable_lora": True, "max_loras": max_loras, "max_lora_rank": rank,
            "max_cpu_loras": cpu}


def _kv_cache_bytes(opts: EngineOptions) -> int:
    gib = check_float("cpu_kvcache_space_gib", opts.cpu_kvcache_space_gib, 1 / 1024, 4096)
    return int(gib * 2**30)


def check_fits_started(opts: EngineOptions, rank: int) -> None:
    """An adapter registered once the engine started must fit what it started with."""
    if not opts.enable_lora:
        raise ValueError("this engine started without LoRA: set VEENA_ENABLE_LORA=1 (or "
                         "register an adapter before it starts)")
    if rank > (opts.max_lora_rank or 0):
        raise ValueError(f"adapter rank {rank} is above this engine's max_lora_rank "
                         f"{opts.max_lora_rank} (VEENA_MAX_LORA_RANK)")
