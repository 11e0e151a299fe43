"""The LiveKit TTS driven through livekit-agents' own API on the tiny model."""

import asyncio

import pytest
from livekit.agents import APIConnectionError, APIConnectOptions
from livekit.plugins import veena

from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.pipeline.chunking import ChunkerOptions, TextChunker
from livekit.plugins.veena.pipeline.engine import EngineOptions, VllmEngine
from livekit.plugins.veena.pipeline.pipeline import Pipeline

from ..helpers import engine_settled, gated_codec, wait_thread_event

pytestmark = pytest.mark.engine
CHUNK_TOKENS = 70  # 10 SNAC frames = 20480 samples per chunk on the tiny model
CROSSFADE = 360  # 15 ms at 24 kHz


@pytest.fixture
def tts_(pipeline):
    return veena.TTS(pipeline=pipeline, max_tokens_per_chunk=CHUNK_TOKENS, seed=7)


async def _watch_live(pipeline, seen: list, stop: asyncio.Event):
    while not stop.is_set():
        seen.append(len(pipeline.engine.live_request_ids))
        await asyncio.sleep(0.01)


async def test_stream_one_segment_pipelined_chunks_and_metrics(tts_, pipeline):
    metrics = []
    tts_.on("metrics_collected", metrics.append)
    live, stop = [], asyncio.Event()
    watcher = asyncio.create_task(_watch_live(pipeline, live, stop))
    stream = tts_.stream()
    deltas = ["Hello there, ", "this is the first sentence. ", "Here is the second ",
              "one, a little longer than the first. ", "And a third sentence to close."]
    # the chunks the plugin's default chunker makes of these deltas, counted independently
    chunker = TextChunker(ChunkerOptions.from_env())
    n_chunks = sum(len(chunker.push(d)) for d in deltas) + len(chunker.flush())
    assert n_chunks >= 2
    for delta in deltas:
        stream.push_text(delta)
    stream.end_input()
    events = [ev async for ev in stream]
    stop.set()
    await watcher
    await stream.aclose()
    frames = [ev.frame for ev in events]
    assert all(f.sample_rate == 24000 and f.num_channels == 1 for f in frames)
    assert len({ev.segment_id for ev in events}) == 1, "one stream = one segment"
    assert events[-1].is_final and not any(ev.is_final for ev in events[:-1])
    samples = sum(f.samples_per_channel for f in frames)
    # every chunk's audio is there, joined with one crossfade per seam and no gap
    assert samples == n_chunks * 20480 - (n_chunks - 1) * CROSSFADE
    assert max(live) >= 2, "chunk k+1 must generate while chunk k is still being produced"
    assert len(metrics) == 1
    m = metrics[0]
    assert m.ttfb > 0 and m.streamed
    assert m.audio_duration == pytest.approx(samples / 24000, abs=1e-3)


async def test_synthesize_chunked(tts_):
    metrics = []
    tts_.on("metrics_collected", metrics.append)
    stream = tts_.synthesize("A complete sentence. Another complete sentence here.")
    frame = await stream.collect()
    assert frame.sample_rate == 24000 and frame.samples_per_channel > 20000
    await asyncio.sleep(0.05)
    assert metrics and metrics[0].ttfb > 0
    assert metrics[0].audio_duration == pytest.approx(frame.duration, abs=1e-3)


async def test_interruption_aborts_without_waiting_for_the_codec(pipeline):
    """``aclose`` aborts the vLLM request and drops the windows while a decode is still
    blocked in the codec: it never waits for decode or generation to finish."""
    tts_ = veena.TTS(pipeline=pipeline, max_tokens_per_chunk=1400)
    stream = tts_.stream()
    stream.push_text("This is a long reply that the user will interrupt. It has more sentences. ")
    stream.push_text("And even more text follows here, so generation keeps going for a while.")
    stream.flush()
    it = stream.__aiter__()
    await it.__anext__()
    assert pipeline.engine.live_request_ids
    with gated_codec(pipeline) as decoding:
        assert await wait_thread_event(decoding)
        await asyncio.wait_for(stream.aclose(), 120)  # hang guard only
        assert not pipeline.engine.live_request_ids
        assert pipeline.scheduler.pending == 0
    assert await engine_settled(pipeline)


def test_invalid_options_raise_at_construction(pipeline):
    with pytest.raises(ValueError, match="valid voices"):
        veena.TTS(pipeline=pipeline, voice="nobody")
    with pytest.raises(ValueError, match="temperature"):
        veena.TTS(pipeline=pipeline, temperature=9.0)
    t = veena.TTS(pipeline=pipeline)
    with pytest.raises(ValueError):
        t.update_options(top_p=0.0)
    t.update_options(voice="maitri", temperature=0.5)
    assert t.voice == "maitri" and t.model == pipeline.engine.options.model
    assert t.provider == "veena" and t.capabilities.streaming


async def test_engine_failure_is_api_connection_error(snac_codec, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    broken = Pipeline(VllmEngine(EngineOptions(model="/nonexistent/model")), snac_codec, VEENA)
    tts_ = veena.TTS(pipeline=broken)
    stream = tts_.stream(conn_options=APIConnectOptions(max_retry=0, timeout=5))
    stream.push_text("hello there.")
    stream.end_input()
    with pytest.raises(APIConnectionError) as info:
        async for _ in stream:
            pass
    # a missing model is an engine that can never start: not retried (issue #10; a transient
    # engine error before any audio still is, see tests/test_protocol.py)
    assert not info.value.retryable and "not found" in str(info.value)
    assert broken.engine.health.state == "dead"
    await stream.aclose()


async def test_no_audio_within_conn_timeout_is_api_timeout_error(pipeline):
    from livekit.agents import APITimeoutError

    tts_ = veena.TTS(pipeline=pipeline, max_tokens_per_chunk=70)
    stream = tts_.stream(conn_options=APIConnectOptions(max_retry=0, timeout=0.001))
    stream.push_text("Too slow for a one millisecond budget.")
    stream.end_input()
    with pytest.raises(APITimeoutError):
        async for _ in stream:
            pass
    await stream.aclose()
    assert await engine_settled(pipeline)

