"""Word timings for aligned transcripts: each text chunk is spoken by a known span of
audio (exact chunk boundaries from the turn); inside it, words share the span in proportion
to their character counts as spoken (a normalised ``₹1,50,000`` takes the time of "one lakh
fifty thousand rupees", shown as written), a rule that keeps times monotonic and inside the
audio. Tags (``<laugh>``) are performed, not said: they are never words of a transcript."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .tags import spoken_text


@dataclass(frozen=True)
class WordTiming:
    text: str
    """The word with the whitespace that follows it (so the words join back to the text)."""
    start: float
    end: float


def word_timings(text: str, start: float, end: float,
                 spoken_lengths: Sequence[int] | None = None) -> list[WordTiming]:
    """Spread the words of ``text`` (its tags left out) over [start, end] by character
    count, or by ``spoken_lengths`` (per word: the characters it was read as) where given."""
    words = spoken_text(text).split()
    if not words or end <= start:
        return []
    lengths = (list(spoken_lengths) if spoken_lengths is not None
               and len(spoken_lengths) == len(words) else [len(w) for w in words])
    total = sum(lengths) or 1
    out, done = [], 0
    for word, length in zip(words, lengths):
        a = start + (end - start) * done / total
        done += length
        b = start + (end - start) * done / total
        out.append(WordTiming(word + " ", a, b))
    return out
