"""NeuCodec against Neuphonic's own code: golden outputs of ``neucodec`` 0.0.6's
``NeuCodec.decode_code`` (written by ``tests/golden/make_neucodec_golden.py``, not run here)
on a reduced-size checkpoint in the published layout, loaded here through the codec's loader
and decoded through the codec's ``decode``, as the pipeline does: relative RMS <= 1e-5."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.codecs.neucodec import NeuCodecCodec

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "neucodec"
CASES = json.loads((GOLDEN / "cases.json").read_text())


def rel_rms(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want**2)))


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN / "golden.npz") as data:
        return dict(data)


@pytest.fixture(scope="module")
def codec():
    return NeuCodecCodec.load(str(GOLDEN))


@pytest.mark.parametrize("case", sorted(CASES["cases"]))
def test_one_pass_decode_equals_neucodec(codec, golden, case):
    codes, want = golden[f"{case}_codes"], golden[f"{case}_audio"]
    with torch.inference_mode():
        got = codec.decode([CodecInput(codes=row, start_step=0, seed=0) for row in codes])
    assert rel_rms(np.stack(got), want) <= 1e-5


def test_the_checkpoint_is_the_published_layout():
    state = torch.load(GOLDEN / "pytorch_model.bin", weights_only=True)
    assert {k.split(".")[0] for k in state} == {"generator", "fc_post_a", "fc_prior"}
    assert "generator.quantizer.project_in.weight" in state  # an encoder tensor, ignored


def test_the_rotary_embedding_changes_nothing_in_the_reference():
    """The reference's rope, fed [b, h, t, d], rotates q and k of a head alike: removing it
    changes the official output by float rounding only, and rotating over time instead
    would change it by far more (the golden script measured both with the official code)."""
    for case in CASES["cases"].values():
        assert case["rope_identity_rel_rms"] <= 1e-5
        assert case["rope_over_time_rel_rms"] >= 1e-2
