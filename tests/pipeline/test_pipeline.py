"""The pipeline end to end on the real vLLM engine (tiny random Veena-layout model)."""

import asyncio
import contextlib
import threading
from dataclasses import replace

import numpy as np
import pytest

from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.codecs.snac import SnacCodec
from livekit.plugins.veena.codecs.torch_threads import single_threaded_torch
from livekit.plugins.veena.pipeline.engine_options import SamplingOptions
from livekit.plugins.veena.pipeline.pipeline import (
    EmptyTextError,
    Pipeline,
    PipelineOptions,
    piece_seed,
)

from ..helpers import engine_settled, gated_codec, same_audio, wait_thread_event

pytestmark = pytest.mark.engine
SPF = 2048


def _sampling(pipeline, max_tokens, **kw):
    return replace(pipeline.sampling.defaults(), max_tokens=max_tokens, **kw)


async def test_audio_arrives_while_generation_runs(pipeline):
    syn = pipeline.synthesize("Streaming should start early.", sampling=_sampling(pipeline, 350), seed=3)
    chunks, live_at_first = [], None
    async for chunk in syn:
        if live_at_first is None:
            live_at_first = syn.vllm_request_ids[0] in pipeline.engine.live_request_ids
        chunks.append(chunk)
    assert live_at_first, "first audio must come before the engine finished generating"
    assert len(chunks) > 3 and chunks[-1].final and not any(c.final for c in chunks[:-1])
    assert [c.sequence for c in chunks] == list(range(len(chunks)))
    t = syn.timings
    assert t.first_token_ms > 0 and t.first_audio_ms >= t.first_token_ms
    assert t.real_time_factor > 0 and t.tokens == 350


async def test_audio_length_is_frames_times_2048_and_matches_one_pass(pipeline, snac_codec):
    """No trimming: every decodable frame contributes exactly 2048 samples.
    Against a one-pass decode of the same frames (same keyed noise): relative RMS below
    1e-3 and max error below 5e-3 (int16 rounding included), as in test_stitching."""
    syn = pipeline.synthesize("Count the frames.", sampling=_sampling(pipeline, 210), seed=5)
    pcm = await syn.collect()
    frames = syn.tracks[0].steps
    assert len(frames) == 30  # 210 tokens, the tiny model keeps the SNAC grammar
    assert len(pcm) == len(frames) * SPF
    (one,) = snac_codec.decode([CodecInput(np.stack(frames), 0, piece_seed(syn.seed, 0))])
    got = pcm.astype(np.float32) / 32767
    err = got - np.clip(one, -1, 1)
    assert np.sqrt(np.mean(err**2)) / np.sqrt(np.mean(one**2)) < 1e-3
    assert np.abs(err).max() < 5e-3


@pytest.mark.parametrize("adaptive", [True, False], ids=["adaptive", "ramp"])
@pytest.mark.parametrize("streaming", [True, False], ids=["streamed", "windowed"])
async def test_both_snac_decodes_match_the_one_pass_decode(pipeline, tiny_model_dir, adaptive,
                                                           streaming):
    """Two streams at once (batched where their shapes meet), each against the one-pass
    decode of its frames. Streamed (VEENA_SNAC_STREAMING, the default on a CPU codec): equal
    to int16 rounding, and the scheduler decodes each step once. Windowed: within the
    crossfade's error (as in test_stitching), each step decoded with its context."""
    codec = SnacCodec.load(f"{tiny_model_dir}/snac", streaming=streaming)
    options = replace(pipeline.options, snac_streaming=streaming, adaptive_windows=adaptive)
    own = Pipeline(pipeline.engine, codec, pipeline.profile, options)
    if streaming:
        assert (own.window.left, own.window.right) == (0, codec.lookahead_steps) == (0, 3)
        assert own.window.first == 1  # first audio after 4 steps, as the windowed default
    try:
        syns = [own.synthesize("Both decodes.", sampling=_sampling(own, 140 + 70 * i), seed=i)
                for i in range(2)]
        pcms = await asyncio.gather(*(syn.collect() for syn in syns))
    finally:
        await own.scheduler.aclose()
    kept = 0
    for syn, pcm in zip(syns, pcms):
        frames = syn.tracks[0].steps
        kept += len(frames)
        assert len(pcm) == len(frames) * SPF > 0
        (one,) = codec.decode([CodecInput(np.stack(frames), 0, piece_seed(syn.seed, 0))])
        if streaming:
            assert np.abs(pcm.astype(np.int64) - np.round(np.clip(one, -1, 1) * 32767)).max() <= 1
        else:
            err = pcm.astype(np.float32) / 32767 - np.clip(one, -1, 1)
            assert np.sqrt(np.mean(err**2)) / np.sqrt(np.mean(one**2)) < 1e-3
            assert np.abs(err).max() < 5e-3
    decoded = own.scheduler.stats.decoded_steps
    assert decoded == kept if streaming else decoded > kept


