"""CUDA graphs for the codecs' decode calls (``codecs.cuda_graphs``).

On this CPU-only machine: graphs stay off on CPU, a batch padded to its graph bucket decodes
its real rows exactly as the batch alone (what the graph path relies on), and a capture that
fails falls back to eager calls. Where CUDA is present, the graph replay is compared with the
eager decode across batch and window sizes (``bench/gpu_bench.py`` also reports host CPU per
call with and without graphs on the lent accelerator).
"""

import numpy as np
import pytest
import torch

from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.codecs.bicodec import BiCodecCodec
from livekit.plugins.veena.codecs.cuda_graphs import (
    GraphedCall,
    batch_bucket,
    batch_buckets,
    capture_windows,
)
from livekit.plugins.veena.codecs.snac import SnacCodec
from livekit.plugins.veena.models.loading import pipeline_options_from_env
from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.pipeline.engine import EngineOptions, VllmEngine
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions


def _windows(n, frames=6, seed=0):
    rng = np.random.default_rng(seed)
    return [CodecInput(rng.integers(0, 4096, (frames, 7)), start_step=3 * i, seed=11 + i)
            for i in range(n)]


def test_batch_bucket():
    assert [batch_bucket(n, 64) for n in (1, 2, 3, 4, 5, 8, 9, 33, 64)] == \
        [1, 2, 4, 4, 8, 8, 16, 64, 64]
    assert batch_bucket(65, 64) is None and batch_bucket(17, 16) is None


def test_batch_buckets():
    """What a pipeline captures before serving: every padded size its batches replay at. A
    maximum that is not a power of two still has its top bucket (a batch of 3 pads to 4):
    the first version of the capture failed there on the H200, in the CUDA-only test below."""
    assert batch_buckets(16, 64) == [1, 2, 4, 8, 16]
    assert batch_buckets(3, 64) == [1, 2, 4]
    assert batch_buckets(20, 64) == [1, 2, 4, 8, 16, 32]
    assert batch_buckets(100, 64) == [1, 2, 4, 8, 16, 32, 64]


def test_graphs_are_off_on_cpu():
    assert SnacCodec.random(device="cpu", cuda_graphs=True).graphs is None
    assert BiCodecCodec.random(device="cpu", cuda_graphs=True).graphs is None


@pytest.mark.parametrize("n", [1, 3, 5])
def test_padded_batches_decode_as_the_batch_alone(snac_codec, n):
    """The graph path pads a batch to its bucket with rows of zeros (seed 0, step 0): the
    real rows must decode exactly as without padding. Run here through the eager function the
    graph would capture."""
    batch = _windows(n)
    alone = snac_codec.decode(batch)
    padded = SnacCodec(snac_codec.model, device="cpu")
    padded._keys = snac_codec._keys  # the model's noise blocks read the first codec's keys
    padded.graphs = padded._decode_tensors
    for got, want in zip(padded.decode(batch), alone, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("n", [1, 3])
def test_padded_bicodec_batches_decode_as_the_batch_alone(n):
    codec = BiCodecCodec.random(seed=3)
    rng = np.random.default_rng(n)
    batch = [CodecInput(rng.integers(0, 8192, 20), 0, 0, speaker=rng.integers(0, 4096, 32))
             for _ in range(n)]
    alone = codec.decode(batch)
    codec.graphs = codec._decode_tensors
    for got, want in zip(codec.decode(batch), alone, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_failed_capture_decodes_eagerly_and_turns_graphs_off(caplog):
    """A call on CPU tensors cannot be captured (with or without CUDA on the machine: on a
    GPU machine it once captured an empty graph that answered x * 2 for x + 1): the call
    still answers, eagerly, once and after."""
    calls = []

    def double(x):
        calls.append(x.shape)
        return x * 2

    graphed = GraphedCall(double, name="toy")
    x = torch.arange(4.0)
    assert torch.equal(graphed(x), x * 2) and torch.equal(graphed(x + 1), (x + 1) * 2)
    assert not graphed.enabled
    assert graphed.stats.captures == 0 and graphed.stats.eager_calls == 2
    assert "CUDA graph capture failed" in caplog.text


def test_option_reads_the_environment(monkeypatch):
    assert PipelineOptions().codec_cuda_graphs
    monkeypatch.setenv("VEENA_CODEC_CUDA_GRAPHS", "0")
    assert not pipeline_options_from_env().codec_cuda_graphs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("frames", [6, 12])
def test_graph_replay_equals_eager_on_cuda(frames):
    eager = SnacCodec.random(seed=5, device="cuda", cuda_graphs=False)
    graphed = SnacCodec.random(seed=5, device="cuda", cuda_graphs=True)
    for n in (1, 3, 5, 3):
        batch = _windows(n, frames, seed=n)
        for a, b in zip(eager.decode(batch), graphed.decode(batch)):
            np.testing.assert_allclose(b, a, atol=1e-4, rtol=0)
    assert graphed.graphs.enabled
    assert graphed.graphs.stats.captures == 3 and graphed.graphs.stats.replays == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_call_that_syncs_the_host_is_not_captured_on_cuda(caplog):
    """Reading a value back to the host is not allowed while capturing: that call decodes
    eagerly, with the right answers, and later captures on the same device still work."""
    graphed = GraphedCall(lambda x: x * float(x.max()), name="sync")
    x = torch.arange(4.0, device="cuda")
    assert torch.equal(graphed(x), x * 3) and torch.equal(graphed(x + 1), (x + 1) * 4)
    assert not graphed.enabled and graphed.stats.captures == 0
    assert "CUDA graph capture failed" in caplog.text
    doubled = GraphedCall(lambda x: x * 2, name="double")
    assert torch.equal(doubled(x), x * 2) and torch.equal(doubled(x + 1), (x + 1) * 2)
    assert doubled.enabled and doubled.stats.captures == 1 and doubled.stats.replays == 2


@pytest.mark.parametrize("adaptive, steps", [(True, [4, 6, 8, 12, 20, 36]), (False, [4, 6, 8, 12])])
def test_the_window_shapes_captured_before_serving(snac_codec, adaptive, steps):
    """SNAC's defaults (first 2, L = R = 2; adaptive sizes 2-32, the ramp's 2-8): the first
    window (2 + 2 right) and each steady size with its context. ``tests/pipeline/test_pacing.py``
    checks that the planners' windows take only these shapes."""
    pipeline = Pipeline(VllmEngine(EngineOptions(model="unused")), snac_codec, VEENA,
                        PipelineOptions(adaptive_windows=adaptive))
    assert pipeline.window_steps() == steps
    assert capture_windows(snac_codec, steps, 16) == 0  # no graphs on CPU: nothing decoded


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_shapes_captured_before_serving_are_replayed_on_cuda():
    codec = SnacCodec.random(seed=5, device="cuda", cuda_graphs=True)
    assert capture_windows(codec, [4, 6], max_batch=3) == 6  # buckets 1, 2, 4 x 2 windows
    eager = SnacCodec.random(seed=5, device="cuda", cuda_graphs=False)
    batch = _windows(3, frames=6, seed=1)
    for a, b in zip(eager.decode(batch), codec.decode(batch)):
        np.testing.assert_allclose(b, a, atol=1e-4, rtol=0)
    assert codec.graphs.stats.captures == 6 and codec.graphs.enabled

