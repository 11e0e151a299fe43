"""The files vLLM reads for an adapter: this process's own copy of what was checked.

vLLM reads an adapter's folder whenever it (re)loads it, long after our check, and caches it
by its int id alone. So the check runs on a copy no one else writes (files replaced in the
user's folder are never read under an id they were not checked for), the copy outlives
every request holding it (``pipeline.adapters.AdapterSet``), and the id is derived from the
adapter's name and the hash of the copied bytes: every process that shares an engine core
gives the same adapter the same id, and other weights never get it. Each registration has
a copy of its own (freed once no request holds it).

The copies live in a private temporary folder of this process (under ``TMPDIR``), removed
at exit.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import uuid
from pathlib import Path

from ..pipeline.adapters import MAX_ADAPTER_ID

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
FILES = (CONFIG_FILE, WEIGHTS_FILE)

_root: tempfile.TemporaryDirectory | None = None
_root_lock = threading.Lock()


def copies_root() -> Path:
    """This process's folder of adapter copies (made on first use, removed at exit)."""
    global _root
    with _root_lock:
        if _root is None or not Path(_root.name).is_dir():
            _root = tempfile.TemporaryDirectory(prefix="veena-adapters-")
        return Path(_root.name)


def stamp(folder: Path) -> tuple:
    """What changes when an adapter's files are replaced or rewritten: per file its size,
    modification time and inode (None where missing)."""
    found = []
    for name in FILES:
        try:
            st = os.stat(folder / name)
        except OSError:
            found.append(None)
        else:
            found.append((st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(found)


def copy_files(folder: Path) -> tuple[Path, str]:
    """Copy the adapter's files that exist into a new folder of ``copies_root`` and hash
    them as they are read (one pass): (the copy, the SHA-256 hex of the files' bytes)."""
    copy = copies_root() / f".copy-{uuid.uuid4().hex}"
    copy.mkdir()
    digest = hashlib.sha256()
    try:
        for name in FILES:
            source = folder / name
            if not source.is_file():
                digest.update(b"\0missing\0")
                continue
            digest.update(name.encode() + b"\0")
            with open(source, "rb") as src, open(copy / name, "wb") as dst:
                while block := src.read(1 << 20):
                    digest.update(block)
                    dst.write(block)
            digest.update(b"\0end\0")
    except BaseException:
        shutil.rmtree(copy, ignore_errors=True)
        raise
    return copy, digest.hexdigest()


def adapter_id(name: str, digest: str) -> int:
    """A positive 63-bit id from the adapter's name and files' hash (vLLM's ids are int64
    and above 0)."""
    value = int.from_bytes(hashlib.sha256(f"{name}\0{digest}".encode()).digest()[:8], "big")
    return (value & MAX_ADAPTER_ID) or 1


def publish(copy: Path, name: str, int_id: int) -> Path:
    """The checked copy under its final name (its own: two engines of one process serving
    the same adapter never free each other's copy)."""
    final = copy.parent / f"{name}-{int_id:016x}-{uuid.uuid4().hex[:8]}"
    os.rename(copy, final)
    return final


def discard(copy: Path) -> None:
    shutil.rmtree(copy, ignore_errors=True)
