"""A text split into runs by writing system, so each run is read by its language's grammar:
Devanagari by the Hindi one, Latin by the English one, Han by the Chinese one (Hinglish mixes
the first two in one sentence).

Digits, symbols and spaces belong to no script: they join the run after them (``500 रुपये``
is Hindi, ``₹500 only`` English), or, at the end of the text, the run before. So do the Latin
letters that belong to a number (``Rs.`` and ``INR`` before it, ``lacs`` and ``Cr`` after it,
the ``v`` of ``v2.4``): ``Rs. 500/- दीजिए`` is one Hindi amount."""

from __future__ import annotations

import re
import unicodedata

SCRIPT_LANGUAGES = {"Devanagari": "hi", "Latin": "en", "Han": "zh"}


def script_of(char: str) -> str | None:
    """The writing system of a letter (None: a digit, a symbol, a space, punctuation)."""
    if "\u0900" <= char <= "\u097f" or "\ua8e0" <= char <= "\ua8ff":
        return "Devanagari"
    if "\u4e00" <= char <= "\u9fff" or "\u3400" <= char <= "\u4dbf":
        return "Han"
    if char.isalpha():
        name = unicodedata.name(char, "")
        return "Latin" if name.startswith("LATIN") else name.split(" ")[0] or None
    return None


NUMBER_LETTERS = re.compile(
    r"(?i:(?<![A-Za-z])(?:Rs\.?|INR|USD|US(?=\$)|EUR|GBP)(?=\s?[\d$])|(?<![A-Za-z])v(?=\d+\.\d))"
    r"|(?<=\d)\s?(?i:lakhs?|lacs?|crores?|crs?)\b"
    r"|(?<=\d)(?:kg|km|cm|mm|ml|mg|g|l)\b")
"""Latin letters that are part of a number: a currency code before it, a scale or a unit
after it (``5kg`` in Chinese is 五千克)."""


def runs_by_script(text: str) -> list[tuple[str | None, str]]:
    """``text`` as consecutive (script, run) pairs whose runs join back to ``text``."""
    runs: list[list] = []
    pending = ""  # characters of no script, waiting for the next letter
    neutral = {i for m in NUMBER_LETTERS.finditer(text) for i in range(*m.span())}
    for at, char in enumerate(text):
        script = None if at in neutral else script_of(char)
        if script is None:
            pending += char
        elif runs and runs[-1][0] == script:
            runs[-1][1] += pending + char
            pending = ""
        else:
            runs.append([script, pending + char])
            pending = ""
    if pending:
        if runs:
            runs[-1][1] += pending
        else:
            runs.append([None, pending])
    return [(s, t) for s, t in runs]
