"""Numbers read as people in a locale say them: English cardinals in the international system
(thousand, million) or the Indian one (thousand, lakh, crore), and digits written with Indian
grouping (``1,50,000``, ``12,00,500``) recognised as one number.

The grammars read plain digits well; what they get wrong is the grouping (NeMo reads
``1,50,000`` as "one, fifty thousand") and, in English, lakh and crore. So grouped digits
become plain digits before a grammar sees them, and Indian English amounts are written out
here."""

from __future__ import annotations

import re
from typing import Callable

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
DIGIT_WORDS = {"en": _ONES[:10], "hi": "शून्य एक दो तीन चार पाँच छह सात आठ नौ".split(),
               "zh": list("零一二三四五六七八九")}
"""Each digit's name, for what is read digit by digit."""

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


_ORDINAL_ENDINGS = {"one": "first", "two": "second", "three": "third", "five": "fifth",
                    "eight": "eighth", "nine": "ninth", "twelve": "twelfth"}


def english_ordinal(n: int) -> str:
    """``n`` (>= 1) as an English ordinal: 1 -> first, 22 -> twenty second, 30 -> thirtieth."""
    *head, last = english_cardinal(n).split(" ")
    if last in _ORDINAL_ENDINGS:
        last = _ORDINAL_ENDINGS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return " ".join([*head, last])


def english_year(year: int) -> str:
    """A year as English speakers say it: 1943 -> nineteen forty three, 1905 -> nineteen oh
    five, 1900 -> nineteen hundred, 2005 -> two thousand five, 2026 -> twenty twenty six."""
    century, rest = divmod(year, 100)
    if not 1000 <= year <= 9999 or (century % 10 == 0 and rest < 10):
        return english_cardinal(year)
    if rest == 0:
        return f"{english_cardinal(century)} hundred"
    return f"{english_cardinal(century)} {'oh ' if rest < 10 else ''}{english_cardinal(rest)}"


MAX_DIGITS = 24
"""Longer numbers are not amounts (an id, a pasted blob): left for the grammar's digit by digit
reading, and never expanded here."""
GROUPED = re.compile(INDIAN_GROUPED.pattern + "|" + WESTERN_GROUPED.pattern)


def ungroup(text: str) -> str:
    """Grouped digits as plain digits (``1,50,000`` and ``150,000`` -> ``150000``); a comma
    that groups in neither way is left (a list, ``1,2,3``)."""
    return GROUPED.sub(lambda m: m.group(0) if len(m.group(0)) > MAX_DIGITS else
                       m.group(0).replace(",", ""), text)


ENGLISH_GROUPED = re.compile(r"(?<![\d,.$€£¥])(\d{1,2}(?:,\d{2})*,\d{3}|\d{1,3}(?:,\d{3})+)"
                             r"(?:\.(\d+))?(?![\d,]|\.\d)")
"""Grouped digits, with a decimal part or none, not after a currency symbol (the grammar's
amount)."""


SCALED = re.compile(r"(?<![\w.,$€£¥])(\d{1,3}(?:\.(\d{1,3}))?)(M|B|bn|mn|K)\b")
"""A number with a scale letter (``1.5M``, ``3B``, ``250K``; not ``4K`` video): the grammar
says "one dot five M"."""
SCALE_WORDS = {"M": "million", "mn": "million", "B": "billion", "bn": "billion",
               "K": "thousand"}


def english_numbers(text: str, indian: bool) -> str:
    """Grouped numbers in English words, Indian (``1,50,000`` -> "one lakh fifty thousand")
    or international: the English grammar knows neither the Indian grouping nor lakh and
    crore, and reads ``150000`` digit by digit; and numbers with a scale letter."""
    def spell(m: re.Match) -> str:
        if len(m.group(0)) > MAX_DIGITS:
            return m.group(0)
        words = english_cardinal(int(m.group(1).replace(",", "")), indian)
        if m.group(2):
            words += " point " + " ".join(_ONES[int(d)] for d in m.group(2))
        return words

    def scaled(m: re.Match) -> str:
        whole = m.group(1).partition(".")[0]
        if m.group(3) == "K" and len(m.group(1)) < 2:  # 4K video, a 5K run: not thousands
            return m.group(0)
        words = english_cardinal(int(whole))
        if m.group(2):
            words += " point " + " ".join(_ONES[int(d)] for d in m.group(2))
        return f"{words} {SCALE_WORDS[m.group(3)]}"

    return SCALED.sub(scaled, ENGLISH_GROUPED.sub(spell, text))


