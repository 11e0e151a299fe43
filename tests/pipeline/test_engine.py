"""The vLLM shell on a fake ``AsyncLLM`` (no vLLM start, no clock): a plain ``async for`` over
vLLM's stream, and still every request ends when the engine dies, whether it is blocked on
vLLM or busy with its last tokens; leaving early aborts; a foreign cancel stays a cancel."""

import asyncio
from dataclasses import dataclass

import pytest

from livekit.plugins.veena.pipeline.engine import (
    EngineDeadError,
    EngineError,
    EngineOptions,
    SamplingOptions,
    VllmEngine,
)


@dataclass
class _Completion:
    token_ids: list


@dataclass
class _Output:
    outputs: list
    finished: bool


class FakeLLM:
    """Streams ``per_request`` outputs of one token each, then blocks until ``release``."""

    def __init__(self, per_request: int = 2, finish: bool = False) -> None:
        self.per_request, self.finish = per_request, finish
        self.release = asyncio.Event()
        self.aborted: list[str] = []
        self.errored = False

    async def generate(self, prompt, params, request_id):
        for k in range(self.per_request):
            last = self.finish and k == self.per_request - 1
            yield _Output([_Completion([100 + k])], last)
        await self.release.wait()

    async def abort(self, request_id):
        self.aborted.append(request_id)

    def get_num_unfinished_requests(self) -> int:
        return 0


def _engine(llm: FakeLLM) -> VllmEngine:
    engine = VllmEngine(EngineOptions(model="fake"))
    engine._llm = llm  # started: ``start()`` returns at once
    return engine


async def _take(engine: VllmEngine, got: list, request_id: str = "r1", hold=None):
    async for ids in engine.generate([1, 2, 3], SamplingOptions(max_tokens=10), request_id):
        got.append(ids)
        if hold is not None:
            await hold.wait()  # busy with its tokens, outside the engine


async def _until(cond) -> None:
    for _ in range(1000):  # event-loop turns, not time
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def test_a_request_blocked_on_vllm_ends_with_engine_dead():
    llm = FakeLLM()
    engine = _engine(llm)
    got = []
    consumer = asyncio.create_task(_take(engine, got))
    await _until(lambda: len(got) == 2)
    await asyncio.sleep(0)  # now blocked inside vLLM's stream
    assert engine.live_request_ids == {"r1"}
    engine.mark_dead("core exited")
    with pytest.raises(EngineDeadError, match="core exited"):
        await consumer
    assert not consumer.cancelled() and consumer.cancelling() == 0
    assert engine.live_request_ids == frozenset() and llm.aborted == []  # nothing to abort


async def test_a_request_busy_with_its_tokens_ends_with_engine_dead_when_it_asks_again():
    engine = _engine(FakeLLM())
    got, hold = [], asyncio.Event()
    consumer = asyncio.create_task(_take(engine, got, hold=hold))
    await _until(lambda: len(got) == 1)
    engine.mark_dead("core exited")
    hold.set()
    with pytest.raises(EngineDeadError):
        await consumer
    assert got == [[100]] and engine.live_request_ids == frozenset()


async def test_leaving_early_aborts_and_a_foreign_cancel_stays_a_cancel():
    llm = FakeLLM()
    engine = _engine(llm)
    got = []
    gen = engine.generate([1], SamplingOptions(max_tokens=10), "early")
    got.append(await gen.__anext__())
    await gen.aclose()
    assert got == [[100]] and llm.aborted == ["early"]

    consumer = asyncio.create_task(_take(engine, got, "cancelled"))
    await _until(lambda: len(got) == 3)
    await asyncio.sleep(0)
    consumer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await consumer
    assert llm.aborted == ["early", "cancelled"] and engine.dead_reason is None
    assert engine.live_request_ids == frozenset()


async def test_a_finished_request_is_not_aborted_and_errors_map_onto_ours():
    llm = FakeLLM(per_request=3, finish=True)
    engine = _engine(llm)
    got = []
    await _take(engine, got, "done")
    assert got == [[100], [101], [102]] and llm.aborted == []

    class Broken(FakeLLM):
        async def generate(self, prompt, params, request_id):
            yield _Output([_Completion([1])], False)
            raise RuntimeError("bad request")

    engine = _engine(Broken())
    with pytest.raises(EngineError, match="bad request") as info:
        await _take(engine, [], "broken")
    assert not isinstance(info.value, EngineDeadError) and engine.dead_reason is None
    engine._llm.errored = True
    with pytest.raises(EngineDeadError):
        await _take(engine, [], "broken-2")
    assert engine.dead_reason is not None


def test_a_front_end_of_a_shared_core_fills_its_share_of_the_sequences():
    """Admission sizes itself from ``seq_slots``: an engine of its own offers all of
    ``max_num_seqs``, one of three front ends of a shared core a third (at least one)."""
    options = EngineOptions(model="fake", max_num_seqs=64)
    assert VllmEngine(options).seq_slots == 64
    core = {"input_address": "ipc://in", "output_address": "ipc://out",
            "client_count": 3, "client_index": 2}
    assert VllmEngine(options, core=core).seq_slots == 21
    assert VllmEngine(EngineOptions(model="fake", max_num_seqs=2), core=core).seq_slots == 1


def test_the_cpu_kv_cache_size_reaches_vllm_in_fractions_of_a_gib(monkeypatch):
    """``VEENA_CPU_KVCACHE_GIB`` takes fractions (a tiny model needs MiB, and the cache is
    touched memory); a size out of range is refused before vLLM sees it."""
    from livekit.plugins.veena.pipeline.engine_args import engine_args

    monkeypatch.setenv("VEENA_CPU_KVCACHE_GIB", "0.25")
    assert engine_args(EngineOptions.from_env("m")).kv_cache_memory_bytes == 1 << 28
    for bad in (0.0, float("nan"), 1e9):
        with pytest.raises(ValueError, match="cpu_kvcache_space_gib"):
            engine_args(EngineOptions(model="m", cpu_kvcache_space_gib=bad))
