"""The admin routes of LoRA adapters (``server/served_adapters`` keeps the folder):
``POST /v1/adapters`` ``{"name": NAME}`` serves ``VEENA_ADAPTERS_DIR/NAME``; with
``"hub_id": "OWNER/REPO"`` the adapter is first downloaded there (into a hidden folder,
renamed into place once complete). ``DELETE /v1/adapters/NAME`` stops serving it to new
streams and moves its folder (or the link there) to ``.removed/`` (kept, not deleted), so
that every replica drops it. Both are behind the API key, as voice uploads are.
A bad adapter is a 4xx with the reason; the streams running meanwhile never notice.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path

from aiohttp import web

from ..models.adapters import CONFIG_FILE, WEIGHTS_FILE, AdapterError, check_name
from .errors import json_error
from .served_adapters import REMOVED, ServedAdapters
from .state import ServerState, server_state

logger = logging.getLogger(__name__)

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


async def add(request: web.Request) -> web.Response:
    """``POST /v1/adapters``: serve ``VEENA_ADAPTERS_DIR/NAME`` (downloading ``hub_id``
    there first): 201 with its name, rank and id, or 4xx with the reason."""
    state = server_state(request)
    folder: ServedAdapters = state.adapters
    if folder.root is None:
        return json_error("bad_request", "this server has no VEENA_ADAPTERS_DIR")
    try:
        body = await request.json()
    except (ValueError, RecursionError):
        return json_error("bad_json", "the body must be a JSON object")
    if not isinstance(body, dict):
        return json_error("bad_json", "the body must be a JSON object")
    try:
        name = check_name(body.get("name"))
    except AdapterError as e:
        return json_error("bad_field", str(e))
    hub_id = body.get("hub_id")
    if hub_id is not None and (not isinstance(hub_id, str) or not _HUB_ID.fullmatch(hub_id)):
        return json_error("bad_field", "hub_id must be OWNER/REPO")
    if state.voices.is_profile_voice(name) or state.voices.find(name) is not None:
        return json_error("voice_exists", f"{name!r} is already a voice of this server")
    path = folder.root / name
    engine = state.pipeline.engine
    if name in engine.adapters:
        return json_error("adapter_exists", f"adapter {name!r} is already served")
    downloaded = None
    if hub_id is not None:  # into a hidden folder first: a failed download leaves nothing
        if path.exists() or path.is_symlink():
            return json_error("adapter_exists", f"{path.name}/ already exists in "
                              "VEENA_ADAPTERS_DIR: add it without hub_id")
        downloaded = folder.root / f".download-{name}-{uuid.uuid4().hex[:12]}"
        try:
            await asyncio.get_running_loop().run_in_executor(None, _download, hub_id,
                                                             downloaded)
        except AdapterError as e:
            shutil.rmtree(downloaded, ignore_errors=True)
            return json_error("download_failed", str(e))
    async with folder.lock:  # a refresh neither drops nor serves it meanwhile
        try:
            if name in engine.adapters:
                return json_error("adapter_exists", f"adapter {name!r} is already served")
            if downloaded is not None:
                if path.exists() or path.is_symlink():
                    return json_error("adapter_exists", f"{path.name}/ already exists in "
                                      "VEENA_ADAPTERS_DIR: add it without hub_id")
                os.rename(downloaded, path)
            elif not path.is_dir():
                return json_error("not_found", f"no folder {name!r} in VEENA_ADAPTERS_DIR")
            try:
                adapter = await folder.serve(name, path)
            except AdapterError as e:
                if downloaded is not None:  # ours: a later POST may try again
                    await asyncio.get_running_loop().run_in_executor(
                        None, shutil.rmtree, path, True)
                return json_error("bad_adapter", str(e))
        finally:
            if downloaded is not None and downloaded.exists():
                shutil.rmtree(downloaded, ignore_errors=True)
    return web.json_response({"name": adapter.name, "rank": adapter.rank,
                              "lora_int_id": adapter.int_id}, status=201)


def _download(hub_id: str, path: Path) -> None:
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(hub_id, local_dir=str(path), allow_patterns=[CONFIG_FILE, WEIGHTS_FILE])
    except Exception as e:  # the hub's errors are many types: one clear message
        raise AdapterError(f"cannot download adapter {hub_id!r}: {type(e).__name__}: {e}"
                           ) from None
    if not (path / CONFIG_FILE).is_file():
        raise AdapterError(f"hub repo {hub_id!r} has no {CONFIG_FILE}")


async def remove(request: web.Request) -> web.Response:
    """``DELETE /v1/adapters/NAME``: stop serving it here and move its folder (or the link
    there) aside, so every replica drops it; streams already speaking with it finish."""
    state = server_state(request)
    folder: ServedAdapters = state.adapters
    name = request.match_info["name"]
    adapters = state.pipeline.engine.adapters
    if folder.root is None:
        return json_error("not_found", f"no adapter named {name!r} is served")
    async with folder.lock:
        adapter = adapters.get(name)
        if adapter is None:
            return json_error("not_found", f"no adapter named {name!r} is served")
        if folder.in_folder(adapter):
            path = Path(adapter.source)
            if path.exists() or path.is_symlink():
                try:
                    await asyncio.get_running_loop().run_in_executor(
                        None, _move_aside, folder.root, path)
                except OSError as e:
                    logger.error("cannot remove the adapter's folder: %s", e,
                                 extra={"adapter": name})
                    return json_error("cannot_remove", f"adapter {name!r} is still served: "
                                      f"its folder cannot be moved ({e.strerror or e})")
        adapters.remove(name)
    return web.json_response({"name": name, "removed": True})


def _move_aside(root: Path, path: Path) -> Path:
    """Move ``path`` (a folder, or a link: the link itself) into ``root/.removed`` under a
    name no other removal takes."""
    aside = root / REMOVED / f"{path.name}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    aside.parent.mkdir(exist_ok=True)
    os.rename(path, aside)
    return aside


async def refresh_forever(state: ServerState) -> None:
    """The background task that keeps this server in step with the folder: no failure of
    one refresh ends it."""
    while True:
        await asyncio.sleep(state.options.adapters_refresh_s)
        try:
            await state.adapters.refresh()
        except OSError as e:  # the folder went away or is unreadable: try again later
            logger.warning("cannot read VEENA_ADAPTERS_DIR: %s", e)
        except Exception:
            logger.exception("the adapters' refresh failed (tried again later)")
