"""The engine's adapter set: an adapter's files stay while any request or turn holds it, a
removed adapter serves only those already holding it, and its own copy is freed after the
last of them; a request vLLM starves of an adapter slot is bounded. No engine starts here."""

import asyncio
from dataclasses import replace

import pytest

from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.pipeline.adapters import MAX_ADAPTER_ID, Adapter, AdapterSet
from livekit.plugins.veena.pipeline.engine_options import SamplingOptions
from livekit.plugins.veena.pipeline.options import PipelineOptions
from livekit.plugins.veena.pipeline.pipeline import Pipeline
from livekit.plugins.veena.pipeline.turn import Turn, TurnOptions, TurnTimeout

from ..fakes import FakeEngine, ToneCodec


def _adapter(tmp_path, name="acme", int_id=7) -> Adapter:
    path = tmp_path / f"{name}-{int_id}"
    path.mkdir()
    (path / "adapter_config.json").write_text("{}")
    return Adapter(name, int_id, str(path), 8, 16.0, owned=True)


def test_a_removed_adapter_serves_its_holders_until_the_last_lets_go(tmp_path):
    adapters = AdapterSet()
    acme = adapters.add(_adapter(tmp_path))
    adapters.hold(acme)  # a turn speaking with it
    adapters.hold(acme)  # one of its requests
    adapters.remove("acme")
    assert "acme" not in adapters and adapters.get("acme") is None  # new streams: refused
    assert adapters.usable(acme)  # the turn's later chunks: still served
    adapters.hold(acme)  # its next chunk
    adapters.release(acme)
    adapters.release(acme)
    assert adapters.usable(acme) and (tmp_path / "acme-7").is_dir()
    adapters.release(acme)  # the last holder: the copy goes
    assert not adapters.usable(acme) and not (tmp_path / "acme-7").exists()
    with pytest.raises(ValueError, match="not registered"):
        adapters.hold(acme)


def test_an_adapter_not_held_is_freed_when_removed_and_files_are_replaced(tmp_path):
    adapters = AdapterSet()
    old = adapters.add(_adapter(tmp_path, int_id=1))
    adapters.hold(old)
    new = _adapter(tmp_path, int_id=2)
    assert adapters.replace(new) == old
    assert adapters.get("acme") == new and adapters.usable(old)
    adapters.release(old)
    assert not (tmp_path / "acme-1").exists() and (tmp_path / "acme-2").is_dir()
    adapters.remove("acme")  # nothing holds it: freed at once
    assert not (tmp_path / "acme-2").exists()


def test_the_same_files_registered_again_are_never_freed_under_a_holder(tmp_path):
    """Removed and added again (the same name and bytes: the same id and copy) while a
    request still held it: its release must not free what is served again."""
    adapters = AdapterSet()
    acme = adapters.add(_adapter(tmp_path))
    adapters.hold(acme)
    adapters.remove("acme")
    adapters.add(acme)
    adapters.release(acme)
    assert adapters.usable(acme) and (tmp_path / "acme-7").is_dir()


async def test_on_a_running_loop_the_copy_is_freed_a_moment_later(tmp_path):
    """An abort reaches vLLM's core just after our request ends: the files stay a moment."""
    adapters = AdapterSet(free_after_s=0.05)
    acme = adapters.add(_adapter(tmp_path))
    adapters.remove("acme")
    assert (tmp_path / "acme-7").is_dir()
    for _ in range(200):  # a hang guard, not a timing assertion
        if not (tmp_path / "acme-7").exists():
            break
        await asyncio.sleep(0.05)
    assert not (tmp_path / "acme-7").exists()


def test_ids_are_vllm_ids():
    adapters = AdapterSet()
    for bad in (0, -1, MAX_ADAPTER_ID + 1, True, 1.0):
        with pytest.raises(ValueError, match="adapter id"):
            adapters.add(Adapter("acme", bad, "/a", 8, 16.0))
    adapters.add(Adapter("acme", MAX_ADAPTER_ID, "/a", 8, 16.0))


class _Starving(FakeEngine):
    """vLLM past ``max_loras``: a request with an adapter gets no slot while the base
    model's requests keep producing (one frame per 10 ms)."""

    async def generate(self, prompt, sampling, request_id=None, adapter=None):
        if adapter is not None:
            await asyncio.Event().wait()  # skipped at every step
        async for ids in super().generate(prompt, sampling, request_id):
            await asyncio.sleep(0.01)
            yield ids


async def test_a_request_starved_of_an_adapter_slot_times_out(tmp_path):
    """Other requests' tokens are progress for a request waiting its turn, but for one with
    an adapter only for ``adapter_wait_s``: after it (and the turn's timeout) the turn
    fails as stalled instead of waiting for ever. The times are hang guards."""
    engine = _Starving()
    engine.options = replace(engine.options, adapter_wait_s=0.5)
    pipeline = Pipeline(engine, ToneCodec(), VEENA, PipelineOptions(freeze_gc_heap=False))
    await pipeline.start()
    engine.adapters.add(Adapter("acme", 1, str(tmp_path), 8, 16.0))

    async def others():  # the base model's requests, tokens read as they come
        async for _ in engine.generate([1, 2, 3], SamplingOptions(max_tokens=7 * 10**6)):
            pass

    busy = asyncio.create_task(others())
    turn = Turn(pipeline, TurnOptions(voice="acme", adapter="acme", timeout=0.5,
                                      sampling=pipeline.sampling.defaults()))

    async def chunks():
        yield "Hello there."

    try:
        with pytest.raises(TurnTimeout):
            await asyncio.wait_for(turn.speak(chunks(), lambda pcm: None), 60)
        assert not busy.done()  # the others did progress all along
        assert not engine.adapters.held(engine.adapters.get("acme"))  # the turn let go
    finally:
        busy.cancel()
        await asyncio.gather(busy, return_exceptions=True)
        await pipeline.aclose()


async def test_a_turn_keeps_the_adapter_it_began_with_when_it_is_removed(tmp_path):
    """Removed while a turn speaks with it: the turn's later chunks still carry it (they
    looked it up by name: "unknown adapter"), a new turn is refused, and its files go once
    the turn ends."""
    from ..fakes import fake_pipeline

    async with fake_pipeline() as p:
        p.engine.adapters.free_after_s = 0
        acme = p.engine.adapters.add(_adapter(tmp_path))
        removed = asyncio.Event()

        async def chunks():
            yield "Hello there."
            await removed.wait()
            yield "How are you today?"

        opts = TurnOptions(voice="acme", adapter="acme", sampling=replace(
            p.sampling.defaults(), max_tokens=28))
        turn = asyncio.create_task(Turn(p, opts).speak(chunks(), lambda pcm: None))
        for _ in range(2000):  # a hang guard: until its first request went out
            if p.engine.adapters_asked:
                break
            await asyncio.sleep(0.01)
        p.engine.adapters.remove("acme")
        removed.set()
        await asyncio.wait_for(turn, 60)
        assert p.engine.adapters_asked == ["acme", "acme"]
        assert not (tmp_path / "acme-7").exists()  # freed after the turn
        with pytest.raises(ValueError, match="unknown adapter"):
            await Turn(p, opts).speak(chunks(), lambda pcm: None)
        assert acme.name not in p.engine.adapters
