"""Text chunker: fast first chunk, sentence chunks, Indic ends, no false sentence ends."""

import pytest

from livekit.plugins.veena.pipeline.chunking import (
    ChunkerOptions,
    TextChunker,
    chunk_text,
)


def _stream(text, opts=ChunkerOptions(), step=3):
    c = TextChunker(opts)
    out = []
    for i in range(0, len(text), step):
        out += c.push(text[i:i + step])
    return out + c.flush()


def test_first_chunk_is_a_short_clause_then_sentences():
    text = ("Well, let me see, that depends on a few things. The answer depends on the weather. "
            "If it rains we stay in. Otherwise we go out and walk along the river.")
    chunks = _stream(text)
    assert chunks == ["Well, let me see,",
                      "that depends on a few things. The answer depends on the weather.",
                      "If it rains we stay in. Otherwise we go out and walk along the river."]


def test_first_chunk_emitted_before_input_ends():
    c = TextChunker()
    assert c.push("Hello there, my ") == ["Hello there,"]


def test_hindi_danda_and_double_danda():
    text = "नमस्ते, आप कैसे हैं। मैं बहुत अच्छा हूँ और आज मौसम भी सुहावना है॥ धन्यवाद।"
    chunks = _stream(text, ChunkerOptions(first_min_chars=12, min_chars=10))
    assert chunks == ["नमस्ते, आप कैसे हैं।", "मैं बहुत अच्छा हूँ और आज मौसम भी सुहावना है॥", "धन्यवाद।"]


@pytest.mark.parametrize("text", [
    "The value of pi is 3.14159 and that is enough precision for us today.",
    "Please ask Dr. Rao or Mr. Smith about it before we continue with this.",
    "Visit example.com/docs?a=1 or mail help@example.org for more information now.",
])
def test_no_false_sentence_ends(text):
    chunks = _stream(text, ChunkerOptions(first_min_chars=200, first_max_chars=200, min_chars=1))
    assert chunks == [text]


def test_question_and_exclamation_end_sentences():
    chunks = _stream("Is it ready? Yes! It is.", ChunkerOptions(first_min_chars=1, min_chars=1))
    assert chunks == ["Is it ready?", "Yes!", "It is."]


def test_bounded_chunk_length():
    text = "word " * 200
    opts = ChunkerOptions(max_chars=50, first_max_chars=30)
    chunks = _stream(text, opts)
    assert all(len(c) <= 50 for c in chunks)
    assert " ".join(chunks).split() == text.split()
    assert chunk_text("x" * 120, ChunkerOptions(max_chars=50, first_max_chars=50)) == ["x" * 50] * 2 + ["x" * 20]


def test_invalid_options():
    with pytest.raises(ValueError):
        ChunkerOptions(first_min_chars=100, first_max_chars=10).validate()
