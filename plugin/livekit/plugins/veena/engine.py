"""A thin shell over vLLM's v1 ``AsyncLLM``: token ids in, new token ids out, always abortable.

Every request gets a unique id; leaving the iterator early (cancel, ``aclose``, an error)
aborts the request in vLLM so no KV cache or scheduler slot outlives its listener.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import uuid
from dataclasses import asdict, dataclass, field
from typing import AsyncIterator, Sequence

from .settings import env_bool, env_float, env_int, env_str

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineOptions:
    """How vLLM is started. Every field has an environment variable (see ``.env.example``)."""

    model: str
    tokenizer: str | None = None
    dtype: str = "auto"
    max_model_len: int = 4096
    gpu_memory_utilization: float = 0.85
    cpu_kvcache_space_gib: int = 1
    """vLLM CPU only: KV-cache size in GiB (``VLLM_CPU_KVCACHE_SPACE``)."""
    enforce_eager: bool = False
    seed: int = 0
    tensor_parallel_size: int = 1
    max_num_seqs: int = 64
    load_format: str = "auto"
    """"dummy" gives random weights without reading any (benchmarks at real model size)."""

    @classmethod
    def from_env(cls, model: str | None = None, **overrides) -> "EngineOptions":
        """Defaults suit the machine: without CUDA, vLLM-CPU needs a small memory share
        (it sees only part of the node) and runs eager."""
        cpu = not _has_cuda()
        values = dict(
            model=model or env_str("VEENA_MODEL", ""),
            dtype=env_str("VEENA_DTYPE", cls.dtype),
            max_model_len=env_int("VEENA_MAX_MODEL_LEN", cls.max_model_len),
            gpu_memory_utilization=env_float(
                "VEENA_GPU_MEMORY_UTILIZATION", 0.3 if cpu else cls.gpu_memory_utilization
            ),
            cpu_kvcache_space_gib=env_int("VEENA_CPU_KVCACHE_GIB", cls.cpu_kvcache_space_gib),
            enforce_eager=env_bool("VEENA_ENFORCE_EAGER", cpu or cls.enforce_eager),
            seed=env_int("VEENA_ENGINE_SEED", cls.seed),
            tensor_parallel_size=env_int("VEENA_TENSOR_PARALLEL_SIZE", cls.tensor_parallel_size),
            max_num_seqs=env_int("VEENA_MAX_NUM_SEQS", cls.max_num_seqs),
            load_format=env_str("VEENA_LOAD_FORMAT", cls.load_format),
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
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

    def validate(self) -> "SamplingOptions":
        problems = []
        if not 0.0 <= self.temperature <= 2.0:
            problems.append(f"temperature must be in [0, 2], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k != -1 and self.top_k < 1:
            problems.append(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not 0.5 <= self.repetition_penalty <= 2.0:
            problems.append(f"repetition_penalty must be in [0.5, 2], got {self.repetition_penalty}")
        if self.max_tokens is not None and self.max_tokens < 1:
            problems.append(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            problems.append(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            problems.append(f"seed must be a non-negative 64-bit integer, got {self.seed}")
        if problems:
            raise ValueError("invalid sampling options: " + "; ".join(problems))
        return self

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
            detokenize=False,
            skip_special_tokens=False,
            output_kind=RequestOutputKind.DELTA,
        )


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a dependency
        return False


class EngineError(RuntimeError):
    """The engine failed or died; the plugin maps this onto ``APIConnectionError``."""


class VllmEngine:
    """One vLLM ``AsyncLLM`` per process, shared by every stream."""

    _ids = itertools.count()

    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        self._llm = None
        self._tokenizer = None
        self._start_lock = asyncio.Lock()
        self._live: set[str] = set()

    @property
    def started(self) -> bool:
        return self._llm is not None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(
                self.options.tokenizer or self.options.model
            )
        return self._tokenizer

    async def start(self) -> None:
        async with self._start_lock:
            if self._llm is not None:
                return
            try:
                self._llm = await asyncio.get_running_loop().run_in_executor(None, self._build)
            except Exception as e:
                raise EngineError(f"failed to start vLLM for {self.options.model!r}: {e}") from e

    def _build(self):
        opts = self.options
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(opts.cpu_kvcache_space_gib))
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        logger.info("starting vLLM engine", extra={"engine": asdict(opts)})
        args = AsyncEngineArgs(
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
        )
        llm = AsyncLLM.from_engine_args(args)
        logger.info("vLLM engine ready", extra={"model": opts.model})
        return llm

    def new_request_id(self, prefix: str = "tts") -> str:
        return f"{prefix}-{uuid.uuid4().hex[:12]}-{next(self._ids)}"

    @property
    def num_unfinished_requests(self) -> int:
        """Requests vLLM still holds (zero once every stream has finished or been aborted)."""
        if self._llm is None:
            return 0
        return self._llm.get_num_unfinished_requests()

    @property
    def live_request_ids(self) -> frozenset[str]:
        return frozenset(self._live)

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        sampling: SamplingOptions,
        request_id: str | None = None,
    ) -> AsyncIterator[list[int]]:
        """Yield each batch of NEW token ids; exiting early aborts the vLLM request."""
        await self.start()
        assert self._llm is not None
        request_id = request_id or self.new_request_id()
        params = sampling.validate().to_vllm()
        prompt = {"prompt_token_ids": list(prompt_token_ids)}
        self._live.add(request_id)
        finished = False
        try:
            async for out in self._llm.generate(prompt, params, request_id):
                new = list(out.outputs[0].token_ids) if out.outputs else []
                finished = out.finished
                if new:
                    yield new
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as e:  # vLLM raises its own types; callers see one
            if self._llm is not None and getattr(self._llm, "errored", False):
                raise EngineError(f"vLLM engine died: {e}") from e
            raise EngineError(f"vLLM request {request_id} failed: {e}") from e
        finally:
            self._live.discard(request_id)
            if not finished and self._llm is not None:
                await self._abort(request_id)

    async def _abort(self, request_id: str) -> None:
        try:
            await asyncio.shield(self._llm.abort(request_id))
            logger.debug("aborted vLLM request", extra={"request_id": request_id})
        except Exception:
            logger.exception("failed to abort vLLM request", extra={"request_id": request_id})

    async def aclose(self) -> None:
        if self._llm is not None:
            llm, self._llm = self._llm, None
            llm.shutdown()
