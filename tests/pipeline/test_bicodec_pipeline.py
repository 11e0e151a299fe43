"""The BiCodec (Spark/Veena3) path on the real vLLM engine: captured globals, continuation,
linear windowed decode, and the LiveKit stream, on a tiny random Spark-layout model."""

import asyncio
from dataclasses import replace

import numpy as np
import pytest
from livekit.plugins import veena

from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.pipeline.chunking import ChunkerOptions, TextChunker
from livekit.plugins.veena.pipeline.turn import Turn, TurnOptions

from ..helpers import tiny_engine_options

pytestmark = pytest.mark.engine


def _sampling(p, n):
    return replace(p.sampling.defaults(), max_tokens=n)


async def test_first_request_captures_exactly_32_globals_then_continuation_reuses_them(spark_pipeline):
    p = spark_pipeline
    first = p.synthesize("नमस्ते, यह पहला वाक्य है।", voice="kavya", sampling=_sampling(p, 80), seed=1)
    pcm = await first.collect()
    t = first.timings
    # the first window (globals + 10 new + 20 right-context tokens) goes to the decoder as
    # soon as its tokens are there, before the request's last token: streaming, not a
    # decode after the whole request (token order, not speed; when it is decoded depends on
    # the machine)
    assert t.first_window_ready < t.last_token
    track = first.tracks[0]
    assert len(first.speaker_globals) == 32 and track.framer.extra_globals == 0
    assert all(0 <= g < 4096 for g in first.speaker_globals)
    assert len(track.steps) == 80 and len(pcm) == 80 * 320
    assert first.vllm_request_ids[0].endswith(".globals")
    cont = p.synthesize("दूसरा वाक्य।", voice="kavya", sampling=_sampling(p, 40), seed=1,
                        speaker_globals=first.speaker_globals)
    pcm2 = await cont.collect()
    assert len(cont.vllm_request_ids) == 1, "a continuation generates semantic tokens only"
    assert cont.speaker_globals == first.speaker_globals
    assert cont.tracks[0].framer.globals_ == list(first.speaker_globals)
    assert cont.tracks[0].framer.extra_globals == 0 and len(pcm2) == 40 * 320


async def test_windowed_output_matches_one_pass(spark_pipeline):
    """Bound as in tests/codecs/test_bicodec.py, plus int16 rounding."""
    p = spark_pipeline
    syn = p.synthesize("एक लंबा वाक्य जो कई खिड़कियों में बँटता है।", sampling=_sampling(p, 160), seed=2)
    pcm = (await syn.collect()).astype(np.float32) / 32767
    steps = syn.tracks[0].steps
    (one,) = p.codec.decode([CodecInput(np.asarray(steps), 0, 0, np.asarray(syn.speaker_globals))])
    err = pcm - np.clip(one, -1, 1)
    assert len(pcm) == len(steps) * 320
    assert np.abs(err).max() < 2e-4


@pytest.mark.parametrize("bad", [list(range(31)), [5000] * 32])
def test_bad_globals_rejected_before_engine_work(spark_pipeline, bad):
    with pytest.raises(ValueError, match="global"):
        spark_pipeline.synthesize("hello", speaker_globals=bad)


async def test_concurrent_turns_keep_their_own_globals(spark_pipeline):
    p = spark_pipeline

    async def turn(voice, seed):
        t = Turn(p, TurnOptions(voice=voice, sampling=_sampling(p, 30), seed=seed, timeout=60))

        async def chunks():
            for text in ("पहला हिस्सा।", "दूसरा हिस्सा।", "तीसरा हिस्सा।"):
                yield text

        audio = []
        await t.speak(chunks(), audio.append)
        return t, np.concatenate(audio)

    (ta, a), (tb, b) = await asyncio.gather(turn("kavya", 11), turn("arjun", 12))
    for t in (ta, tb):
        assert len(t.chunk_globals) == 3 and all(g == t.speaker_globals for g in t.chunk_globals)
    assert ta.speaker_globals != tb.speaker_globals
    assert len(a) == len(b) == 3 * 30 * 320 - 2 * 240


async def test_livekit_stream_on_the_spark_model(spark_pipeline):
    tts_ = veena.TTS(pipeline=spark_pipeline, max_tokens_per_chunk=40, seed=5)
    metrics = []
    tts_.on("metrics_collected", metrics.append)
    stream = tts_.stream()
    deltas = ["नमस्ते, आप कैसे हैं? ", "मैं ठीक हूँ, धन्यवाद। ", "आज मौसम बहुत अच्छा है।"]
    chunker = TextChunker(ChunkerOptions.from_env())  # the chunks, counted independently
    n = sum(len(chunker.push(d)) for d in deltas) + len(chunker.flush())
    for delta in deltas:
        stream.push_text(delta)
    stream.end_input()
    events = [ev async for ev in stream]
    await stream.aclose()
    assert all(ev.frame.sample_rate == 16000 for ev in events)
    assert len({ev.segment_id for ev in events}) == 1 and events[-1].is_final
    samples = sum(ev.frame.samples_per_channel for ev in events)
    assert n >= 2 and samples == n * 40 * 320 - (n - 1) * 240
    assert metrics and metrics[0].ttfb > 0


# -- the spark profile on a tiny model in Spark-TTS-0.5B's folder layout ---------------------
@pytest.fixture(scope="module")
async def official_spark(tmp_path_factory):
    """A third engine, for this module only: ``LLM/`` beside ``BiCodec/``, free generation."""
    from livekit.plugins.veena.models.download import llm_location
    from livekit.plugins.veena.models.tiny_model import make_tiny_model

    root = str(make_tiny_model(tmp_path_factory.mktemp("tiny-spark"), "spark", seed=0))
    p = veena.load_pipeline(
        root, engine_options=tiny_engine_options(llm_location(root, veena.SPARK), 4),
        options=veena.PipelineOptions())
    await p.start()
    try:
        yield p
    finally:
        await p.aclose()


async def test_spark_named_voice_writes_its_globals_then_later_requests_reuse_them(official_spark):
    p = official_spark
    assert p.profile is veena.SPARK and p.codec_model.endswith("BiCodec")
    first = p.synthesize("Hello there.", voice="male-high-low", sampling=_sampling(p, 120), seed=3)
    pcm = await first.collect()
    track = first.tracks[0]
    assert len(first.vllm_request_ids) == 1, "one free generation, as Spark-TTS's inference"
    assert len(first.speaker_globals) == 32 and track.framer.stats.invalid_frames == 0
    assert len(track.steps) > 40 and len(pcm) == len(track.steps) * 320
    cont = p.synthesize("And again.", voice="male-high-low", sampling=_sampling(p, 60), seed=3,
                        speaker_globals=first.speaker_globals)
    pcm2 = await cont.collect()
    assert len(cont.vllm_request_ids) == 1 and cont.speaker_globals == first.speaker_globals
    assert len(pcm2) == len(cont.tracks[0].steps) * 320 > 0


async def test_spark_cloned_voice_speaks_with_its_globals_only(official_spark):
    from livekit.plugins.veena.models.profiles import CLONED_VOICE

    p = official_spark
    ids = tuple(range(100, 132))
    syn = p.synthesize("A cloned voice.", voice=CLONED_VOICE, speaker_globals=ids,
                       sampling=_sampling(p, 60), seed=4)
    pcm = await syn.collect()
    assert len(syn.vllm_request_ids) == 1 and syn.speaker_globals == ids
    assert syn.tracks[0].framer.globals_ == list(ids) and len(pcm) > 0
