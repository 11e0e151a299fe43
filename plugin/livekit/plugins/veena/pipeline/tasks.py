"""Waiting out tasks this code cancelled, without swallowing a cancellation of its own.

``contextlib.suppress(CancelledError)`` around ``await task`` also eats a cancel aimed at
the caller while it waits (a user interrupting a turn whose chunk had just failed): the
caller then raised the chunk's error, which livekit retries, instead of ending.
"""

from __future__ import annotations

import asyncio
from typing import Iterable


async def settle(tasks: Iterable[asyncio.Future]) -> None:
    """Wait for each of ``tasks`` to end, whatever their outcome; if the calling task is
    cancelled meanwhile, still wait for the rest (they were cancelled: they end soon and
    free what they hold), then raise ``CancelledError``."""
    me = asyncio.current_task()
    before = me.cancelling() if me is not None else 0
    cancelled = False
    for task in tasks:
        try:
            await task
        except asyncio.CancelledError:
            if me is not None and me.cancelling() > before:
                cancelled = True
        except Exception:  # the task's own failure was reported where it ran
            pass
    if cancelled:
        raise asyncio.CancelledError
