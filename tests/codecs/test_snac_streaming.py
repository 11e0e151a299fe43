"""The incremental SNAC decoder against the one-pass decode: ours with keyed noise, and the
``snac`` package's own ``SNAC.decode`` with its noise off (the outside reference)."""

import copy
import math

import numpy as np
import pytest
import torch
from snac import SNAC
from snac.layers import NoiseBlock

from livekit.plugins.veena.codecs.base import CodecInput, StreamPart
from livekit.plugins.veena.codecs.snac import SNAC_24KHZ_CONFIG, SnacCodec
from livekit.plugins.veena.pipeline.pipeline import streamed_window
from livekit.plugins.veena.pipeline.windowing import WindowOptions

SPF = 2048


@pytest.fixture(scope="module")
def codec():
    torch.set_num_threads(2)
    return SnacCodec.random(seed=3, streaming=True)


def _frames(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 4096, size=(count, 7))


def _assert_equal_to_rounding(got: np.ndarray, want: np.ndarray) -> None:
    """Float rounding only: convolutions over other lengths sum in another order, and
    oneDNN may pick another algorithm for the one-pass decode from run to run (measured
    here: relative RMS 6e-7 or 8e-6, max 1.1e-5). Windowed decoding, an approximation,
    is 7e-5 / 6e-4; a wrong layer is 1e-2 and more."""
    assert np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want**2)) < 3e-5
    assert np.abs(got - want).max() < 1e-4


def _stream(codec, frames: np.ndarray, chunks: list[int], seed: int) -> np.ndarray:
    """Feed ``frames`` in ``chunks`` the way a run does (each window's codes start at its
    first kept step; the decoder's reach as right context); the audio handed out."""
    stream, out, fed, kept = codec.new_stream(seed), [], 0, 0
    reach = codec.lookahead_steps
    for i, size in enumerate(chunks):
        last = i == len(chunks) - 1
        end = fed + size
        keep_end = end if last else max(kept, end - reach)
        part = StreamPart(stream, fed - kept, keep_end, last, last)
        (audio,) = codec.decode([CodecInput(frames[kept:end], kept, seed, stream=part)])
        assert len(audio) == (keep_end - kept) * SPF
        out.append(audio)
        fed, kept = end, keep_end
    return np.concatenate(out)


@torch.inference_mode()
@pytest.mark.parametrize("chunks", [[1] * 16, [16], [4, 3, 9], [2, 1, 5, 8]],
                         ids=["steps", "whole", "uneven", "growing"])
def test_streamed_audio_is_the_one_pass_decode(codec, chunks):
    frames = _frames(16, 1)
    (one,) = codec.decode([CodecInput(frames, 0, 77)])
    got = _stream(codec, frames, chunks, 77)
    assert got.shape == one.shape == (16 * SPF,)
    _assert_equal_to_rounding(got, one)


@torch.inference_mode()
def test_streamed_audio_is_snac_decode_with_its_noise_off():
    """The reference: ``snac``'s own model and ``SNAC.decode`` on the same seeded weights."""
    torch.manual_seed(11)
    reference = SNAC(**SNAC_24KHZ_CONFIG).eval()
    ours = SnacCodec(copy.deepcopy(reference), noise=False, streaming=True)
    for module in reference.modules():
        if isinstance(module, NoiseBlock):
            module.forward = lambda x: x
    frames = _frames(12, 2)
    levels = [torch.from_numpy(frames[:, cols].reshape(1, -1)) for cols in ours._level_cols]
    want = reference.decode(levels)[0, 0].numpy()
    got = _stream(ours, frames, [3, 1, 2, 6], 5)
    assert got.shape == want.shape == (12 * SPF,)
    _assert_equal_to_rounding(got, want)


@torch.inference_mode()
def test_streams_decode_the_same_batched_or_alone(codec):
    """Three streams in calls together: two at the same point (one batch), one behind, and
    two windows of one stream in one call (they run in order)."""
    frames = [_frames(10, 10 + i) for i in range(3)]
    alone = [_stream(codec, f, [4, 6], 20 + i) for i, f in enumerate(frames)]
    streams = [codec.new_stream(20 + i) for i in range(3)]
    reach = codec.lookahead_steps

    def part(i, kept, fed, end, last):
        return CodecInput(frames[i][kept:end], kept, 20 + i,
                          stream=StreamPart(streams[i], fed - kept, end if last else end - reach,
                                            last, last))

    first = codec.decode([part(0, 0, 0, 4, False), part(1, 0, 0, 4, False)])
    rest = codec.decode([part(0, 1, 4, 10, True), part(1, 1, 4, 10, True),
                         part(2, 0, 0, 4, False), part(2, 1, 4, 10, True)])
    got = [np.concatenate([first[0], rest[0]]), np.concatenate([first[1], rest[1]]),
           np.concatenate([rest[2], rest[3]])]
    for g, a in zip(got, alone):
        _assert_equal_to_rounding(g, a)


