"""Expressive tags in text (``<laugh>``): what counts as one, and which reach the model.

A tag is ``<`` + a name + ``>`` where the name is a letter or ``_`` followed by up to 63
letters, digits and ``_`` (``<laugh>``, ``<laugh_harder>``, ``<custom_token_5>``), optionally
with a leading ``/`` or trailing ``/`` (``</laugh>``, ``<laugh/>``); or a special-token form
``<|...|>`` with at most 64 characters and no whitespace inside (``<|eot_id|>``). Nothing
else is a tag: ``a < b > c``, ``x<y`` and ``<a b>`` stay as text. A tag is *known* when it is
the plain ``<name>`` form and its name matches one of the profile's tags ignoring case; it is
written back in the profile's spelling. Every other tag is removed, so the model never reads
``<happy>`` aloud and user text cannot inject a special token. Pure and synchronous.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Callable, Iterable, Sequence

TAG_PATTERN = r"<(?:\|[^\s<>|]{0,64}\|>|/?[A-Za-z_][A-Za-z0-9_]{0,63}/?>)"
"""Anything the model might read as one token and that must never be split or spoken. At
most 64 characters inside (every special token is far shorter): a streaming reader never
waits longer than that for a tag to close."""
_TAG = re.compile(TAG_PATTERN)
_PLAIN = re.compile(r"<([A-Za-z_][A-Za-z0-9_]{0,63})>")
_NO_SPACE_BEFORE = ",.;:!?)]}…।॥"
_PARTIAL = re.compile(r"<(?:\|[^\s<>|]{0,64}\|?|/?(?:[A-Za-z_][A-Za-z0-9_]{0,63}/?)?)?\Z")


def tag_instructions(tags: Sequence[str]) -> str:
    """A paragraph for an agent's LLM system prompt, so the LLM writes only tags this voice
    performs (any other tag would be removed before synthesis, wasting the LLM's intent)."""
    if not tags:
        return ""
    listed = ", ".join(f"<{t}>" for t in tags)
    return (
        "You may add expressive tags to your replies so the voice performs them. The only "
        f"tags available are: {listed}. Put a tag right before the words it colours, or "
        f"exactly where the sound happens (for example: \"Oh really? <{tags[0]}> I did not "
        "know that.\"). Use them sparingly, at most one or two per reply and only where they "
        "fit. Never invent other tags, never nest tags, never use closing tags, and never "
        "explain or mention them: they are performed, not read aloud."
    )


def find_tags(text: str) -> list[re.Match[str]]:
    """Every tag in ``text``, known or not, in order."""
    return list(_TAG.finditer(text))


def is_partial_tag_at(text: str, i: int) -> bool:
    """Whether ``text[i:]`` is an unfinished tag running to the end of ``text`` (``"Hello
    <lau"`` at 6), so a streaming reader waits for its end (no copy, and at most a tag's
    length is read)."""
    return _PARTIAL.match(text, i) is not None


def _rewrite(text: str, keep: Callable[[str], str | None]) -> tuple[str, list[str]]:
    """``text`` with each tag replaced by ``keep(tag)``, or removed where that is None, until
    none is removed: what stood around a removed tag can close into a new one (``<<x>|eot_id|>``
    is ``<|eot_id|>`` once ``<x>`` is gone). Returns the text and the removed tags."""
    removed: list[str] = []
    while True:
        text, gone = _rewrite_once(text, keep)
        if not gone:
            return text, removed
        removed += gone


def _rewrite_once(text: str, keep: Callable[[str], str | None]) -> tuple[str, list[str]]:
    """One pass of ``_rewrite``: a removed tag leaves one space where whitespace stood
    around it or where it stood between two words (``line<br>next``: an LLM's line break),
    none at the text's edges or before punctuation."""
    acc, removed = "", []
    pending = gap = False
    pos = 0
    for m in [*_TAG.finditer(text), None]:
        piece = text[pos:m.start()] if m is not None else text[pos:]
        if pending:
            gap = gap or piece[:1].isspace() or (_wordish(acc[-1:]) and _wordish(piece[:1]))
            piece = piece.lstrip()
        if piece:
            if pending and gap and acc and piece[0] not in _NO_SPACE_BEFORE:
                acc += " "
            acc += piece
            pending = gap = False
        if m is None:
            break
        pos = m.end()
        rep = keep(m.group())
        if rep is None:
            removed.append(m.group())
            gap = gap or acc[-1:].isspace()
            acc = acc.rstrip()
            pending = True
        else:
            if pending and gap and acc:
                acc += " "
            acc += rep
            pending = gap = False
    return acc, removed


def _wordish(ch: str) -> bool:
    """A letter, mark or digit of a script that puts spaces between words (a vowel sign
    too: ``हाँ``; not Chinese or Japanese, whose words meet without one)."""
    return (bool(ch) and unicodedata.category(ch)[0] in "LMN"
            and unicodedata.east_asian_width(ch) not in "WF")


def strip_unknown_tags(text: str, known: Iterable[str]) -> tuple[str, list[str]]:
    """``text`` with every tag the profile does not perform removed, and the removed tags
    (as written). Known tags stay, in the profile's spelling."""
    names = {k.lower(): k for k in known}

    def keep(tag: str) -> str | None:
        plain = _PLAIN.fullmatch(tag)
        name = names.get(plain.group(1).lower()) if plain else None
        return f"<{name}>" if name is not None else None

    return _rewrite(text, keep)


def spoken_text(text: str) -> str:
    """The words of ``text`` without any tag, for transcripts (a tag is performed, not said)."""
    return _rewrite(text, lambda tag: None)[0]
