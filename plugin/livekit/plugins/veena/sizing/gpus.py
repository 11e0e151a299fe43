"""The GPUs people rent for inference, by the memory their driver reports (``nvidia-smi``'s
total, which is what vLLM's memory share is taken of; a little below the marketed size)."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: int

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


GPUS: tuple[Gpu, ...] = (
    Gpu("T4", 15360 * MIB),
    Gpu("L4", 23034 * MIB),
    Gpu("A10G", 23028 * MIB),
    Gpu("RTX4090", 24564 * MIB),
    Gpu("A100-40", 40960 * MIB),
    Gpu("L40S", 46068 * MIB),
    Gpu("A100", 81920 * MIB),
    Gpu("H100", 81559 * MIB),
    Gpu("H200", 143771 * MIB),
    Gpu("B200", 183359 * MIB),
)


def find_gpu(name: str) -> Gpu:
    """A GPU of the table by name, case and dashes ignored (``h100``, ``a100-80`` for A100)."""
    key = name.strip().upper().replace("-", "").replace(" ", "")
    key = {"A10080": "A100", "A100SXM": "A100", "A10040GB": "A10040"}.get(key, key)
    for gpu in GPUS:
        if gpu.name.upper().replace("-", "") == key:
            return gpu
    raise ValueError(f"unknown GPU {name!r}; known: {', '.join(g.name for g in GPUS)} "
                     "(or give --gpu-memory-gib)")
