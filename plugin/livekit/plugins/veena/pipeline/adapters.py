"""LoRA adapters the engine applies per request: a user's fine-tuned voices on one base model.

The engine holds one ``AdapterSet``. vLLM caches an adapter by its int id alone, and front
ends of one shared engine core register adapters each on their own, so an id is never
counted here: it is derived from the adapter's name and the hash of its files
(``models.adapter_files``), the same in every process and never the id of other weights.
vLLM reads ``path`` (this process's copy of the checked files, one per registration)
whenever it (re)loads the adapter, so that folder must outlive every request that carries
it: requests and turns ``hold`` their adapter, and the copy of an adapter removed or
replaced is freed only once nothing holds it. Checking an adapter's files
against the base model happens before registration (``models.adapters``).
"""

from __future__ import annotations

import re
import asyncio
import logging
import shutil
from dataclasses import dataclass
from typing import Any, Iterator

logger = logging.getLogger(__name__)

ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
"""An adapter's name: it becomes a speaker name in prompts (``<spk_NAME>``, ``NAME: text``),
so nothing that could close a tag or start a new line."""

MAX_ADAPTER_ID = 2**63 - 1
"""vLLM keeps adapter ids in int64 arrays and refuses an id below 1."""
FREE_AFTER_S = 30.0
"""How long a freed adapter's folder stays after its last request ended: an abort reaches
vLLM's core a moment after our request ends, and the core may load the adapter until then."""

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
    source: str = ""
    """The folder its files were read from (a refresh compares them with ``stamp``)."""
    stamp: tuple = ()
    """The source files' sizes, times and inodes when they were read."""
    owned: bool = False
    """``path`` is this process's own copy of the checked files: removed once freed."""

    def lora_request(self) -> Any:
        """vLLM's ``LoRARequest`` for this adapter (vLLM imported only where one is sent)."""
        from vllm.lora.request import LoRARequest

        return LoRARequest(self.name, self.int_id, self.path)


def check_adapter_name(name: Any) -> str:
    if not isinstance(name, str) or not ADAPTER_NAME.fullmatch(name):
        raise ValueError(f"an adapter name is 1-64 letters, digits, '_' or '-' (starting with a "
                         f"letter or digit), got {name!r}")
    return name


def check_adapter_id(int_id: Any) -> int:
    if not isinstance(int_id, int) or isinstance(int_id, bool) or not (
            1 <= int_id <= MAX_ADAPTER_ID):
        raise ValueError(f"an adapter id is an int in [1, 2**63 - 1], got {int_id!r}")
    return int_id


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
    """The adapters one engine serves, by name, and the requests holding each one's files
    (by path: every check makes its own copy)."""

    def __init__(self, free_after_s: float = FREE_AFTER_S) -> None:
        self._by_name: dict[str, Adapter] = {}
        self._holds: dict[str, int] = {}
        self._retired: dict[str, Adapter] = {}
        """Removed or replaced, still held: usable by their holders, by no new request."""
        self.free_after_s = free_after_s

    def add(self, adapter: Adapter) -> Adapter:
        """Register a checked adapter (ValueError if its name is taken)."""
        check_adapter_name(adapter.name)
        check_adapter_id(adapter.int_id)
        if adapter.name in self._by_name:
            raise ValueError(f"adapter {adapter.name!r} is already registered")
        self._by_name[adapter.name] = adapter
        self._retired.pop(adapter.path, None)  # the same copy again
        return adapter

    def replace(self, adapter: Adapter) -> Adapter | None:
        """Serve ``adapter`` under its name from now on (new files): requests holding the
        one it replaces finish with it. Returns that one (None: the name was not served)."""
        old = self._by_name.pop(adapter.name, None)
        self.add(adapter)
        if old is not None and old.path != adapter.path:
            self._retire(old)
        return old

    def remove(self, name: str) -> Adapter:
        """Stop serving ``name`` to new requests (KeyError if unknown); those holding it
        finish with it, and its files are freed after the last."""
        try:
            adapter = self._by_name.pop(name)
        except KeyError:
            raise KeyError(f"no adapter named {name!r}") from None
        logger.info("adapter removed", extra={"adapter": name, "lora_int_id": adapter.int_id,
                                              "held_by": self.held(adapter)})
        self._retire(adapter)
        return adapter

    def usable(self, adapter: Adapter) -> bool:
        """Registered now, or retired and still held (a turn that began with it)."""
        served = self._by_name.get(adapter.name)
        if served is not None and served.path == adapter.path:
            return True
        return adapter.path in self._retired and self.held(adapter) > 0

    def hold(self, adapter: Adapter) -> None:
        """Keep ``adapter``'s files while a request or turn carries it (ValueError where it
        is not usable: removed, or never registered here); ``release`` once done."""
        if not self.usable(adapter):
            raise ValueError(f"adapter {adapter.name!r} is not registered with this engine")
        self._holds[adapter.path] = self.held(adapter) + 1

    def release(self, adapter: Adapter) -> None:
        count = self.held(adapter) - 1
        if count > 0:
            self._holds[adapter.path] = count
            return
        self._holds.pop(adapter.path, None)
        retired = self._retired.pop(adapter.path, None)
        if retired is not None:
            self._free(retired)

    def held(self, adapter: Adapter) -> int:
        return self._holds.get(adapter.path, 0)

    def _retire(self, adapter: Adapter) -> None:
        if self.held(adapter):
            self._retired[adapter.path] = adapter
        else:
            self._free(adapter)

    def _free(self, adapter: Adapter) -> None:
        """Remove the adapter's own copy of its files (after ``free_after_s``)."""
        if not adapter.owned:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or self.free_after_s <= 0:
            self._free_now(adapter)
        else:
            loop.call_later(self.free_after_s, self._free_now, adapter)

    def _free_now(self, adapter: Adapter) -> None:
        if self.usable(adapter) or self.held(adapter):
            return  # the same copy was registered again meanwhile
        shutil.rmtree(adapter.path, ignore_errors=True)
        logger.info("adapter files freed", extra={"adapter": adapter.name,
                                                  "lora_int_id": adapter.int_id})

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
