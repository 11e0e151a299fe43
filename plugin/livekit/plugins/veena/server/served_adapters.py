"""LoRA adapters a server serves from ``VEENA_ADAPTERS_DIR``: each adapter folder there is a
voice by its folder name, and the server keeps in step with the folder, so replicas sharing
it serve the same adapters (as saved voices are read from a shared folder).

- At start (``load_folder``, before the engine starts) every folder there is checked and
  served; one that fails its check is logged and skipped, never fatal to the server.
- Every ``adapters_refresh_s`` (``ServedAdapters.refresh``) folders that appeared are served
  and adapters whose folder went away are dropped.

An adapter is read and checked off the event loop (it can be hundreds of MB) and only then
registered with the engine, so a bad one reaches nothing.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

from ..models.adapters import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    AdapterError,
    adapter_folders,
    check_adapter,
    register_adapter,
)
from ..pipeline.adapters import Adapter
from ..pipeline.pipeline import Pipeline

logger = logging.getLogger(__name__)

REMOVED = ".removed"
"""Where a removed adapter's folder goes, inside ``VEENA_ADAPTERS_DIR`` (never scanned)."""


def load_folder(pipeline: Pipeline, root: str) -> None:
    """Serve every adapter in ``root`` before the engine starts (blocking). LoRA is turned
    on even for an empty folder, unless set off: adapters may come later."""
    if not Path(root).is_dir():
        raise AdapterError(f"VEENA_ADAPTERS_DIR {root} is not a folder")
    engine = pipeline.engine
    if engine.options.enable_lora is None:
        engine.options = replace(engine.options, enable_lora=True)
    for name, path in adapter_folders(root).items():
        if name in engine.adapters or name in pipeline.profile.voices:
            continue
        try:
            register_adapter(engine, name, str(path), engine.options.model)
        except AdapterError as e:
            logger.error("adapter not served: %s", e, extra={"adapter": name})


class ServedAdapters:
    """The server's view of ``VEENA_ADAPTERS_DIR`` (None: no folder): what failed its check
    (not read again until its files change), and the names being added now."""

    def __init__(self, root: str | None, pipeline: Pipeline) -> None:
        self.root = Path(root) if root else None
        self.pipeline = pipeline
        self.failed: dict[str, float] = {}
        self.adding: set[str] = set()
        self.lock = asyncio.Lock()

    async def refresh(self) -> None:
        """Serve folders that appeared, drop adapters whose folder went away."""
        if self.root is None:
            return
        async with self.lock:
            loop = asyncio.get_running_loop()
            found = await loop.run_in_executor(None, adapter_folders, self.root)
            engine = self.pipeline.engine
            root = self.root.resolve()
            for adapter in engine.adapters:
                if adapter.name not in found and Path(adapter.path).parent == root:
                    engine.remove_adapter(adapter.name)
            for name, path in found.items():
                stamp = _stamp(path)
                if (name in engine.adapters or name in self.adding
                        or self.failed.get(name) == stamp
                        or name in self.pipeline.profile.voices):
                    continue
                try:
                    await self.serve(name, path)
                except AdapterError as e:
                    self.failed[name] = stamp
                    logger.error("adapter not served: %s", e, extra={"adapter": name})

    async def serve(self, name: str, path: Path) -> Adapter:
        """Check ``path`` off the event loop, then serve it as ``name`` (AdapterError)."""
        engine = self.pipeline.engine
        checked = await asyncio.get_running_loop().run_in_executor(
            None, check_adapter, str(path), engine.options.model)
        try:
            return engine.add_adapter(name, checked.path, checked.rank, checked.alpha)
        except ValueError as e:
            raise AdapterError(str(e)) from None


def _stamp(path: Path) -> float:
    """When the adapter's files last changed (a failed one is read again after a fix)."""
    try:
        return max((path / f).stat().st_mtime for f in (CONFIG_FILE, WEIGHTS_FILE)
                   if (path / f).exists())
    except (OSError, ValueError):
        return 0.0
