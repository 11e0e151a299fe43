"""How vLLM is started (``EngineOptions``) and how one request samples (``SamplingOptions``):
typed, with defaults in one place, every value checked before it can reach vLLM (whose
engine core dies on a float or bool where it expects an int)."""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..settings import env_bool, env_bool_or_auto, env_float, env_int, env_str
from ..validation import check_float, check_int, check_int_list, is_int

_MAX_TOKENS = 1 << 20
MAX_TOKEN_ID = (1 << 31) - 1

logger = logging.getLogger(__name__)

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty", "max_tokens",
                   "min_tokens")
"""What a caller may set of a request's sampling (a server client, the plugin); the rest is
the model's (stop ids, allowed ids)."""


def draw_seed() -> int:
    """A fresh sampling seed (31 bits): what a request, a turn or a call keeps when none is
    given."""
    return random.getrandbits(31)


@dataclass(frozen=True)
class EngineOptions:
    """How vLLM is started. Every field has an environment variable (see ``.env.example``)."""

    model: str
    tokenizer: str | None = None
    dtype: str = "auto"
    max_model_len: int = 4096
    gpu_memory_utilization: float = 0.85
    cpu_kvcache_space_gib: float = 1.0
    """vLLM CPU only: KV-cache size in GiB, fractions allowed (a tiny model needs a few MiB;
    the cache is touched memory, so each engine holds all of it). ``VLLM_CPU_KVCACHE_SPACE``,
    where set, wins, as vLLM reads it."""
    enforce_eager: bool = False
    seed: int = 0
    tensor_parallel_size: int = 1
    max_num_seqs: int = 64
    load_format: str = "auto"
    """"dummy" gives random weights without reading any (benchmarks at real model size)."""
    enable_lora: bool | None = None
    """Serve LoRA adapters (``VEENA_ENABLE_LORA``); None: on when adapters are registered
    before the engine starts. Off, an engine pays nothing for LoRA; on, every adapter
    registered later must fit ``max_lora_rank``."""
    max_loras: int = 4
    """Adapters one engine step batches at once (vLLM's ``max_loras``): requests of a
    fifth adapter wait for a slot. Each slot holds ``max_lora_rank`` weights on the GPU."""
    max_lora_rank: int | None = None
    """The largest rank served (vLLM's ``max_lora_rank``, one of 1, 8, 16, 32, 64, 128,
    256, 320, 512); None: the registered adapters' largest, rounded up, and at least 16."""
    max_cpu_loras: int | None = None
    """Adapters kept loaded in host memory (vLLM's LRU cache); one past it is evicted and
    read from disk again when next used. None: vLLM's default (``max_loras``)."""
    adapter_wait_s: float = 30.0
    """How long a request with an adapter may wait for its tokens while other requests
    progress: vLLM skips a request whose adapter finds no free slot (``max_loras``) and can
    starve it while requests of loaded adapters keep coming. Past it (plus the turn's own
    no-progress timeout) its turn fails as stalled."""
    startup_timeout_s: float = 600.0
    """How long a request waits for the engine to finish starting before it fails with a
    clear ``starting`` error (the start itself goes on)."""

    @classmethod
    def from_env(cls, model: str | None = None, *, profile: Any = None, facts: Any = None,
                 **overrides) -> "EngineOptions":
        """Defaults suit the machine (``facts``: a ``sizing.MachineFacts``, detected where
        not given): without CUDA, vLLM-CPU needs a small memory share (it sees only part of
        the node) and runs eager; on a GPU, ``max_num_seqs`` is two per stream whose KV
        cache fits beside the weights (``profile``: the model's, else resolved from it)."""
        from ..sizing.machine import MachineFacts

        facts = facts if facts is not None else MachineFacts.detect()
        cpu = not facts.cuda
        values = dict(
            model=model or env_str("VEENA_MODEL", ""),
            dtype=env_str("VEENA_DTYPE", cls.dtype),
            max_model_len=env_int("VEENA_MAX_MODEL_LEN", cls.max_model_len),
            gpu_memory_utilization=env_float(
                "VEENA_GPU_MEMORY_UTILIZATION", 0.3 if cpu else cls.gpu_memory_utilization
            ),
            cpu_kvcache_space_gib=env_float("VEENA_CPU_KVCACHE_GIB", cls.cpu_kvcache_space_gib),
            enforce_eager=env_bool("VEENA_ENFORCE_EAGER", cpu or cls.enforce_eager),
            seed=env_int("VEENA_ENGINE_SEED", cls.seed),
            tensor_parallel_size=env_int("VEENA_TENSOR_PARALLEL_SIZE", cls.tensor_parallel_size),
            max_num_seqs=env_int("VEENA_MAX_NUM_SEQS", None),  # empty: from the machine
            load_format=env_str("VEENA_LOAD_FORMAT", cls.load_format),
            startup_timeout_s=env_float("VEENA_STARTUP_TIMEOUT_S", cls.startup_timeout_s),
            enable_lora=env_bool_or_auto("VEENA_ENABLE_LORA", cls.enable_lora),
            max_loras=env_int("VEENA_MAX_LORAS", cls.max_loras),
            max_lora_rank=env_int("VEENA_MAX_LORA_RANK", cls.max_lora_rank),
            max_cpu_loras=env_int("VEENA_MAX_CPU_LORAS", cls.max_cpu_loras),
            adapter_wait_s=env_float("VEENA_ADAPTER_WAIT_S", cls.adapter_wait_s),
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        if values["max_num_seqs"] is None:
            values["max_num_seqs"] = _machine_max_num_seqs(facts, values, profile)
        return cls(**values)


@dataclass(frozen=True)
class SamplingOptions:
    """Sampling for one request; validated before any engine work."""

    temperature: float = 0.4
    top_p: float = 0.9
    top_k: int = -1
    repetition_penalty: float = 1.05
    max_tokens: int | None = None
    """None: the pipeline derives a budget from the text length."""
    min_tokens: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    allowed_token_ids: tuple[int, ...] | None = None
    """Restrict generation to these ids (BiCodec: globals, then semantic tokens only)."""
    ignore_eos: bool = False
    """Only ``stop_token_ids`` (and ``max_tokens``) end the request, never the tokenizer's
    EOS (Maya1: 128009 is in its prompt and must not stop generation)."""
    stream_interval: int = 1
    """vLLM hands over new tokens once this many have gathered (its first token and its
    end at once): fewer outputs for vLLM's front end to build and fewer wakes for ours, at
    up to ``stream_interval - 1`` engine steps of delay per delivery."""

    def validate(self) -> "SamplingOptions":
        """Check every field by type and range (ValueError naming them all).

        Types matter as much as ranges: vLLM's engine core decodes requests with msgspec,
        and a bool or float where it expects an int kills it for every client."""
        problems = []

        def check(fn, *args, **kw) -> None:
            try:
                fn(*args, **kw)
            except ValueError as e:
                problems.append(str(e))

        check(check_float, "temperature", self.temperature, 0.0, 2.0)
        check(check_float, "top_p", self.top_p, 0.0, 1.0, lo_open=True)
        check(check_int, "top_k", self.top_k, -1, 1 << 20)
        if is_int(self.top_k) and self.top_k == 0:
            problems.append("top_k must be -1 (off) or >= 1, got 0")
        check(check_float, "repetition_penalty", self.repetition_penalty, 0.5, 2.0)
        if self.max_tokens is not None:
            check(check_int, "max_tokens", self.max_tokens, 1, _MAX_TOKENS)
        check(check_int, "min_tokens", self.min_tokens, 0, _MAX_TOKENS)
        if (is_int(self.min_tokens) and is_int(self.max_tokens)
                and self.min_tokens > self.max_tokens):
            problems.append(f"min_tokens must be <= max_tokens, got {self.min_tokens} > {self.max_tokens}")
        if self.seed is not None:
            check(check_int, "seed", self.seed, 0, 2**63 - 1)
        check(check_int_list, "stop_token_ids", self.stop_token_ids, 0, MAX_TOKEN_ID)
        if self.allowed_token_ids is not None:
            check(check_int_list, "allowed_token_ids", self.allowed_token_ids, 0, MAX_TOKEN_ID)
        check(check_int, "stream_interval", self.stream_interval, 1, 4096)
        if not isinstance(self.ignore_eos, bool):
            problems.append(f"ignore_eos must be a bool, got {type(self.ignore_eos).__name__}")
        if problems:
            raise ValueError("invalid sampling options: " + "; ".join(problems))
        return self

    @staticmethod
    def check_fields(overrides: Any) -> Mapping[str, Any]:
        """A caller's sampling is a mapping of ``SAMPLING_FIELDS`` only (ValueError)."""
        if not isinstance(overrides, Mapping) or set(overrides) - set(SAMPLING_FIELDS):
            raise ValueError(f"sampling may only set {', '.join(SAMPLING_FIELDS)}")
        return overrides

    def overridden(self, overrides: Any) -> "SamplingOptions":
        """These defaults with a caller's ``overrides`` (``check_fields``), every value
        checked: the one place a caller's sampling is read."""
        return replace(self, **self.check_fields(overrides)).validate()

    def to_vllm(self):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k if self.top_k > 0 else 0,
            repetition_penalty=self.repetition_penalty,
            max_tokens=self.max_tokens,
            min_tokens=self.min_tokens,
            seed=self.seed,
            stop_token_ids=list(self.stop_token_ids),
            allowed_token_ids=list(self.allowed_token_ids) if self.allowed_token_ids else None,
            ignore_eos=self.ignore_eos,
            detokenize=False,
            skip_special_tokens=False,
            output_kind=RequestOutputKind.DELTA,
            stream_interval=self.stream_interval if self.stream_interval > 1 else None,
        )


def _machine_max_num_seqs(facts: Any, values: Mapping[str, Any], profile: Any) -> int:
    """``max_num_seqs`` from the machine and the model's config (logged with why)."""
    from ..models.profiles import resolve_profile
    from ..sizing.machine import engine_defaults, model_shape_or_none

    cuda = facts.cuda and bool(values["model"])
    shape = model_shape_or_none(values["model"]) if cuda else None
    seqs, why = engine_defaults(facts, shape, resolve_profile(values["model"], profile)
                                if cuda else None,
                                utilization=values["gpu_memory_utilization"],
                                dtype=values["dtype"],
                                tensor_parallel=values["tensor_parallel_size"])
    logger.info("engine: max_num_seqs %d (%s; VEENA_MAX_NUM_SEQS sets it)", seqs, why)
    return seqs


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
