"""A whole agent turn through livekit-agents' AgentSession, with no room."""

import asyncio

import pytest
from livekit.agents import Agent, AgentSession

from livekit.plugins import veena

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
        chunks = len(veena.chunking.chunk_text(REPLY))
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


async def test_interruption_stops_synthesis(pipeline):
    long_reply = " ".join(f"This is sentence number {i} of a long answer." for i in range(12))
    session, out, _ = await _session(pipeline, long_reply, max_tokens=140)
    try:
        handle = session.generate_reply(user_input="Tell me everything.")
        await asyncio.wait_for(out.first_frame.wait(), 60)
        assert pipeline.engine.live_request_ids
        await session.interrupt(force=True)
        await asyncio.wait_for(handle.wait_for_playout(), 10)
        assert handle.interrupted
        for _ in range(50):
            if not pipeline.engine.live_request_ids and pipeline.engine.num_unfinished_requests == 0:
                break
            await asyncio.sleep(0.02)
        assert not pipeline.engine.live_request_ids
        assert pipeline.engine.num_unfinished_requests == 0
        assert out.seconds < 12 * 1.7, "the rest of the reply was never synthesized"
    finally:
        await session.aclose()
