"""The pipeline freezes the start-up heap once it has started (``pipeline/gc_heap.py``): with
torch and vLLM loaded, every full garbage collection otherwise walks their objects and
pauses the event loop all streams share (90-340 ms at 256 streams, heard as gaps)."""

from __future__ import annotations

import gc

import pytest

from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions

from .server.fakes import FakeEngine, SilentCodec


class _Cycle:
    """Tracked by the collector (it refers to itself)."""

    def __init__(self) -> None:
        self.me = self


def _collectable(obj) -> bool:
    """Whether a full collection still walks ``obj`` (frozen objects sit in none of the
    three generations)."""
    return any(o is obj for g in range(3) for o in gc.get_objects(g))


@pytest.fixture
def thawed():
    gc.unfreeze()
    yield
    gc.unfreeze()


async def test_start_freezes_what_start_up_left(thawed):
    before = _Cycle()
    p = Pipeline(FakeEngine(), SilentCodec(), VEENA, PipelineOptions())
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
    options = PipelineOptions.from_env()
    assert options.freeze_gc_heap is False
    before = _Cycle()
    p = Pipeline(FakeEngine(), SilentCodec(), VEENA, options)
    await p.start()
    try:
        assert _collectable(before)
        assert gc.get_freeze_count() == 0
    finally:
        await p.aclose()