def chinese_cardinal(n: int) -> str:
    """``n`` (0 <= n < 10**16) in Chinese numerals: groups of 万 and 亿, one 零 for each gap
    (the Chinese grammar reads a minus sign or a number after 负 wrongly, so signed numbers
    and amounts are written out here)."""
    if n == 0:
        return "零"
    groups = []
    while n:
        n, group = divmod(n, 10000)
        groups.append(group)
    out = ""
    for i in reversed(range(len(groups))):
        if groups[i]:
            if out and groups[i] < 1000:
                out += "零"
            out += _chinese_below_10k(groups[i]) + ("", "万", "亿", "万亿")[i]
    return out[1:] if out.startswith("一十") else out


def _chinese_below_10k(n: int) -> str:
    out, gap = "", False
    for value, unit in ((1000, "千"), (100, "百"), (10, "十"), (1, "")):
        digit, n = divmod(n, value)
        if digit:
            out += ("零" if gap else "") + DIGIT_WORDS["zh"][digit] + unit
            gap = False
        elif out:
            gap = True
    return out


def chinese_number(digits: str) -> str:
    """Plain or grouped digits with an optional decimal part in Chinese (``1,234.5`` ->
    一千二百三十四点五)."""
    whole, _, frac = digits.replace(",", "").partition(".")
    if len(whole) > 16:
        return digits
    words = chinese_cardinal(int(whole))
    return words + ("点" + "".join(DIGIT_WORDS["zh"][int(d)] for d in frac) if frac else "")


HINDI_WHOLE = re.compile(r"(?<![\d.,:/A-Za-z-])(?!0\d)(\d{1,12})(?![\d:/A-Za-z-]|[.,]\d)(\s?%)?")
"""A whole number (or a percentage) on its own: not part of a decimal, a time, a date or a
word."""


def hindi_numbers(text: str, cardinal: Callable[[int], str]) -> str:
    """Whole numbers and percentages in Hindi words, ``cardinal`` reading each: the Hindi
    grammar fails on some sentences around them (``साल 2026 में`` comes back as written) and
    reads ``15%`` as पंद्रह%."""
    return HINDI_WHOLE.sub(lambda m: cardinal(int(m.group(1))) + (" प्रतिशत" if m.group(2)
                                                                   else ""), text)


FRACTION = re.compile(r"(?<![\d/.:-])(?:(\d{1,4}) )?(\d{1,3})/(\d{1,3})(?![\d/:-]|[.,]\d)")
"""A fraction, maybe after a whole number (``1/2``, ``2 1/2``); numeric dates are read first."""
HINDI_PARTS = {(1, 2): "आधा", (1, 4): "एक चौथाई", (3, 4): "तीन चौथाई", (1, 3): "एक तिहाई",
               (2, 3): "दो तिहाई"}
HINDI_AND_A_HALF = {1: "डेढ़", 2: "ढाई"}


def hindi_fractions(text: str, cardinal: Callable[[int], str]) -> str:
    """Fractions as Hindi speakers say them (the Hindi grammar reads ``1/2`` as "एक दोths"):
    आधा, तीन चौथाई, डेढ़, ढाई, साढ़े तीन; any other as "पाँच बटा आठ"."""
    def spell(m: re.Match) -> str:
        whole, top, bottom = m.group(1), int(m.group(2)), int(m.group(3))
        part = HINDI_PARTS.get((top, bottom), f"{cardinal(top)} बटा {cardinal(bottom)}")
        if whole is None:
            return part
        if (top, bottom) == (1, 2):
            return HINDI_AND_A_HALF.get(int(whole), f"साढ़े {cardinal(int(whole))}")
        return f"{cardinal(int(whole))} और {part}"

    return FRACTION.sub(spell, text)
