"""A whole agent turn through livekit-agents' AgentSession, with no room."""

import asyncio

import pytest
from livekit.agents import Agent, AgentSession
from livekit.plugins import veena

from livekit.plugins.veena.pipeline.chunking import chunk_text

from ..helpers import engine_settled
from .livekit_fakes import CapturingAudioOutput, ScriptedLLM

pytestmark = pytest.mark.engine
REPLY = "Sure, I can help with that. The first step is simple. The second step takes longer."


async def _session(pipeline, reply=REPLY, max_tokens=70):
    out = CapturingAudioOutput()
    tts_ = veena.TTS(pipeline=pipeline, max_tokens_per_chunk=max_tokens, seed=3)
    session = AgentSession(llm=ScriptedLLM(reply), tts=tts_)
    session.output.audio = out
    await session.start(Agent(instructions="You are a test agent."), record=False)
    return session, out, tts_


async def test_reply_is_spoken_in_full(pipeline):
    session, out, _ = await _session(pipeline)
    try:
        handle = session.generate_reply(user_input="Can you help me?")
        await asyncio.wait_for(handle.wait_for_playout(), 120)
        chunks = len(chunk_text(REPLY))
        assert chunks >= 2
        # each chunk yields 10 frames (0.853 s) minus 15 ms per crossfaded seam
        assert out.seconds == pytest.approx(chunks * 0.8533 - (chunks - 1) * 0.015, abs=0.02)
        assert all(f.sample_rate == 24000 for f in out.frames)
    finally:
        await session.aclose()


async def test_say(pipeline):
    session, out, _ = await _session(pipeline)
    try:
        handle = session.say("Hello from the say method.")
        await asyncio.wait_for(handle.wait_for_playout(), 60)
        assert out.seconds == pytest.approx(0.8533, abs=0.02)
    finally:
        await session.aclose()


async def test_interruption_stops_synthesis(pipeline, monkeypatch):
    long_reply = " ".join(f"This is sentence number {i} of a long answer." for i in range(12))
    chunks = len(chunk_text(long_reply))
    assert chunks >= 8
    requests = []
    real = pipeline.synthesize
    monkeypatch.setattr(pipeline, "synthesize",
                        lambda *a, **kw: requests.append(a) or real(*a, **kw))
    session, out, _ = await _session(pipeline, long_reply, max_tokens=140)
    try:
        handle = session.generate_reply(user_input="Tell me everything.")
        await asyncio.wait_for(out.first_frame.wait(), 60)
        assert pipeline.engine.live_request_ids
        await session.interrupt(force=True)
        await asyncio.wait_for(handle.wait_for_playout(), 60)  # hang guard only
        assert handle.interrupted
        assert await engine_settled(pipeline)
        started = len(requests)
        # the turn had at most max_chunks_in_flight (2) chunks going when it was interrupted,
        # and starts none after: most of the reply is never generated
        assert started <= 3 < chunks, (started, chunks)
        await asyncio.sleep(0.5)
        assert len(requests) == started and not pipeline.engine.live_request_ids
        # each chunk is 20 frames (1.707 s): what was heard is at most the started chunks
        assert out.seconds <= started * 1.71
    finally:
        await session.aclose()
