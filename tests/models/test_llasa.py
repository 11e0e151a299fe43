"""Llasa is a profile of the NeuCodec family, nothing more: the tiny Llasa-layout model
(a Llama, a Llama-3-style chat template, 65,536 ``<|s_N|>`` tokens, a tiny XCodec2 at 16 kHz,
hop 320) runs through the same family, the prompt through the tokenizer's own chat template.
The prompt itself is read from Llasa's model card, not checked against its code."""

import numpy as np
import pytest

from livekit.plugins.veena.models.families import family_for
from livekit.plugins.veena.models.profiles import LLASA
from livekit.plugins.veena.models.tiny_model import make_tiny_model
from livekit.plugins.veena.pipeline.guards import GuardOptions
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions
from tests.fakes import ScriptedEngine

REFERENCE = tuple(range(100, 160))


@pytest.fixture(scope="module")
def tiny_llasa_dir(tmp_path_factory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-llasa"), "llasa", seed=0))


@pytest.fixture(scope="module")
def tokenizer(tiny_llasa_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llasa_dir)


def test_prompt_is_the_chat_template_continued_with_the_reference(tokenizer):
    ids = family_for(LLASA).prompt(tokenizer, "Hello there.", "The clip says this.", REFERENCE)
    base = tokenizer.convert_tokens_to_ids("<|s_0|>")
    assert ids[-len(REFERENCE):] == [base + c for c in REFERENCE]
    head = tokenizer.decode(ids[:-len(REFERENCE)])
    assert head == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
                    "Convert the text to speech:<|TEXT_UNDERSTANDING_START|>The clip says this. "
                    "Hello there.<|TEXT_UNDERSTANDING_END|><|eot_id|><|start_header_id|>"
                    "assistant<|end_header_id|>\n\n<|SPEECH_GENERATION_START|>")


async def test_speaks_16khz_through_the_same_family(tiny_llasa_dir, tokenizer):
    family = family_for(LLASA)
    codec = family.load_codec(f"{tiny_llasa_dir}/xcodec2", "cpu")
    assert (codec.sample_rate, codec.samples_per_step) == (16000, 320)
    base = tokenizer.convert_tokens_to_ids("<|s_0|>")
    end = tokenizer.convert_tokens_to_ids("<|SPEECH_GENERATION_END|>")
    codes = np.random.default_rng(2).integers(0, 65536, 40)
    engine = ScriptedEngine([[base + int(c) for c in codes] + [end]], delta=5)
    engine.tokenizer = tokenizer
    p = Pipeline(engine, codec, LLASA,
                 PipelineOptions(freeze_gc_heap=False, guards=GuardOptions(silence_s=0.0)))
    await p.start()
    try:
        syn = p.synthesize("Hello there.", voice="The clip says this.",
                           speaker_globals=REFERENCE, seed=1)
        audio = sum(len(c.pcm) for c in [c async for c in syn])
        assert audio == 40 * 320
    finally:
        await p.aclose()
