"""LoRA adapters the engine applies per request: a user's fine-tuned voices on one base model.

The engine holds one ``AdapterSet``. An adapter gets an int id when it is registered and
keeps it while registered; a name removed and registered again gets a new id, because vLLM
caches adapters by id and must never serve the old weights under it. Checking an adapter's
files against the base model happens before registration (``models.adapters``): nothing
that reaches this set can fail to load in vLLM's engine core.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterator

ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
"""An adapter's name: it becomes a speaker name in prompts (``<spk_NAME>``, ``NAME: text``),
so nothing that could close a tag or start a new line."""

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM's ``max_lora_rank`` accepts."""


@dataclass(frozen=True)
class Adapter:
    """A checked adapter: what a request needs to carry it to vLLM."""

    name: str
    int_id: int
    path: str
    """A local folder in PEFT layout (a hub id is downloaded before registration)."""
    rank: int
    alpha: float

    def lora_request(self) -> Any:
        """vLLM's ``LoRARequest`` for this adapter (vLLM imported only where one is sent)."""
        from vllm.lora.request import LoRARequest

        return LoRARequest(self.name, self.int_id, self.path)


def check_adapter_name(name: Any) -> str:
    if not isinstance(name, str) or not ADAPTER_NAME.fullmatch(name):
        raise ValueError(f"an adapter name is 1-64 letters, digits, '_' or '-' (starting with a "
                         f"letter or digit), got {name!r}")
    return name


def lora_rank_for(rank: int) -> int:
    """The smallest rank vLLM accepts as ``max_lora_rank`` that holds ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"adapter rank {rank} is above vLLM's largest ({VLLM_LORA_RANKS[-1]})")


def served_rank(largest: int) -> int:
    """The ``max_lora_rank`` an engine starts with for adapters up to rank ``largest`` (0:
    none yet): vLLM's next allowed rank, and at least 16, room for the usual ranks of
    adapters registered once it runs."""
    return max(16, lora_rank_for(max(1, largest)))


class AdapterSet:
    """The adapters one engine serves, by name."""

    def __init__(self) -> None:
        self._by_name: dict[str, Adapter] = {}
        self._next_id = 1

    def add(self, name: str, path: str, rank: int, alpha: float) -> Adapter:
        """Register a checked adapter under a fresh id (ValueError if the name is taken)."""
        check_adapter_name(name)
        if name in self._by_name:
            raise ValueError(f"adapter {name!r} is already registered")
        adapter = Adapter(name, self._next_id, path, rank, alpha)
        self._next_id += 1
        self._by_name[name] = adapter
        return adapter

    def remove(self, name: str) -> Adapter:
        try:
            return self._by_name.pop(name)
        except KeyError:
            raise KeyError(f"no adapter named {name!r}") from None

    def get(self, name: str) -> Adapter | None:
        return self._by_name.get(name) if isinstance(name, str) else None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._by_name

    def __iter__(self) -> Iterator[Adapter]:
        return iter(list(self._by_name.values()))

    def __len__(self) -> int:
        return len(self._by_name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    @property
    def max_rank(self) -> int:
        return max((a.rank for a in self._by_name.values()), default=0)
