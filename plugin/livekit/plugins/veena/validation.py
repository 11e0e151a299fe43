"""Type-and-range checks for every value that crosses an edge (client JSON, plugin options,
what the engine wrapper hands to vLLM).

Python's own types are too forgiving here: ``True`` is an ``int``, ``1.5`` passes ``>= 1``,
and ``nan`` fails every comparison silently. vLLM's engine core decodes requests with
msgspec, and one float where it expects an int kills its input thread for every client, so
nothing may reach it unchecked. Each check raises ``ValueError`` naming the field.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

UNLOADABLE_JSON = (ValueError, RecursionError)
"""What ``json.loads`` raises on text a client controls: ``ValueError`` (not JSON, not
UTF-8, an int past Python's 4300 digits) and ``RecursionError`` (nesting past the
interpreter's limit, well within a 64 KiB message)."""
MAX_C_INT = 2**31 - 1
"""The largest count or byte size a setting may name: what a socket option (a C int) takes."""
MAX_DURATION_S = 86_400.0
"""The longest a timeout or wait setting may be (a day: longer is a typo, and the OS's poll
takes no more than about 24 days in milliseconds)."""


def is_int(value: Any) -> bool:
    """A real integer (numpy's too): not a bool, not a float that happens to be whole.
    A plain ``int`` is answered first: a prompt's every token passes here, and the ABC check
    costs several times more."""
    return type(value) is int or (isinstance(value, numbers.Integral)
                                  and not isinstance(value, bool))


def is_number(value: Any) -> bool:
    """A finite real number, Python's or numpy's (not a bool, not NaN or infinity, not an
    int past what a float holds: JSON's ints have no bound)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    if not is_int(value):
        raise ValueError(f"{name} must be an integer, got {_show(value)}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"{name} must be in [{_bound(lo)}, {_bound(hi)}], got {value}")
    return int(value)


def check_float(name: str, value: Any, lo: float | None = None, hi: float | None = None,
                *, lo_open: bool = False) -> float:
    """A finite number in [lo, hi] (or (lo, hi] with ``lo_open``), returned as a float."""
    if not is_number(value):
        raise ValueError(f"{name} must be a finite number, got {_show(value)}")
    value = float(value)
    below = lo is not None and (value <= lo if lo_open else value < lo)
    if below or (hi is not None and value > hi):
        left = "(" if lo_open else "["
        raise ValueError(f"{name} must be in {left}{_bound(lo)}, {_bound(hi)}], got {value}")
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {_show(value)}")
    return value


def check_str(name: str, value: Any, max_len: int | None = None) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {_show(value)}")
    if max_len is not None and len(value) > max_len:
        raise ValueError(f"{name} must be at most {max_len} characters, got {len(value)}")
    return value


def check_int_list(name: str, value: Any, lo: int, hi: int, length: int | None = None
                   ) -> tuple[int, ...]:
    """A list (or tuple) of integers, each in [lo, hi], optionally of an exact length."""
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of integers, got {_show(value)}")
    if length is not None and len(value) != length:
        raise ValueError(f"{name} must hold exactly {length} integers, got {len(value)}")
    for i, v in enumerate(value):
        if not is_int(v) or not lo <= v <= hi:
            raise ValueError(f"{name}[{i}] must be an integer in [{lo}, {hi}], got {_show(v)}")
    return tuple(int(v) for v in value)


def _bound(b: float | None) -> str:
    return "inf" if b is None else str(b)


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"
