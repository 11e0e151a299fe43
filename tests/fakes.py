"""A pipeline for server tests that need no vLLM and no torch: the product's own Pipeline,
Turn, scheduler, windowing and stitching over a fake engine (random SNAC frames, one frame
per loop turn, optionally held at a gate) and a codec that decodes to a quiet tone.

It makes the server's own logic (context lifecycles, admission, aborts, bad input) testable
in bounded time, and lets a test see the engine's work directly: tokens produced so far and
the requests still live."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from typing import AsyncIterator, Callable, Sequence

import numpy as np

from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.pipeline.engine import (
    EngineHealth,
    EngineOptions,
    SamplingOptions,
)
from livekit.plugins.veena.pipeline.adapters import AdapterSet
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions


class _Tokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1 + b % 250 for b in text.encode()]


class FakeEngine:
    """Yields one 7-token SNAC frame per event-loop turn, ``max_tokens // 7`` frames, or
    until ``hold_after`` frames, then waits for ``gate`` (set by the test)."""

    def __init__(self, max_num_seqs: int = 16, hold_after: int | None = None,
                 model: str = "fake") -> None:
        self.options = EngineOptions(model=model, max_model_len=1 << 20,
                                     max_num_seqs=max_num_seqs)
        self.tokenizer = _Tokenizer()
        self.adapters = AdapterSet()  # a fake applies no LoRA: it records what was asked
        self.adapters_asked: list[str | None] = []
        """Per request, the adapter it carried (None: the base model)."""
        self.last_output = time.monotonic()
        self.started = True
        self.health = EngineHealth("ready")
        self.hold_after = hold_after
        self.gate = asyncio.Event()
        self.tokens_out = 0
        """Tokens produced over all requests: a test reads the engine's work here."""
        self.live: set[str] = set()
        self.aborted: list[str] = []
        self._ids = itertools.count()
        self._dead_listeners: list[Callable[[str], None]] = []

    async def start(self, timeout: float | None = None) -> None:
        return None

    def add_dead_listener(self, listener: Callable[[str], None]) -> None:
        self._dead_listeners.append(listener)

    def remove_dead_listener(self, listener: Callable[[str], None]) -> None:
        self._dead_listeners.remove(listener)

    def mark_dead(self, reason: str) -> None:
        """As ``VllmEngine.mark_dead``: dead for good, listeners told once."""
        if self.health.state != "dead":
            self.health = EngineHealth("dead", reason)
            for listener in list(self._dead_listeners):
                listener(reason)

    def new_request_id(self, prefix: str = "fake") -> str:
        return f"{prefix}-{next(self._ids)}"

    @property
    def live_request_ids(self) -> frozenset[str]:
        return frozenset(self.live)

    @property
    def seq_slots(self) -> int:
        return self.options.max_num_seqs

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.live)

    async def generate(self, prompt: Sequence[int], sampling: SamplingOptions,
                       request_id: str | None = None, adapter=None) -> AsyncIterator[list[int]]:
        rid = request_id or self.new_request_id()
        self.adapters_asked.append(None if adapter is None else adapter.name)
        rng = np.random.default_rng(sampling.seed)
        self.live.add(rid)
        finished = False
        try:
            for k in range((sampling.max_tokens or 0) // 7):
                if self.hold_after is not None and k >= self.hold_after:
                    await self.gate.wait()
                await asyncio.sleep(0)
                self.tokens_out += 7
                self.last_output = time.monotonic()
                codes = rng.integers(0, 4096, 7)
                yield [VEENA.audio_token_base + p * 4096 + int(c) for p, c in enumerate(codes)]
            finished = True
        finally:
            self.live.discard(rid)
            if not finished:
                self.aborted.append(rid)

    async def aclose(self) -> None:
        return None


class ToneCodec:
    """SNAC's shape (24 kHz, 2048 samples per frame), decoding every frame to one quiet
    tone at almost no cost: never silence, which the silence guard would cut."""

    name, sample_rate, samples_per_step = "tone", 24000, 2048
    _tone = (0.1 * np.sin(np.arange(2048) * 2 * np.pi * 375 / 24000)).astype(np.float32)

    def decode(self, batch):
        return [np.tile(self._tone, b.codes.shape[0]) for b in batch]

    def warmup(self) -> None:
        pass


class ScriptedEngine(FakeEngine):
    """Plays one scripted token list per request, in order (the last one again once they run
    out), ``delta`` tokens at a time and within ``max_tokens``; records each request's
    prompt and sampling. Failure modes are crafted as scripts (``frames``, ``STOP``)."""

    def __init__(self, scripts: Sequence[Sequence[int]] | dict[str, Sequence[int]],
                 delta: int = 7, **kw) -> None:
        """``scripts``: in request order, or by request id (``"*"``: any other)."""
        super().__init__(**kw)
        self.scripts = scripts
        self.delta = delta
        self.requests: list[tuple[str, list[int], SamplingOptions]] = []

    async def generate(self, prompt: Sequence[int], sampling: SamplingOptions,
                       request_id: str | None = None, adapter=None) -> AsyncIterator[list[int]]:
        rid = request_id or self.new_request_id()
        if isinstance(self.scripts, dict):
            script = list(self.scripts.get(rid, self.scripts.get("*", [])))
        else:
            script = list(self.scripts[min(len(self.requests), len(self.scripts) - 1)])
        self.requests.append((rid, list(prompt), sampling))
        self.adapters_asked.append(None if adapter is None else adapter.name)
        script = script[:sampling.max_tokens or len(script)]
        self.live.add(rid)
        finished = False
        try:
            for k in range(0, len(script), self.delta):
                await asyncio.sleep(0)
                ids = script[k:k + self.delta]
                self.tokens_out += len(ids)
                self.last_output = time.monotonic()
                finished = k + self.delta >= len(script)  # its last output: not aborted
                yield ids
        finally:
            self.live.discard(rid)
            if not finished:
                self.aborted.append(rid)


STOP = VEENA.stop_token_ids[0]


def frames(codes) -> list[int]:
    """SNAC tokens of frames given as rows of 7 codes (or one code per frame, repeated)."""
    out: list[int] = []
    for row in codes:
        row = [int(row)] * 7 if np.ndim(row) == 0 else [int(c) for c in row]
        out += [VEENA.audio_token_base + p * 4096 + c for p, c in enumerate(row)]
    return out


class LevelCodec(ToneCodec):
    """SNAC's shape; a frame whose first code is 0 decodes to silence, any other to a tone
    at half scale: a test writes silence into a token script."""

    name = "level"
    _tone = 5 * ToneCodec._tone

    def decode(self, batch):
        return [np.concatenate([self._tone * (row[0] != 0) for row in b.codes])
                if len(b.codes) else np.zeros(0, np.float32) for b in batch]


@contextlib.asynccontextmanager
async def fake_pipeline(**engine_kw):
    """A started Pipeline over ``FakeEngine(**engine_kw)`` and ``ToneCodec``. It leaves the
    heap unfrozen: each freeze after a thaw is a full collection of this test process's heap
    (~0.5 s), and a property test starts hundreds of fake pipelines (``test_gc_heap`` tests the
    freeze)."""
    p = Pipeline(FakeEngine(**engine_kw), ToneCodec(), VEENA,
                 PipelineOptions(freeze_gc_heap=False))
    await p.start()
    try:
        yield p
    finally:
        await p.aclose()


class FakeServer:
    """A running server app over a fake pipeline: its URL, port, shared state and engine."""

    def __init__(self, url: str, state, pipeline: Pipeline) -> None:
        self.url = url
        self.port = int(url.rsplit(":", 1)[1])
        self.ws_url = url.replace("http://", "ws://") + "/v1/stream"
        self.state = state
        self.pipeline = pipeline
        self.engine: FakeEngine = pipeline.engine  # type: ignore[assignment]

    def idle(self) -> bool:
        """No context (nor its keepalive timer), stream slot, queued stream or engine request
        is left."""
        s = self.state
        return (not s.contexts and not s.keepalive_running
                and s.admission.active == 0 and s.admission.queued == 0
                and not self.engine.live
                and not [t for t in asyncio.all_tasks()
                         if t.get_name().startswith("veena-ctx-") and not t.done()])

    def leftovers(self) -> dict:
        """What is still held (for a failing test's message)."""
        s = self.state
        return {"contexts": [(c.cid, c.status, c.task.done()) for c in s.contexts],
                "active": s.admission.active, "queued": s.admission.queued,
                "connections": s.connections, "engine": sorted(self.engine.live),
                "tasks": [t.get_name() for t in asyncio.all_tasks()
                          if t.get_name().startswith("veena-ctx-") and not t.done()]}

    def settled(self) -> bool:
        """``idle``, and no connection open either."""
        return self.idle() and self.state.connections == 0


@contextlib.asynccontextmanager
async def fake_server(options, **engine_kw):
    """``create_app`` over ``fake_pipeline(**engine_kw)`` on a free loopback port."""
    from livekit.plugins.veena.server.state import STATE_KEY

    from .servers import serve_app

    async with fake_pipeline(**engine_kw) as p, serve_app(p, options) as (url, app):
        yield FakeServer(url, app[STATE_KEY], p)
