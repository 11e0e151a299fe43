"""XCodec2's encoder (what a Llasa voice clone runs) against HKUST's own code: golden codes of
``xcodec2`` 0.1.5's ``XCodec2Model.encode_code`` (written by
``tests/golden/make_xcodec2_encoder_golden.py``, not run here) on a reduced-size checkpoint
with every tensor under its own name (weight norm as torch parametrizations, w2v-bert-2.0's
weights inside it). Loaded through the ``llasa`` profile's family, as ``voice clone`` does:
each clip's codes all equal, and the quantizer's input within 1e-5 (so a code is not equal by
luck of rounding)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from livekit.plugins.veena.models.profiles import LLASA
from livekit.plugins.veena.pipeline.family import family_for

from ..helpers import rel_rms
from .test_neucodec_golden import encode_seeing_the_quantizer_input

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "xcodec2_encoder"
CASES = json.loads((GOLDEN / "cases.json").read_text())


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN / "golden.npz") as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def encoder():
    return family_for(LLASA).load_speaker_encoder(str(GOLDEN), "cpu")


@pytest.mark.parametrize("clip", sorted(CASES["clips"]))
def test_encoder_codes_equal_xcodec2(encoder, golden, clip):
    codes, project_in = encode_seeing_the_quantizer_input(encoder, golden[f"{clip}_wav"])
    assert rel_rms(project_in, golden[f"{clip}_project_in"]) <= 1e-5
    np.testing.assert_array_equal(codes, golden[f"{clip}_codes"])
    assert codes.dtype == np.int64 and len(codes) == CASES["clips"][clip]["frames"]
    assert len(set(codes.tolist())) > 5  # the golden's codes spread over the codebook


def test_w2v_bert_weights_come_from_the_checkpoint(encoder):
    """The golden's w2v-bert-2.0 folder has a config and a feature extractor, no weights: the
    encoder took them from the checkpoint's ``semantic_model.*`` tensors (as XCodec2's
    published checkpoint carries them), 16 layers of them."""
    folder = GOLDEN / "w2v-bert-2.0"
    assert not any(p.suffix in (".safetensors", ".bin") for p in folder.iterdir())
    assert len(encoder.semantic_model.encoder.layers) == 16
    assert encoder.variant == "xcodec2"
