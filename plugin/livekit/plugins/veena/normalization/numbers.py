"""Numbers read as people in a locale say them: English cardinals in the international system
(thousand, million) or the Indian one (thousand, lakh, crore), and digits written with Indian
grouping (``1,50,000``, ``12,00,500``) recognised as one number.

The grammars read plain digits well; what they get wrong is the grouping (NeMo reads
``1,50,000`` as "one, fifty thousand") and, in English, lakh and crore. So grouped digits
become plain digits before a grammar sees them, and Indian English amounts are written out
here."""

from __future__ import annotations

import re

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()

INDIAN_GROUPED = re.compile(r"(?<![\d,.])\d{1,2}(?:,\d{2})*,\d{3}(?![\d,]|\.\d{3})")
"""Digits in Indian grouping: the last three together, then pairs (``1,50,000``)."""
WESTERN_GROUPED = re.compile(r"(?<![\d,.])\d{1,3}(?:,\d{3})+(?![\d,]|\.\d{3})")
"""Digits in groups of three (``150,000``)."""


def _below_hundred(n: int) -> str:
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens] + ("" if ones == 0 else f" {_ONES[ones]}")


def _below_thousand(n: int) -> str:
    hundreds, rest = divmod(n, 100)
    words = [f"{_ONES[hundreds]} hundred"] if hundreds else []
    if rest or not hundreds:
        words.append(_below_hundred(rest))
    return " ".join(words)


def english_cardinal(n: int, indian: bool = False) -> str:
    """``n`` (>= 0) in English words; ``indian``: thousand, lakh, crore (crores of crores
    above that), else thousand, million, billion, trillion."""
    if n < 0:
        raise ValueError("a cardinal is not negative")
    if n < 1000:
        return _below_thousand(n)
    if indian:
        crores, rest = divmod(n, 10**7)
        lakhs, rest = divmod(rest, 10**5)
        thousands, rest = divmod(rest, 1000)
        parts = []
        if crores:
            parts.append(f"{english_cardinal(crores, True)} crore")
        for count, unit in ((lakhs, "lakh"), (thousands, "thousand")):
            if count:
                parts.append(f"{_below_hundred(count)} {unit}")
        if rest:
            parts.append(_below_thousand(rest))
        return " ".join(parts)
    parts = []
    for power, unit in ((12, "trillion"), (9, "billion"), (6, "million"), (3, "thousand")):
        count, n = divmod(n, 10**power)
        if count:
            parts.append(f"{english_cardinal(count)} {unit}")
    if n:
        parts.append(_below_thousand(n))
    return " ".join(parts)


MAX_DIGITS = 24
"""Longer numbers are not amounts (an id, a pasted blob): left for the grammar's digit by digit
reading, and never expanded here."""
GROUPED = re.compile(INDIAN_GROUPED.pattern + "|" + WESTERN_GROUPED.pattern)


def ungroup(text: str) -> str:
    """Grouped digits as plain digits (``1,50,000`` and ``150,000`` -> ``150000``); a comma
    that groups in neither way is left (a list, ``1,2,3``)."""
    return GROUPED.sub(lambda m: m.group(0) if len(m.group(0)) > MAX_DIGITS else
                       m.group(0).replace(",", ""), text)


def indian_english_numbers(text: str) -> str:
    """Grouped whole numbers in Indian English words (``1,50,000`` -> "one lakh fifty
    thousand"): the English grammar knows neither the grouping nor lakh and crore."""
    return GROUPED.sub(lambda m: m.group(0) if len(m.group(0)) > MAX_DIGITS else
                       english_cardinal(int(m.group(0).replace(",", "")), indian=True), text)
