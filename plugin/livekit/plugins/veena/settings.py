"""Reading tunables from the environment: one helper per type, a clear error on bad values."""

from __future__ import annotations

import os


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _parse(name: str, default, kind):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a valid {kind.__name__}") from None


def env_int(name: str, default: int) -> int:
    return _parse(name, default, int)


def env_float(name: str, default: float) -> float:
    return _parse(name, default, float)


def env_bool_or_auto(name: str, default: bool | None) -> bool | None:
    """``auto`` (None): the caller decides from what it finds."""
    if os.environ.get(name, "").strip().lower() == "auto":
        return None
    return env_bool(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"environment variable {name}={raw!r} is not a boolean")
