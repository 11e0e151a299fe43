"""A fake vLLM ``AsyncLLM`` with vLLM's delivery pattern, for control-plane benchmarks: one
engine step for every running request together (``steps_per_s``, one token per request per
step, random SNAC codes), each request's new tokens put in its own collector, and DELTA
outputs merged when the consumer lags (as vLLM's ``RequestOutputCollector`` does), a
request's ``stream_interval`` kept as vLLM's output processor keeps it. The step
clock keeps running while the event loop lags (the engine core is another process), and
``stall`` stops it (a slow or stuck engine). It goes under the product's ``VllmEngine``."""

from __future__ import annotations

import asyncio
import importlib.util
import time
from dataclasses import dataclass, field

from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.pipeline.engine import EngineOptions, SamplingOptions, VllmEngine


@dataclass
class _Completion:
    token_ids: list[int]


@dataclass
class _Output:
    outputs: list[_Completion]
    finished: bool


@dataclass(eq=False)
class _Request:
    tokens: int
    start_step: int
    interval: int = 1
    """vLLM's ``stream_interval``: hand over the first token at once, then once this many
    new ones have gathered, and the rest at the end."""
    made: int = 0
    sent: int = 0
    unsent: list[int] = field(default_factory=list)
    output: _Output | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def step(self, ids: list[int], finished: bool) -> None:
        """One engine step's new tokens, handed over as vLLM's output processor would."""
        self.unsent.extend(ids)
        if finished or self.sent == 0 or len(self.unsent) >= self.interval:
            self.sent += len(self.unsent)
            self.put(self.unsent, finished)
            self.unsent = []

    def put(self, ids: list[int], finished: bool) -> None:
        if self.output is None:
            self.output = _Output([_Completion(ids)], finished)
            self.ready.set()
        else:  # the consumer lags: merge, as vLLM's collector does with DELTA outputs
            self.output.outputs[0].token_ids.extend(ids)
            self.output.finished = finished

    async def get(self) -> _Output:
        while self.output is None:
            await self.ready.wait()
        out, self.output = self.output, None
        self.ready.clear()
        return out


class FakeAsyncLLM:
    def __init__(self, frames_per_request: int, steps_per_s: float = 82.0) -> None:
        self.frames = frames_per_request
        self.steps_per_s = steps_per_s
        self.errored = False
        self._requests: dict[str, _Request] = {}
        self._t0 = time.perf_counter()
        self._stall_from = self._stall_until = 0.0
        self._task: asyncio.Task | None = None
        self.steps = 0
        self.deltas = 0
        """Outputs handed to consumers (one per wake of a consumer; merged while it lags)."""
        self.requests_started = 0
        self.step_cpu_s = 0.0
        """CPU time spent in the engine's steps (making tokens, filling collectors, waking
        consumers), measured inside the run it serves."""

    def stall(self, seconds: float) -> None:
        """No engine step for ``seconds`` from now (nothing is generated meanwhile; one stall
        per engine)."""
        now = time.perf_counter()
        self._stall_from, self._stall_until = now, now + seconds

    def _steps(self) -> int:
        now = time.perf_counter()
        stalled = max(0.0, min(now, self._stall_until) - self._stall_from)
        return int((now - self._t0 - stalled) * self.steps_per_s)

    async def _run(self) -> None:
        period = 1.0 / self.steps_per_s
        while self._requests:
            cpu = time.thread_time()
            step = self._steps()
            self.steps = step
            for req in list(self._requests.values()):
                due = min(req.tokens, step - req.start_step) - req.made
                if due > 0:
                    ids = [VEENA.audio_token_base + (k % 7) * 4096 + (k * 7919 + 13) % 4096
                           for k in range(req.made, req.made + due)]
                    req.made += due
                    req.step(ids, req.made >= req.tokens)
            self.step_cpu_s += time.thread_time() - cpu
            await asyncio.sleep(period - (time.perf_counter() - self._t0) % period)

    async def generate(self, prompt, params, request_id: str):
        req = _Request(self.frames * 7, self._steps(),
                       interval=getattr(params, "stream_interval", None) or 1)
        self.requests_started += 1
        self._requests[request_id] = req
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            finished = False
            while not finished:
                out = await req.get()
                finished = out.finished
                self.deltas += 1
                yield out
        finally:
            self._requests.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def get_num_unfinished_requests(self) -> int:
        return len(self._requests)

    def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()


class _Tokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1 + b % 250 for b in text.encode()]


def fake_vllm_engine(llm: FakeAsyncLLM, max_num_seqs: int) -> VllmEngine:
    """The product's ``VllmEngine`` (its generate, abort and death handling) over ``llm``.
    Where vLLM is not installed (the lent GPU machine: no registry, and vLLM's wheel is over
    what a run may carry), the validated ``SamplingOptions`` go to the fake as they are,
    since it ignores them: one ``SamplingParams`` less per request, nothing per token."""
    if importlib.util.find_spec("vllm") is None:
        SamplingOptions.to_vllm = lambda self: self
    engine = VllmEngine(EngineOptions(model="fake", max_model_len=1 << 20,
                                      max_num_seqs=max_num_seqs))
    engine._llm, engine._tokenizer = llm, _Tokenizer()
    if hasattr(engine, "_dead"):  # the engine before #21 waited on this future per token
        engine._dead = asyncio.get_running_loop().create_future()
    return engine
