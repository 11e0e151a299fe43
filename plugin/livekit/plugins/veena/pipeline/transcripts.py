"""Word timings for aligned transcripts: each text chunk is spoken by a known span of
audio (exact chunk boundaries from the turn); inside it, words share the span in proportion
to their character counts, a rule that keeps times monotonic and inside the audio. Tags
(``<laugh>``) are performed, not said: they are never words of a transcript."""

from __future__ import annotations

from dataclasses import dataclass

from .tags import spoken_text


@dataclass(frozen=True)
class WordTiming:
    text: str
    """The word with the whitespace that follows it (so the words join back to the text)."""
    start: float
    end: float


def word_timings(text: str, start: float, end: float) -> list[WordTiming]:
    """Spread the words of ``text`` (its tags left out) over [start, end] by character
    count."""
    words = spoken_text(text).split()
    if not words or end <= start:
        return []
    total = sum(len(w) for w in words)
    out, done = [], 0
    for word in words:
        a = start + (end - start) * done / total
        done += len(word)
        b = start + (end - start) * done / total
        out.append(WordTiming(word + " ", a, b))
    return out