class _ThreadNoting:
    """The session's codec, noting the thread of each warm-up and decode."""

    def __init__(self, codec):
        self._codec = codec
        self.name, self.sample_rate = codec.name, codec.sample_rate
        self.samples_per_step = codec.samples_per_step
        self.threads: dict[str, set[int]] = {"warmup": set(), "decode": set()}

    def warmup(self):
        self.threads["warmup"].add(threading.get_ident())
        self._codec.warmup()

    def decode(self, batch):
        self.threads["decode"].add(threading.get_ident())
        return self._codec.decode(batch)


async def test_the_codec_warms_up_and_decodes_on_one_thread(pipeline):
    """A second torch thread team in the process slows every CPU decode (libgomp stops
    spinning): the warm-up runs on the decode thread, never on the event loop's or another."""
    codec = _ThreadNoting(pipeline.scheduler.codec)
    own = Pipeline(pipeline.engine, codec, pipeline.profile, pipeline.options)
    try:
        await own.start()
        await own.synthesize("One thread.", sampling=_sampling(pipeline, 70), seed=2).collect()
    finally:
        await own.scheduler.aclose()
    assert len(codec.threads["warmup"]) == 1 and codec.threads["warmup"] == codec.threads["decode"]
    assert threading.get_ident() not in codec.threads["decode"]


def test_single_threaded_torch_leaves_the_count_as_it_was():
    import torch

    before = torch.get_num_threads()
    with single_threaded_torch("cpu"):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with single_threaded_torch("cuda:0"):  # not the CPU: untouched
        assert torch.get_num_threads() == before


async def test_cancel_aborts_vllm_request_and_drops_windows(pipeline):
    syn = pipeline.synthesize("This will be interrupted.", sampling=_sampling(pipeline, 1400), seed=1)
    it = syn.__aiter__()
    await it.__anext__()
    rid = syn.vllm_request_ids[0]
    assert rid in pipeline.engine.live_request_ids
    with gated_codec(pipeline) as decoding:
        assert await wait_thread_event(decoding)
        await asyncio.wait_for(syn.aclose(), 120)  # returns while the codec is still held
        assert rid not in pipeline.engine.live_request_ids
        assert pipeline.scheduler.pending_for(rid) == 0
    assert await engine_settled(pipeline)
    tokens = syn.timings.tokens
    assert tokens < 1400
    await asyncio.sleep(0.2)
    assert syn.timings.tokens == tokens, "no token arrives after the abort"


async def test_a_cancelled_run_holds_no_window_once_vllm_is_told(pipeline, monkeypatch):
    """The run's queued windows are dropped before vLLM's abort is awaited: no codec call is
    spent on them meanwhile, and whoever sees the engine settled sees them gone (a server
    test once saw the engine settled with a left client's window still queued)."""
    a = pipeline.synthesize("Holding the codec busy.", sampling=_sampling(pipeline, 1400), seed=1)
    b = pipeline.synthesize("Queued behind it.", sampling=_sampling(pipeline, 1400), seed=2)
    await a.__aiter__().__anext__()
    llm, seen = pipeline.engine._llm, []
    real_abort = llm.abort

    async def abort(request_id, *args, **kwargs):
        seen.append((request_id, pipeline.scheduler.pending_for(request_id)))
        return await real_abort(request_id, *args, **kwargs)

    with gated_codec(pipeline) as decoding:
        assert await wait_thread_event(decoding)  # a's next window is in the codec
        player = asyncio.create_task(b.play(lambda pcm, final: None))
        for _ in range(6000):  # a hang guard: b's first window queues behind a's
            if b.vllm_request_ids and pipeline.scheduler.pending_for(b.vllm_request_ids[-1]):
                break
            await asyncio.sleep(0.02)
        rid = b.vllm_request_ids[-1]
        assert pipeline.scheduler.pending_for(rid) > 0
        monkeypatch.setattr(llm, "abort", abort)
        player.cancel()  # as a server cancels a context's turn
        with contextlib.suppress(asyncio.CancelledError):  # ends while the codec is held
            await asyncio.wait_for(player, 120)
        monkeypatch.undo()
        # (vLLM calls it again for its own internal id)
        assert [queued for asked, queued in seen if asked == rid] == [0]
    await a.aclose()
    assert await engine_settled(pipeline) and pipeline.scheduler.pending == 0


