"""The pipeline freezes the start-up heap once it has started (``pipeline/gc_heap.py``): with
torch and vLLM loaded, every full garbage collection otherwise walks their objects and
pauses the event loop all streams share (90-340 ms at 256 streams, heard as gaps)."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import weakref

import pytest

from livekit.plugins.veena.models.loading import pipeline_options_from_env
from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.pipeline import gc_heap
from livekit.plugins.veena.pipeline.gc_heap import FullCollections, full_collections
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions

from ..fakes import FakeEngine, ToneCodec


class _Cycle:
    """Tracked by the collector (it refers to itself)."""

    def __init__(self) -> None:
        self.me = self


def _collectable(obj) -> bool:
    """Whether a full collection still walks ``obj`` (frozen objects sit in none of the
    three generations)."""
    return any(o is obj for g in range(3) for o in gc.get_objects(g))


def _no_refreeze_pending() -> None:
    if gc_heap._pending is not None:  # a pipeline closed before: not this test's freeze
        gc_heap._pending.cancel()
        gc_heap._pending = None


@pytest.fixture
def thawed(monkeypatch):
    """No heap frozen, none about to be, and no pipeline counted as running (the session's
    are left to the suite)."""
    _no_refreeze_pending()
    monkeypatch.setattr(gc_heap, "_running", 0)
    gc.unfreeze()
    full_collections.restore()
    yield
    _no_refreeze_pending()
    gc.unfreeze()
    full_collections.restore()


async def test_start_freezes_what_start_up_left(thawed):
    before = _Cycle()
    p = Pipeline(FakeEngine(), ToneCodec(), VEENA, PipelineOptions())
    assert _collectable(before)
    await p.start()
    try:
        assert not _collectable(before)
        assert gc.get_freeze_count() > 0
        assert p._table is not None  # built before the freeze, not by the first request
        after = _Cycle()
        assert _collectable(after)  # what streaming allocates stays collectable
    finally:
        await p.aclose()


async def test_freeze_can_be_turned_off(thawed, monkeypatch):
    monkeypatch.setenv("VEENA_FREEZE_GC_HEAP", "0")
    options = pipeline_options_from_env()
    assert options.freeze_gc_heap is False
    before = _Cycle()
    p = Pipeline(FakeEngine(), ToneCodec(), VEENA, options)
    await p.start()
    try:
        assert _collectable(before)
        assert gc.get_freeze_count() == 0
    finally:
        await p.aclose()


async def test_a_closed_pipeline_is_freed_while_another_runs(thawed):
    """Frozen objects are never collected: a closed pipeline's (its codec, its engine
    client) went with the heap, so a process that closed one and started another kept both.
    Closing thaws the heap and, with another pipeline still running, freezes it again once
    the closed one is let go."""
    running = Pipeline(FakeEngine(), ToneCodec(), VEENA, PipelineOptions())
    await running.start()
    closed = Pipeline(FakeEngine(), ToneCodec(), VEENA, PipelineOptions())
    closed.held = _Cycle()  # what the closed pipeline holds, in a cycle as a codec's modules are
    gone = weakref.ref(closed.held)
    await closed.start()
    try:
        assert not _collectable(closed.held)
        await closed.aclose()
        del closed
        for _ in range(6000):  # a hang guard, polled: the heap is frozen again for `running`
            if gc.get_freeze_count():
                break
            await asyncio.sleep(0.01)
        assert gc.get_freeze_count() > 0 and not _collectable(running)
        assert gone() is None
    finally:
        await running.aclose()
    assert gc.get_freeze_count() == 0  # the last one closed: nothing stays frozen


_FROZEN_CYCLE_AT_EXIT = """
import os
from livekit.plugins.veena.pipeline.gc_heap import freeze_startup_heap

class Cycle:
    def __init__(self):
        self.me = self

    def __del__(self, write=os.write):
        write(1, b"freed at exit")

