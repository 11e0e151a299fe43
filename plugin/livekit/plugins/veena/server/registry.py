"""The work running now, over every connection: WebSocket contexts and HTTP speech tasks.

The drain, the keepalive timer and an engine death all walk these. A context is typed here
by the little they use of it (``LiveContext``), not by ``contexts.Context``: contexts depend
on the server's state, and the state on this registry, never the other way round."""

from __future__ import annotations

import asyncio
from typing import Protocol


class LiveContext(Protocol):
    """What the server does to a running context (``contexts.Context`` is one): read its
    status, wait for its task, send it a keepalive, fail it."""

    @property
    def cid(self) -> str: ...

    @property
    def status(self) -> str:
        """``open`` (takes text), ``closed`` (its text has ended) or ``ending``."""
        ...

    @property
    def task(self) -> asyncio.Task[None]: ...

    def keepalive(self, every_s: float) -> None: ...

    def fail(self, code: str, message: str) -> None: ...


class LiveWork:
    """Every running context and speech request, so that they can be drained or failed
    together."""

    def __init__(self) -> None:
        self.contexts: set[LiveContext] = set()
        """Every WebSocket context whose task has not ended, over all connections."""
        self.speeches: set[asyncio.Task] = set()
        """The work of every ``/v1/audio/speech`` request running: drained as contexts are."""
        self.cut_speeches: set[asyncio.Task] = set()
        """Speech work the drain cancelled at ``drain_s``: it answers ``shutting_down``."""

    def speech_ended(self, work: asyncio.Task) -> None:
        self.speeches.discard(work)
        self.cut_speeches.discard(work)