async def test_same_seed_same_audio_alone_or_concurrent(pipeline):
    """Same seed: the same tokens and the same audio (``same_audio``: within the windowing
    bounds, since listener-paced windows follow timing), alone or sharing engine and decode
    batches; another seed gives other audio."""
    s = _sampling(pipeline, 140)
    solo_syn = pipeline.synthesize("Same seed.", sampling=s, seed=42)
    solo = await solo_syn.collect()
    syns = [pipeline.synthesize("Same seed.", sampling=s, seed=seed) for seed in (42, 42, 43)]
    a, b, c = await asyncio.gather(*(x.collect() for x in syns))
    for syn, pcm in zip(syns[:2], (a, b)):
        assert np.array_equal(np.stack(syn.tracks[0].steps), np.stack(solo_syn.tracks[0].steps))
        assert same_audio(pcm, solo)
    assert len(c) == len(solo) and not same_audio(c, solo)
    assert np.abs(c.astype(np.int32) - solo).max() > 1000


async def test_fixed_ramp_is_reproducible_within_one_lsb(pipeline):
    """VEENA_ADAPTIVE_WINDOWS=0: the window plan depends on the tokens only, so the same
    seed gives the same int16 audio within 1 LSB (batched convolutions may round the last
    float bit differently), alone or concurrent."""
    ramp = Pipeline(pipeline.engine, pipeline.codec, pipeline.profile,
                    PipelineOptions(adaptive_windows=False))
    try:
        s = _sampling(ramp, 140)
        solo = await ramp.synthesize("Same seed.", sampling=s, seed=42).collect()
        both = await asyncio.gather(*(ramp.synthesize("Same seed.", sampling=s, seed=42).collect()
                                      for _ in range(2)))
        for pcm in both:
            assert len(pcm) == len(solo) and np.abs(pcm.astype(np.int32) - solo).max() <= 1
    finally:
        await ramp.scheduler.aclose()


@pytest.mark.parametrize("text", ["", "   \n\t "])
def test_empty_text_rejected(pipeline, text):
    with pytest.raises(EmptyTextError):
        pipeline.synthesize(text)


def test_unknown_voice_lists_valid_ones(pipeline):
    with pytest.raises(ValueError, match="kavya, agastya, maitri, vinaya"):
        pipeline.synthesize("hello", voice="nobody")


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_k=0),
                                 dict(repetition_penalty=5), dict(max_tokens=0),
                                 dict(min_tokens=10, max_tokens=5), dict(seed=-3)])
def test_bad_sampling_rejected_before_engine_work(pipeline, bad):
    before = pipeline.engine.num_unfinished_requests
    with pytest.raises(ValueError, match="invalid sampling options"):
        pipeline.synthesize("hello", sampling=replace(SamplingOptions(), **bad))
    assert pipeline.engine.num_unfinished_requests == before


def test_long_text_is_split_not_truncated(pipeline):
    sentence = "This sentence is part of a very long text that exceeds the context. "
    text = sentence * 60
    syn = pipeline.synthesize(text)
    limit = pipeline.sampling.max_chars_per_request()
    assert len(syn.pieces) > 1 and all(len(p) <= limit for p in syn.pieces)
    assert " ".join(syn.pieces).split() == text.split()
