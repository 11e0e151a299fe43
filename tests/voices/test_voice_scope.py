"""One voice for a whole call (BiCodec): the first stream of a ``veena.TTS`` captures 32
speaker globals and every later stream of that instance speaks with them (in-process and
through the server); ``turn`` scope captures per stream; ``reset_voice()`` starts over. The
SNAC side (one seed per call) is in tests/voices/test_voice_design.py."""

import pytest
from livekit.agents import tts
from livekit.plugins import veena

from livekit.plugins.veena.server.app import ServerOptions

from ..servers import serve

pytestmark = pytest.mark.engine
TEXT = "नमस्ते। यह एक वाक्य है।"


async def _speak(t: veena.TTS):
    stream = t.stream()
    stream.push_text(TEXT)
    stream.end_input()
    samples = sum([ev.frame.samples_per_channel async for ev in stream])
    await stream.aclose()
    assert samples > 0 and stream.speaker_globals is not None
    assert len(stream.speaker_globals) == 32
    return stream.speaker_globals


async def test_call_scope_keeps_one_voice_across_streams(spark_pipeline):
    # seeds 1 and 2 capture different voices on the tiny model (its globals come in a few
    # runs, so two random seeds may well agree); the call keeps its voice whatever the seed
    t = veena.TTS(pipeline=spark_pipeline, max_tokens_per_chunk=40, seed=1)
    first = await _speak(t)
    assert t.speaker_globals == first
    t.update_options(seed=2)
    assert await _speak(t) == first and await _speak(t) == first
    t.reset_voice()
    assert t.speaker_globals is None
    fresh = await _speak(t)
    assert fresh != first and t.speaker_globals == fresh
    t.update_options(voice="arjun")  # a new voice name starts a new voice
    assert t.speaker_globals is None
    await t.aclose()


async def test_turn_scope_captures_per_stream(spark_pipeline):
    t = veena.TTS(pipeline=spark_pipeline, max_tokens_per_chunk=40, voice_scope="turn", seed=1)
    a = await _speak(t)
    t.update_options(seed=2)
    b = await _speak(t)
    assert a != b and t.speaker_globals is None
    await t.aclose()


async def test_call_voice_is_used_through_a_fallback_adapter(spark_pipeline, monkeypatch):
    t = veena.TTS(pipeline=spark_pipeline, max_tokens_per_chunk=40)
    voice = await _speak(t)
    given = []
    real = spark_pipeline.synthesize

    def spy(*args, **kwargs):
        given.append(kwargs.get("speaker_globals"))
        return real(*args, **kwargs)

    monkeypatch.setattr(spark_pipeline, "synthesize", spy)
    adapter = tts.FallbackAdapter([t])
    frame = await adapter.synthesize(TEXT).collect()
    assert frame.samples_per_channel > 0 and given and all(g == voice for g in given)
    await adapter.aclose()


async def test_call_scope_through_the_server(spark_pipeline):
    async with serve(spark_pipeline, ServerOptions()) as url:
        ws = url.replace("http://", "ws://")
        call = veena.TTS(base_url=ws, profile="veena3", max_tokens_per_chunk=40, seed=1)
        first = await _speak(call)
        call.update_options(seed=2)
        assert call.speaker_globals == first and await _speak(call) == first
        per_turn = veena.TTS(base_url=ws, profile="veena3", max_tokens_per_chunk=40,
                             voice_scope="turn", seed=1)
        a = await _speak(per_turn)
        per_turn.update_options(seed=2)
        assert a != await _speak(per_turn)
        await call.aclose()
        await per_turn.aclose()


def test_voice_scope_checked_and_every_profile_defaults_to_call(pipeline):
    # SNAC too: its call keeps one seed (tests/voices/test_voice_design.py)
    with pytest.raises(ValueError, match="voice_scope"):
        veena.TTS(pipeline=pipeline, voice_scope="forever")
    assert veena.TTS(pipeline=pipeline).voice_scope == "call"
