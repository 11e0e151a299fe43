"""The NeuCodec streaming benchmark's peer is Neuphonic's own scheme: its rewrite
(``bench/neucodec_stream.NeuphonicStream``) yields the same chunks, sample for sample, as
``neutts`` 1.4.1's ``_infer_stream_ggml`` on the same codes and the same (reduced-size)
decoder: golden output of the official generator, ``tests/golden/make_neutts_stream_golden.py``.
That includes its last chunk, which starts one frame before where it is placed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from livekit.plugins.veena.codecs.neucodec import NeuCodecCodec

from .helpers import rel_rms

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "neutts_stream"
STREAMS = json.loads((GOLDEN / "cases.json").read_text())["streams"]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import neucodec_stream
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return neucodec_stream


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_the_rewrite_yields_neuphonics_chunks(bench, name):
    codec = NeuCodecCodec.load(str(ROOT / "tests" / "golden" / "neucodec"))
    with np.load(GOLDEN / "golden.npz") as data:
        codes, chunks, lengths = (data[f"{name}_{k}"] for k in ("codes", "chunks", "lengths"))
    ref, n = STREAMS[name]["reference"], STREAMS[name]["generated"]
    run = bench.run_neuphonic(codec, codes, ref, n, None)
    assert run["chunk_samples"] == lengths.tolist()
    assert len(run["audio"]) == (n + 1) * 480  # its last chunk: one frame early, so longer
    assert rel_rms(run["audio"], chunks) <= 1e-5
