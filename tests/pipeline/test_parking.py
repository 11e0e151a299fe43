"""Producers park between the tokens they need (``pipeline/alarm.py``, ``pacing.pull_at``).

The planner-side rule is proven on a virtual clock in ``test_pacing.py`` (same windows, same
times, a third of the pulls at real time). Here: the shared alarm's own contract, and the
product's ``VllmEngine`` and ``Pipeline`` over an ``AsyncLLM``-shaped engine that merges
what a parked consumer has not taken (as vLLM's output collector does): every token still
arrives, in order, and a stream cancelled while parked aborts its engine request."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from livekit.plugins.veena.models.families import DecodeShape, SnacFamily
from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.pipeline.alarm import SharedAlarm
from livekit.plugins.veena.pipeline.engine import EngineDeadError
from livekit.plugins.veena.pipeline.pacing import PacingOptions
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions

from ..fakes import ToneCodec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from _fake_async_llm import FakeAsyncLLM, fake_vllm_engine  # noqa: E402

# -- the alarm --------------------------------------------------------------------------------

async def test_sleepers_of_one_tick_share_one_timer_and_all_wake():
    """The tick is about 1 s ahead. A machine that stalls past it before the sleepers run
    (each then returns at once, as it should) tries again with one further ahead: the
    later ones are a hang guard, not a speed bound."""
    alarm = SharedAlarm(0.05)
    loop = asyncio.get_running_loop()
    for ahead in (20, 200, 2000):  # ticks of 0.05 s
        start = (int(loop.time() / 0.05) + ahead) * 0.05  # a tick boundary
        offset = time.monotonic() - loop.time()
        sleepers = [asyncio.create_task(alarm.sleep_until(start + offset + 0.001 + i * 0.0004))
                    for i in range(50)]
        await asyncio.sleep(0)
        if loop.time() < start:  # every sleeper ran before its tick: all wait on it
            break
        await asyncio.gather(*sleepers)
    assert alarm.sleeping == 50 and len(alarm._ticks) == 1
    await asyncio.gather(*sleepers)
    assert alarm.sleeping == 0


async def test_a_cancelled_sleeper_leaves_the_others_alone():
    alarm = SharedAlarm(0.05)
    when = time.monotonic() + 0.2
    a = asyncio.create_task(alarm.sleep_until(when))
    b = asyncio.create_task(alarm.sleep_until(when))
    await asyncio.sleep(0)
    a.cancel()
    await b
    assert a.cancelled() and b.done() and not b.cancelled()


async def test_a_time_already_in_its_tick_returns_at_once():
    alarm = SharedAlarm(10.0)
    await alarm.sleep_until(time.monotonic() - 1.0)
    assert alarm.sleeping == 0


def test_tick_checked():
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError):
            SharedAlarm(bad)
    with pytest.raises(ValueError):
        PacingOptions(pull_tick_ms=float("nan")).validate()
    with pytest.raises(ValueError):
        PacingOptions(pull_tick_ms=-1.0).validate()


# -- through the product's engine wrapper and pipeline ----------------------------------------

class MergingLLM(FakeAsyncLLM):
    """The control-plane benchmark's fake ``AsyncLLM`` (one step for every request at 82
    steps/s, a consumer that is not waiting gets what piled up as one merged output, as
    vLLM's collector does with DELTA outputs), recording aborts."""

    def __init__(self, frames: int) -> None:
        super().__init__(frames)
        self.aborted: list[str] = []

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        await super().abort(request_id)


def _pipeline(llm: MergingLLM, tick_ms: float) -> Pipeline:
    options = PipelineOptions(decode={"snac": DecodeShape(
        SnacFamily.decode_defaults.window, PacingOptions(max_new=32, pull_tick_ms=tick_ms))})
    return Pipeline(fake_vllm_engine(llm, max_num_seqs=4), ToneCodec(), VEENA, options)


def _expected_codes(frames: int) -> list[list[int]]:
    """What ``FakeAsyncLLM`` generates: a code that depends on its position only."""
    return [[(k * 7919 + 13) % 4096 for k in range(f * 7, f * 7 + 7)] for f in range(frames)]


@pytest.mark.parametrize("tick_ms", [0.0, 5.0, 10.0])
async def test_every_token_arrives_in_order_whether_parked_or_not(tick_ms):
    llm = MergingLLM(frames=24)
    p = _pipeline(llm, tick_ms)
    assert (p.alarm is None) == (tick_ms == 0)
    await p.start()
    try:
        syn = p.synthesize("Hello there.", seed=1)
        audio = await syn.collect()
        assert [list(map(int, s)) for s in syn.tracks[0].steps] == _expected_codes(24)
        assert len(audio) == 24 * 2048
        assert syn.timings.tokens == 24 * 7
        assert llm.get_num_unfinished_requests() == 0 and llm.aborted == []
    finally:
        await p.aclose()


async def _parked_stream(p: Pipeline, seed: int):
    """A long stream heard by a task, once its producer has parked on the alarm. It parks
    once its listener holds more than two ticks and a decode of audio, so only a loop that
    lagged past that at every window of a 17 s stream keeps it from parking: say so rather
    than hang."""
    syn = p.synthesize("Hello there, this goes on for a while.", seed=seed)

    async def listen():
        async for _ in syn:
            pass

    task = asyncio.create_task(listen())
    while p.alarm.sleeping == 0:
        if task.done():
            pytest.skip("the producer never parked: the event loop lagged at every window")
        await asyncio.sleep(0.005)
    return syn, task


@pytest.mark.parametrize("end", ["cancelled", "engine_dead"])
async def test_a_stream_ended_while_parked_frees_its_request(end):
    """Cancelled: its vLLM request is aborted. The engine dead: the stream fails with
    ``EngineDeadError`` as soon as the producer wakes. Either way nothing stays in vLLM."""
    llm = MergingLLM(frames=200)
    p = _pipeline(llm, 10.0)
    await p.start()
    try:
        syn, task = await _parked_stream(p, 2)
        if end == "cancelled":
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert llm.aborted == [syn.request_id]
        else:
            p.engine.mark_dead("test: the engine core exited")
            with pytest.raises(EngineDeadError):
                await task
        assert llm.get_num_unfinished_requests() == 0
    finally:
        await p.aclose()
