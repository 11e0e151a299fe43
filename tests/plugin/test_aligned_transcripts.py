"""Aligned transcripts: each chunk's words come with times inside the chunk's exact span of
audio (words spread by character count), in-process and through the server, and
``AgentSession(use_tts_aligned_transcript=True)`` shows them in order."""

import asyncio

import pytest
from livekit.agents import Agent, AgentSession
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT
from livekit.plugins import veena

from livekit.plugins.veena.pipeline.transcripts import word_timings
from livekit.plugins.veena.server.app import ServerOptions

from ..servers import serve
from .livekit_fakes import CapturingAudioOutput, CapturingTextOutput, ScriptedLLM

REPLY = "Sure, I can help with that. The first step is simple. The second step takes longer."


def test_word_timings_rule():
    words = word_timings("ab cdef  g", 1.0, 2.4)
    assert [w.text for w in words] == ["ab ", "cdef ", "g "]
    assert words[0].start == 1.0 and words[-1].end == pytest.approx(2.4)
    assert words[0].end == pytest.approx(1.0 + 1.4 * 2 / 7)  # by character count
    assert all(a.end == b.start for a, b in zip(words, words[1:]))
    assert word_timings("   ", 0, 1) == [] and word_timings("x", 1, 1) == []


async def _timed_words(t: veena.TTS):
    stream = t.stream()
    for delta in REPLY.split(" "):
        stream.push_text(delta + " ")
    stream.end_input()
    words, samples = [], 0
    async for ev in stream:
        samples += ev.frame.samples_per_channel
        words += ev.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])
    await stream.aclose()
    return words, samples / t.sample_rate


def _check(words, audio_s):
    assert "".join(words).split() == REPLY.split()
    starts = [w.start_time for w in words]
    assert starts == sorted(starts) and all(w.start_time <= w.end_time for w in words)
    assert words[0].start_time == 0.0 and words[-1].end_time <= audio_s + 1e-6


@pytest.mark.engine
async def test_timed_words_in_process_and_remote(pipeline):
    local = veena.TTS(pipeline=pipeline, max_tokens_per_chunk=35, seed=3)
    assert local.capabilities.aligned_transcript
    _check(*await _timed_words(local))
    async with serve(pipeline, ServerOptions()) as url:
        remote = veena.TTS(base_url=url.replace("http://", "ws://"), max_tokens_per_chunk=35)
        _check(*await _timed_words(remote))
        await remote.aclose()


@pytest.mark.engine
async def test_agent_session_shows_the_aligned_words(pipeline):
    out, text = CapturingAudioOutput(), CapturingTextOutput()
    session = AgentSession(llm=ScriptedLLM(REPLY), use_tts_aligned_transcript=True,
                           tts=veena.TTS(pipeline=pipeline, max_tokens_per_chunk=35, seed=3))
    session.output.audio = out
    session.output.transcription = text
    await session.start(Agent(instructions="You are a test agent."), record=False)
    try:
        handle = session.generate_reply(user_input="Can you help me?")
        await asyncio.wait_for(handle.wait_for_playout(), 120)
        timed = [p for p in text.pieces if getattr(p, "start_time", None) is not None]
        assert "".join(text.pieces).split() == REPLY.split()
        assert timed and [p.start_time for p in timed] == sorted(p.start_time for p in timed)
        assert timed[-1].end_time <= out.seconds + 1e-6
    finally:
        await session.aclose()


def test_words_are_timed_by_what_they_were_read_as():
    """A normalised word (``₹500`` read as "five hundred rupees") takes its spoken share."""
    words = word_timings("pay ₹500 now", 0.0, 1.0, [3, 18, 3])
    assert [w.text for w in words] == ["pay ", "₹500 ", "now "]
    assert words[1].end - words[1].start == pytest.approx(18 / 24)
    assert word_timings("a b", 0, 1, [1])[1].start == 0.5  # a wrong count: written lengths