cycle = Cycle()
freeze_startup_heap()
del cycle
"""


def test_what_start_up_left_is_freed_at_exit():
    """Frozen objects escape the interpreter's last collection unless thawed at exit; an
    extension whose objects are never freed says so at exit (triton's nanobind bindings: ~30
    lines of "nanobind: leaked ..." after every ``say``)."""
    done = subprocess.run([sys.executable, "-c", _FROZEN_CYCLE_AT_EXIT],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "freed at exit"


@pytest.fixture
def schedule():
    """A private schedule, and Python's own thresholds back afterwards."""
    full_collections.restore()  # a pipeline started by an earlier test took the schedule
    thresholds = gc.get_threshold()
    collections = FullCollections()
    yield collections
    collections.restore()
    gc.set_threshold(*thresholds)


def _old_garbage() -> weakref.ref:
    """A cycle promoted to the oldest generation while alive, then dropped: only a full
    collection frees it."""
    obj = _Cycle()
    gc.collect(1)
    gc.collect(1)
    return weakref.ref(obj)


def _young_collections(n: int) -> None:
    for _ in range(n):
        gc.collect(1)  # each counts towards the oldest generation's threshold, as in a run


def test_no_full_collection_while_a_stream_plays(schedule):
    schedule.defer(300.0)
    assert gc.get_threshold()[2] > 1_000_000
    with schedule.streaming():
        dead = _old_garbage()
        _young_collections(20)
        junk = [[i] for i in range(50_000)]  # allocation churn: automatic young collections
        del junk
        assert dead() is not None, "a full collection ran while a stream played"
    assert dead() is None, "the last stream to end collects what is due"
    assert schedule.collections == 1


def test_idle_collects_only_when_python_would_have(schedule):
    schedule.defer(300.0)
    with schedule.streaming():
        dead = _old_garbage()
    assert dead() is not None and schedule.collections == 0


def test_overdue_collection_runs_as_a_stream_starts(schedule):
    schedule.defer(1e-9)
    with schedule.streaming():
        dead = _old_garbage()
        _young_collections(20)
        with schedule.streaming():  # a second stream starts while the first plays
            assert dead() is None
    assert schedule.collections == 1


def test_not_deferred_is_pythons_schedule(schedule):
    young, middle, oldest = gc.get_threshold()
    schedule.defer(0.0)
    assert not schedule.deferred and gc.get_threshold() == (young, middle, oldest)
    schedule.defer(60.0)
    schedule.restore()
    assert gc.get_threshold() == (young, middle, oldest)


async def test_pipeline_defers_and_a_synthesis_counts_as_playing(thawed):
    thresholds = gc.get_threshold()
    assert not full_collections.deferred
    p = Pipeline(FakeEngine(), ToneCodec(), VEENA, PipelineOptions())
    await p.start()
    try:
        assert full_collections.deferred
        syn = p.synthesize("Namaste.")
        playing = []
        async for _ in syn:
            playing.append(full_collections._active)
        assert playing and set(playing) == {1} and full_collections._active == 0
        dead = _old_garbage()
        _young_collections(20)
        async for _ in p.synthesize("Namaste."):
            pass
        assert dead() is not None, "collected before the last stream's audio left"
        await asyncio.sleep(0.3)
        assert dead() is None, "collected once idle"
    finally:
        await p.aclose()
    assert gc.get_threshold()[2] > thresholds[2]


def test_interval_reads_the_environment(monkeypatch):
    assert PipelineOptions().gc_full_interval_s == 300.0
    monkeypatch.setenv("VEENA_GC_FULL_INTERVAL_S", "0")
    assert pipeline_options_from_env().gc_full_interval_s == 0.0
    for bad in ("-1", "nan", "inf"):
        monkeypatch.setenv("VEENA_GC_FULL_INTERVAL_S", bad)
        with pytest.raises(ValueError, match="VEENA_GC_FULL_INTERVAL_S"):
            pipeline_options_from_env()
