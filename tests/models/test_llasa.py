"""Llasa is a profile of the NeuCodec family, nothing more: the tiny Llasa-layout model
(a Llama, a Llama-3-style chat template, 65,536 ``<|s_N|>`` tokens, a tiny XCodec2 at 16 kHz,
hop 320) runs through the same family, the prompt through the tokenizer's own chat template.
The prompt itself is read from Llasa's model card, not checked against its code."""

"""Llasa, a profile of the NeuCodec family: its prompt equals the one the model card's
cloning example builds (golden ids from tests/golden/make_llasa_prompt_golden.py, on the tiny
Llasa tokenizer with Llama-3.2-Instruct's chat template, on a fixed day), and it speaks 16 kHz
through the same family."""

import datetime
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from livekit.plugins.veena.models.families import family_for
from livekit.plugins.veena.models.profiles import LLASA
from livekit.plugins.veena.models.tiny_model import make_tiny_model
from livekit.plugins.veena.pipeline.guards import GuardOptions
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions
from tests.fakes import ScriptedEngine
from tests.golden.make_llasa_prompt_golden import vocab_hash

REFERENCE = tuple(range(100, 160))
GOLDEN_DIR = Path(__file__).parents[1] / "golden" / "llasa"
GOLDEN = json.loads((GOLDEN_DIR / "prompt_ids.json").read_text())


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
    # the transcript and the text joined with nothing between them, as the model card does
    assert head == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
                    "Convert the text to speech:<|TEXT_UNDERSTANDING_START|>The clip says this."
                    "Hello there.<|TEXT_UNDERSTANDING_END|><|eot_id|><|start_header_id|>"
                    "assistant<|end_header_id|>\n\n<|SPEECH_GENERATION_START|>")


@pytest.fixture
def llama32_tokenizer(tokenizer, monkeypatch):
    """The tiny Llasa tokenizer with Llama-3.2-Instruct's chat template (the one Llasa's
    tokenizer inherits), its clock frozen on the golden's day (the template writes it)."""
    from transformers.utils import chat_template_utils

    day = GOLDEN["day"]

    class _Day(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(*day, 12, 0, 0)

    monkeypatch.setattr(chat_template_utils, "datetime", _Day)
    template = (GOLDEN_DIR / "chat_template.jinja").read_text()
    assert hashlib.sha256(template.encode()).hexdigest() == GOLDEN["chat_template_sha256"]
    monkeypatch.setattr(tokenizer, "chat_template", template)
    return tokenizer


def test_the_golden_was_made_on_this_tokenizer(tokenizer):
    assert vocab_hash(tokenizer.get_vocab()) == GOLDEN["vocab_sha256"]
    # Llasa's ids: its control tokens right before <|s_0|> (the real ones: 128256..128263)
    assert (tokenizer.convert_tokens_to_ids("<|s_0|>")
            - tokenizer.convert_tokens_to_ids("<|TEXT_GENERATION_START|>")) == 8


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: (c["prompt_text"] or "none")[:12])
def test_prompt_equals_the_model_cards_token_for_token(llama32_tokenizer, case):
    """The card's lines (make_llasa_prompt_golden.py, transformers 4.48.3) and ours
    (the project's transformers) on the same tokenizer, text, transcript and codes."""
    ids = family_for(LLASA).prompt(llama32_tokenizer, case["target_text"],
                                   case["prompt_text"] or "", tuple(case["codes"]))
    assert ids == case["ids"]


def test_the_golden_prompt_opens_with_llama32s_dated_system_header(llama32_tokenizer):
    case = GOLDEN["cases"][0]
    ids = family_for(LLASA).prompt(llama32_tokenizer, case["target_text"], case["prompt_text"],
                                   tuple(case["codes"]))
    head = llama32_tokenizer.decode(ids[:len(ids) - len(case["codes"])])
    assert head == GOLDEN["rendered_head_case0"]
    assert head.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                           "Cutting Knowledge Date: December 2023\nToday Date: 07 Dec 2026\n\n")


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


def test_voice_clone_encodes_the_clip_with_xcodec2s_encoder(tiny_llasa_dir, tmp_path):
    """``veena-tts voice clone`` for a Llasa model: XCodec2's encoder (the tiny model's random
    weights, the real loading code; equal to ``xcodec2``'s own in
    tests/codecs/test_xcodec2_encoder_golden.py) writes the clip's codes and its transcript."""
    import io
    import wave

    from livekit.plugins.veena import cli
    from livekit.plugins.veena.models.loading import load_pipeline, speaker_encoder
    from livekit.plugins.veena.voices.reference_clip import load_reference_clip

    t = np.arange(2 * 16000) / 16000
    x = 0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((x * 32767).astype(np.int16).tobytes())
    clip, out = tmp_path / "clip.wav", tmp_path / "me.json"
    clip.write_bytes(buf.getvalue())
    assert cli.main(["voice", "clone", str(clip), "--text", "The clip says this.",
                     "--model", tiny_llasa_dir, "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["profile"] == "llasa" and data["voice"] == "The clip says this."
    encoder = speaker_encoder(load_pipeline(tiny_llasa_dir))
    assert encoder.variant == "xcodec2"
    want = encoder.encode(load_reference_clip(clip.read_bytes(), 16000).samples)
    assert data["speaker_globals"] == want and len(want) == 101  # 2 s + a hop, at 50 Hz
