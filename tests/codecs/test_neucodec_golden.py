"""NeuCodec against Neuphonic's own code: golden outputs of ``neucodec`` 0.0.6 (written by
``tests/golden/make_neucodec_golden.py``, not run here) on a reduced-size checkpoint in the
published layout. ``NeuCodec.decode_code``: loaded here through the codec's loader and
decoded through the codec's ``decode``, as the pipeline does, relative RMS <= 1e-5.
``NeuCodec.encode_code``: each clip's codes all equal, and the quantizer's input within
1e-5 (so a code is not equal by luck of rounding). XCodec2's ``decode_code`` likewise."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.codecs.neucodec_encoder import NeuCodecEncoder
from livekit.plugins.veena.models.profiles import LLASA, NEUTTS
from livekit.plugins.veena.pipeline.family import family_for

from ..helpers import rel_rms

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "neucodec"
CASES = json.loads((GOLDEN / "cases.json").read_text())


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN / "golden.npz") as data:
        return dict(data)


@pytest.fixture(scope="module")
def codec():
    """Through the family's codec loader, as ``load_pipeline`` builds it."""
    return family_for(NEUTTS).load_codec(str(GOLDEN), "cpu")


@pytest.mark.parametrize("case", sorted(CASES["cases"]))
def test_one_pass_decode_equals_neucodec(codec, golden, case):
    codes, want = golden[f"{case}_codes"], golden[f"{case}_audio"]
    with torch.inference_mode():
        got = codec.decode([CodecInput(codes=row, start_step=0, seed=0) for row in codes])
    assert rel_rms(np.stack(got), want) <= 1e-5


def test_the_checkpoint_is_the_published_layout():
    state = torch.load(GOLDEN / "pytorch_model.bin", weights_only=True)
    assert {k.split(".")[0] for k in state} == {"generator", "fc_post_a", "fc_prior",
                                                "CodecEnc", "SemanticEncoder_module"}
    assert "CodecEnc.conv_blocks.0.weight_g" in state  # weight norm, as published
    assert "generator.quantizer.project_in.weight" in state  # an encoder tensor, ignored


def test_the_rotary_embedding_changes_nothing_in_the_reference():
    """The reference's rope, fed [b, h, t, d], rotates q and k of a head alike: removing it
    changes the official output by float rounding only, and rotating over time instead
    would change it by far more (the golden script measured both with the official code)."""
    for case in CASES["cases"].values():
        assert case["rope_identity_rel_rms"] <= 1e-5
        assert case["rope_over_time_rel_rms"] >= 1e-2


@pytest.fixture(scope="module")
def encoder():
    return NeuCodecEncoder.load(str(GOLDEN))


def encode_seeing_the_quantizer_input(encoder, wav: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A 16 kHz clip's codes, and what the FSQ's ``project_in`` gave for it (the goldens
    record both: a wrong code then shows whether the features or the rounding moved)."""
    captured = []
    hook = encoder.heads.generator.quantizer.project_in.register_forward_hook(
        lambda _m, _i, out: captured.append(out[0].numpy().copy()))
    try:
        codes = encoder.encode_reference(wav, 16000)
    finally:
        hook.remove()
    return codes, captured[-1]


@pytest.mark.parametrize("clip", sorted(CASES["clips"]))
def test_encoder_codes_equal_neucodec(encoder, golden, clip):
    codes, project_in = encode_seeing_the_quantizer_input(encoder, golden[f"{clip}_wav"])
    assert rel_rms(project_in, golden[f"{clip}_project_in"]) <= 1e-5
    np.testing.assert_array_equal(codes, golden[f"{clip}_codes"])
    assert codes.dtype == np.int64 and len(codes) == CASES["clips"][clip]["frames"]


def test_xcodec2_is_the_same_decoder_at_16khz():
    """Llasa's XCodec2: ``xcodec2`` 0.1.5's ``XCodec2Model.decode_code`` on the same reduced
    sizes at hop 320, its checkpoint as safetensors: the same port, through the ``llasa``
    profile's family loader, its sizes from the folder."""
    folder = GOLDEN.parent / "xcodec2"
    codec = family_for(LLASA).load_codec(str(folder), "cpu")
    assert (codec.sample_rate, codec.samples_per_step) == (16000, 320)
    with np.load(folder / "golden.npz") as data:
        codes, want = data["codes"], data["audio"]
    got = codec.decode([CodecInput(codes=row, start_step=0, seed=0) for row in codes])
    assert rel_rms(np.stack(got), want) <= 1e-5
