"""Fault paths of the turn and the pipeline on the fake engine (no vLLM).

An interruption is an interruption, whatever else is going on: a turn cancelled while it
waits for its other chunks' engine requests to end (after one chunk failed) ends cancelled,
not with that chunk's error (which livekit would retry: interrupted speech spoken again).
A start step that failed is tried again by the next start."""

import asyncio
from dataclasses import replace

import pytest

from livekit.plugins.veena.pipeline.tasks import settle
from livekit.plugins.veena.pipeline.turn import Turn, TurnOptions

from ..fakes import fake_pipeline

HANG_GUARD_S = 120


async def test_a_turn_cancelled_while_closing_after_a_failed_chunk_ends_cancelled():
    async with fake_pipeline() as p:
        third_started, aborting, release = asyncio.Event(), asyncio.Event(), asyncio.Event()
        real_generate, calls = p.engine.generate, []

        async def generate(*args, **kwargs):
            calls.append(1)
            third = len(calls) == 2  # the second request: the third chunk's
            if third:
                third_started.set()
            try:
                async for ids in real_generate(*args, **kwargs):
                    yield ids
                    if third:  # generating, never done
                        await asyncio.Event().wait()
                if not third:  # the first chunk ends once the third generates
                    await third_started.wait()
            finally:
                if third:  # vLLM's abort is a round trip
                    aborting.set()
                    await release.wait()

        p.engine.generate = generate
        real_synthesize = p.synthesize

        def synthesize(text, **kwargs):
            if text.startswith("Bad"):
                raise ValueError("this chunk cannot be spoken")
            return real_synthesize(text, **kwargs)

        p.synthesize = synthesize
        turn = Turn(p, TurnOptions(voice=p.profile.default_voice,
                                   sampling=replace(p.sampling.defaults(), max_tokens=70),
                                   seed=1))

        async def texts():
            yield "Good words first."
            yield "Bad chunk second."
            yield "Good words third, generating."

        speaking = asyncio.create_task(turn.speak(texts(), lambda pcm: None))
        # the first chunk spoke, the second failed; the turn closes the third, whose abort
        # is under way
        await asyncio.wait_for(aborting.wait(), HANG_GUARD_S)
        speaking.cancel()  # the listener interrupts now
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(speaking, HANG_GUARD_S)


async def test_settle_waits_for_every_task_and_keeps_only_the_callers_cancel():
    async def fails():
        raise ValueError("its own failure")

    async def sleeps():
        await asyncio.sleep(3600)

    failing, sleeping = asyncio.create_task(fails()), asyncio.create_task(sleeps())
    sleeping.cancel()
    await settle([failing, sleeping])  # their outcomes are theirs: nothing raised here
    assert failing.done() and sleeping.cancelled()

    blocker = asyncio.Event()

    async def slow():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await blocker.wait()  # takes a while to end
            raise

    inner = asyncio.create_task(slow())
    await asyncio.sleep(0)
    inner.cancel()
    outer = asyncio.create_task(settle([inner]))
    await asyncio.sleep(0)
    outer.cancel()  # the caller itself is cancelled while it waits
    blocker.set()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert inner.done()


async def test_a_codec_warm_up_that_failed_once_is_tried_again():
    """The warm-up's future was made once and kept: a transient failure (CUDA out of
    memory while vLLM still started) failed every later start and request for good."""
    from livekit.plugins.veena.models.profiles import VEENA
    from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions

    from ..fakes import FakeEngine, ToneCodec

    class FlakyCodec(ToneCodec):
        warmups = 0

        def warmup(self) -> None:
            FlakyCodec.warmups += 1
            if FlakyCodec.warmups == 1:
                raise RuntimeError("CUDA out of memory")

    p = Pipeline(FakeEngine(), FlakyCodec(), VEENA, PipelineOptions())
    try:
        with pytest.raises(RuntimeError, match="out of memory"):
            await p.start()
        await p.start()
        assert p.ready and FlakyCodec.warmups == 2
    finally:
        await p.aclose()


async def test_a_pipeline_closed_under_a_turn_ends_it_at_once_with_the_reason():
    """The decode scheduler closed while a window was in the codec: the chunk's task was
    cancelled from inside (nobody had cancelled it), so its turn never heard the chunk end
    and waited out its whole timeout, then blamed the engine ("no progress")."""
    from livekit.plugins.veena.pipeline.engine import EngineClosedError

    from ..helpers import gated_codec, wait_thread_event

    async with fake_pipeline() as p:
        turn = Turn(p, TurnOptions(voice=p.profile.default_voice,
                                   sampling=p.sampling.defaults(), seed=1, timeout=3600.0))

        async def texts():
            yield "Hello there, this is a test."

        with gated_codec(p) as decoding:
            speaking = asyncio.create_task(turn.speak(texts(), lambda pcm: None))
            assert await wait_thread_event(decoding)
            await p.scheduler.aclose()
            with pytest.raises(EngineClosedError, match="pipeline closed"):
                await asyncio.wait_for(speaking, HANG_GUARD_S)
