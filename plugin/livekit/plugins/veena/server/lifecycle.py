"""The server's life around its running work: the keepalive timer while contexts run, the
refusal of new work when the engine is dead or the server stops, the drain at SIGTERM, and
the failing of every context when the engine dies."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from ..pipeline.engine import VllmEngine
from .metrics import ServerMetrics
from .options import ServerOptions
from .registry import LiveContext, LiveWork

logger = logging.getLogger(__name__)


class Lifecycle:
    """When new work is taken, how running work is kept alive, and how it ends with the
    server or the engine."""

    def __init__(self, engine: VllmEngine, options: ServerOptions, metrics: ServerMetrics,
                 live: LiveWork) -> None:
        self._engine = engine
        self._options = options
        self._metrics = metrics
        self._live = live
        self.stopping = False
        """The server is stopping (SIGTERM): no new stream or context is taken."""
        self.goodbyes: set[Callable[[], Awaitable[None]]] = set()
        """Per open WebSocket: send what is queued, then close it (1001), as the server stops."""
        self._keepalive: asyncio.TimerHandle | None = None

    def add_context(self, ctx: LiveContext) -> None:
        """A context has started: it is failed with the others if the engine dies, and
        hears keepalives while it is silent."""
        self._live.contexts.add(ctx)
        if self._keepalive is None:
            self._arm_keepalive()

    def remove_context(self, ctx: LiveContext) -> None:
        """A context has ended; the keepalive timer stops with the last one."""
        self._live.contexts.discard(ctx)
        if not self._live.contexts:
            self.close()

    @property
    def keepalive_running(self) -> bool:
        return self._keepalive is not None

    def _keep_alive(self) -> None:
        """One timer for every context of every connection (not a task per connection):
        each live context silent for ``keepalive_s`` gets a ``waiting`` event. It runs while
        there are contexts and stops with the last one."""
        self._keepalive = None
        for ctx in list(self._live.contexts):
            ctx.keepalive(self._options.keepalive_s)
        if self._live.contexts:
            self._arm_keepalive()

    def _arm_keepalive(self) -> None:
        self._keepalive = asyncio.get_running_loop().call_later(
            self._options.keepalive_s / 2, self._keep_alive)

    def close(self) -> None:
        """Stop the keepalive timer (the app is shutting down, or no context is left)."""
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None

    def refusal(self) -> tuple[str, str] | None:
        """Why no new stream can be accepted now (code, message), or None."""
        health = self._engine.health
        if health.state == "dead":
            return "engine_dead", f"the TTS engine is dead: {health.reason}"
        if self.stopping:
            return "shutting_down", "the server is stopping: try another replica"
        return None

    async def drain(self) -> None:
        """The server stops. aiohttp reads nothing more from any socket from now on, so a
        context still open for text could never be finished: it ends at once with the
        retryable ``shutting_down`` (its client sends the turn elsewhere); a context with all
        its text speaks to its end, for up to ``drain_s``, and so does each HTTP speech
        request; then each socket sends what it has queued and closes with 1001 (going away),
        and a speech request still running answers ``shutting_down`` (or, streaming, is cut).
        aiohttp's own wait for running handlers then has nothing left to wait for."""
        live, drain_s = self._live, self._options.drain_s
        self.stopping = True
        for ctx in list(live.contexts):
            if ctx.status == "open":
                ctx.fail("shutting_down", "the server is stopping before this context's "
                         "text ended: send the turn again elsewhere")
        tasks = [ctx.task for ctx in live.contexts] + list(live.speeches)
        if tasks:
            logger.info("draining: %d contexts and %d speech requests speak to their end",
                        len(live.contexts), len(live.speeches))
            await asyncio.wait(tasks, timeout=drain_s)
        for ctx in list(live.contexts):
            ctx.fail("shutting_down", f"the server stopped after {drain_s:g} s "
                     "of draining (VEENA_DRAIN_S)")
        for work in list(live.speeches):
            live.cut_speeches.add(work)
            work.cancel()
        tasks = [ctx.task for ctx in live.contexts] + list(live.speeches)
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        await asyncio.gather(*(goodbye() for goodbye in list(self.goodbyes)))

    def on_engine_dead(self, reason: str) -> None:
        self._metrics.engine_up.set(0)
        for ctx in list(self._live.contexts):
            ctx.fail("engine_dead", f"the TTS engine died: {reason}")
