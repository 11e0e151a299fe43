"""LoRA adapters a server serves from ``VEENA_ADAPTERS_DIR``: each adapter folder there is a
voice by its folder name, and the server keeps in step with the folder, so replicas sharing
it serve the same adapters (as saved voices are read from a shared folder).

- At start (``load_folder``, before the engine starts) every folder there is checked and
  served; one that fails its check is logged and skipped, never fatal to the server.
- Every ``adapters_refresh_s`` (``ServedAdapters.refresh``) folders that appeared are served,
  adapters whose folder went away are dropped, and an adapter whose files changed is checked
  again and served under a new id (or, refused, keeps its checked copy).
- The admin routes (``adapter_routes``) and the refresh change the folder and the engine's
  adapters under one lock.

An adapter is copied and checked off the event loop (it can be hundreds of MB) and only then
registered with the engine, so a bad one reaches nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import replace
from pathlib import Path

from ..models.adapter_files import stamp
from ..models.adapters import AdapterError, adapter_folders, check_adapter, serve_checked
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
            serve_checked(engine, check_adapter(name, str(path), engine.options.model,
                                                engine.options.max_lora_rank))
        except AdapterError as e:
            logger.error("adapter not served: %s", e, extra={"adapter": name})


class ServedAdapters:
    """The server's view of ``VEENA_ADAPTERS_DIR`` (None: no folder): what failed its check
    (not read again until its files change), and the lock under which the folder and the
    engine's adapters change."""

    def __init__(self, root: str | None, pipeline: Pipeline) -> None:
        self.root = Path(os.path.abspath(root)) if root else None
        self.pipeline = pipeline
        self.failed: dict[str, tuple] = {}
        self.lock = asyncio.Lock()

    def in_folder(self, adapter: Adapter) -> bool:
        """Whether ``adapter`` is served from a folder of ``root`` (the folder, not where a
        link there points: removing it moves the link)."""
        return self.root is not None and Path(adapter.source).parent == self.root

    async def refresh(self) -> None:
        """Serve folders that appeared or changed, drop adapters whose folder went away."""
        if self.root is None:
            return
        async with self.lock:
            loop = asyncio.get_running_loop()
            found = await loop.run_in_executor(None, adapter_folders, self.root)
            adapters = self.pipeline.engine.adapters
            for adapter in adapters:
                if adapter.name not in found and self.in_folder(adapter):
                    adapters.remove(adapter.name)
            for name, path in found.items():
                served = adapters.get(name)
                if name in self.pipeline.profile.voices or (
                        served is not None and not self.in_folder(served)):
                    continue
                now = await loop.run_in_executor(None, stamp, path)
                if (served is not None and served.stamp == now) or self.failed.get(name) == now:
                    continue
                try:
                    await self.serve(name, path, replace=served is not None)
                except AdapterError as e:
                    self.failed[name] = now
                    logger.error("adapter not served%s: %s", " (its checked copy still is)"
                                 if served is not None else "", e, extra={"adapter": name})

    async def serve(self, name: str, path: Path, replace: bool = False) -> Adapter:
        """Check ``path`` off the event loop, then serve it as ``name`` (``replace``: in place
        of the files served under it); AdapterError. Called under ``lock``."""
        engine = self.pipeline.engine
        checked = await asyncio.get_running_loop().run_in_executor(
            None, check_adapter, name, str(path), engine.options.model,
            engine.options.max_lora_rank)
        adapter = serve_checked(engine, checked, replace=replace)
        self.failed.pop(name, None)
        return adapter