@torch.inference_mode()
def test_lookahead_is_the_decoders_reach(codec):
    """The audio trails the steps fed by exactly the decoder's reach, and a window asking
    for audio within that reach is refused rather than handed unfinished samples."""
    decoder = codec.streams
    stream = codec.new_stream(1)
    frames = _frames(8, 3)
    codec.decode([CodecInput(frames, 0, 1, stream=StreamPart(stream, 0, 0, False, False))])
    assert len(stream.audio) == 8 * SPF - decoder.delay_samples
    assert codec.lookahead_steps == math.ceil(decoder.delay_samples / SPF) == 3
    too_far = StreamPart(stream, 8, 8 - codec.lookahead_steps + 1, False, False)
    with pytest.raises(ValueError, match="right context"):
        codec.decode([CodecInput(frames, 0, 1, stream=too_far)])


@torch.inference_mode()
def test_no_step_after_the_end(codec):
    stream = codec.new_stream(1)
    frames = _frames(4, 4)
    codec.decode([CodecInput(frames, 0, 1, stream=StreamPart(stream, 0, 4, True, True))])
    with pytest.raises(ValueError, match="ended"):
        codec.decode([CodecInput(frames, 4, 1, stream=StreamPart(stream, 0, 8, True, True))])


def test_windowed_codecs_have_no_stream():
    windowed = SnacCodec(SNAC(**SNAC_24KHZ_CONFIG))
    assert windowed.new_stream(1) is None and windowed.lookahead_steps is None


def test_streamed_window_waits_as_many_steps_for_first_audio():
    windowed = WindowOptions(first=2, new=8, left=2, right=2)
    assert streamed_window(windowed, None) == windowed
    assert streamed_window(windowed, 3) == WindowOptions(first=1, new=8, left=0, right=3)
    assert streamed_window(windowed, 6).first == 1  # a longer reach: one step, no fewer
    assert streamed_window(WindowOptions(first=4, new=8, left=2, right=2), 3).first == 3


def test_streaming_is_read_from_the_environment(monkeypatch):
    """``auto`` (the default): streamed where the codec runs on the CPU, windowed on CUDA."""
    from dataclasses import replace

    from livekit.plugins.veena.models.loading import pipeline_options_from_env

    monkeypatch.delenv("VEENA_SNAC_STREAMING", raising=False)
    auto = pipeline_options_from_env()
    assert auto.snac_streaming is None and auto.streams_snac()
    assert not replace(auto, codec_device="cuda:0").streams_snac()
    for raw, want in (("auto", None), ("1", True), ("off", False)):
        monkeypatch.setenv("VEENA_SNAC_STREAMING", raw)
        assert pipeline_options_from_env().snac_streaming is want
    assert not replace(auto, snac_streaming=False).streams_snac()
    assert replace(auto, snac_streaming=True, codec_device="cuda").streams_snac()
    monkeypatch.setenv("VEENA_SNAC_STREAMING", "sometimes")
    with pytest.raises(ValueError, match="VEENA_SNAC_STREAMING"):
        pipeline_options_from_env()


def test_a_streamed_window_is_costed_by_the_steps_it_decodes():
    """The planner asks the cost of ``size + right`` steps: a stream's first window (four
    new frames) is measured as a steady window of four, a later one (one new frame after
    three already fed) as a steady window of one."""
    stream = object()
    first = CodecInput(_frames(4, 0), 0, 1, stream=StreamPart(stream, 0, 1, False, False))
    later = CodecInput(_frames(4, 0), 1, 1, stream=StreamPart(stream, 3, 2, False, False))
    last = CodecInput(_frames(5, 0), 2, 1, stream=StreamPart(stream, 3, 7, True, True))
    assert (first.work_steps, first.cost_steps) == (4, 7)
    assert (later.work_steps, later.cost_steps) == (1, 4)
    assert (last.work_steps, last.cost_steps) == (2, 2)
    assert CodecInput(_frames(6, 0), 0, 1).cost_steps == 6
