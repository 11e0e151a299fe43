"""Numbers that are not one quantity, read as people say them in each language: phone numbers
digit by digit, versions part by part (``3.11.12`` is "three point eleven point twelve", not a
date), ranges with "to" (``5-7``), and a minus sign as a word. The grammars read them wrongly
(a version as a date, a Chinese mobile as 138 billion, ``5-7`` as "five-seven", ``-5,000`` as
"-five thousand" once our rules have read the digits), so they are written out here before a
grammar sees them."""

from __future__ import annotations

import re
from typing import Callable

from .numbers import DIGIT_WORDS, chinese_number

Cardinal = Callable[[int], str]

VERSION = re.compile(r"(?<![A-Za-z\d.,/-])"
                     r"(?:([vV])(\d{1,4}(?:\.\d{1,4})+)|(\d{1,4}(?:\.\d{1,4}){2,}))"
                     r"(?![A-Za-z\d/-]|\.\d)")
"""``v2.4``, ``v2.4.26``, ``3.11.12``: three or more dotted parts (a numeric date with dots
has a four-digit year and is read as a date first), or two after a ``v``."""
POINT = {"en": " point ", "hi": " पॉइंट ", "zh": "点"}
VERSION_WORD = {"en": "version ", "hi": "वर्ज़न ", "zh": "版本"}

PHONE = re.compile(r"(?<![A-Za-z\d.,/()-])(\+|\(\d{2,5}\) ?)?"
                   r"(\d{2,5}(?:-\d{2,8}){1,4}(?: \d{2,8}){0,2})(?![A-Za-z\d/-]|[.,]\d)")
"""Digits in hyphenated groups (``1800-22-3344``, ``010-12345678``, ``(555) 123-4567``,
``022-2345 6789``); two groups are a phone number only after ``+`` or an area code in
brackets, from a leading zero, in the shape 3-4 or with ten digits (``5-7``, ``2024-25`` and
``2024-2025`` are not); a group after a space needs eight digits in all."""
SPACED = re.compile(r"(?<![A-Za-z\d.,/-])(\+\d{1,3} )?(\d{2,5}(?: \d{2,5}){2,4})"
                    r"(?![A-Za-z\d/-]|[.,]\d)")
"""Three or more groups of digits between spaces (``1800 22 3344``, ``+1 555 123 4567``): a
phone number where they make 10 to 15 digits (``100 200 300`` is a list)."""
MOBILE = {
    "IN": re.compile(r"(?<![\d.,])(\+91[ -]?)?([6-9]\d{4} ?\d{5})(?![\d,]|\.\d)"),
    "CN": re.compile(r"(?<![\d.,])(\+?86[ -]?)?(1[3-9]\d{9})(?![\d,]|\.\d)"),
}
"""A mobile number without hyphens, in the countries whose numbers this profile reads."""
PLUS = {"en": "plus ", "hi": "प्लस ", "zh": "加"}
GROUP_PAUSE = {"en": ", ", "hi": ", ", "zh": "，"}

RANGE = re.compile(r"(?<![A-Za-z\d.,/:-])(\d{1,4}(?:\.\d+)?)[-–]([1-9]\d{0,3}(?:\.\d+)?)"
                   r"(?![A-Za-z\d/:-]|[.,]\d)")
"""Two numbers joined by a dash (``5-7 days``, ``2024-25``, a score ``2-1``): "to" between them
(the English grammar says "five-seven", the Hindi one fails on it, the Chinese one reads a
minus). What is left after dates and phone numbers; ``2024-03`` (a month) is not a range."""
TO = {"en": " to ", "hi": " से ", "zh": "到"}

SIGN = re.compile(r"(?<![A-Za-z\d.,)\]/-])[-−](?=\d)")
"""A minus sign: before a digit, after neither a letter nor a digit (``5-7`` is a range)."""
MINUS = {"en": "minus ", "hi": "माइनस "}
SIGNED_ZH = re.compile(SIGN.pattern + r"(\d+(?:,\d{3})*(?:\.\d+)?)(?![\d,])(℃|°C)?")
"""A signed number in Chinese, with degrees Celsius after it where written (the grammar reads
``-3℃`` only as a whole)."""


def versions(text: str, language: str, cardinal: Cardinal) -> str:
    """Versions read part by part (``v2.4.26`` -> "version two point four point twenty six");
    a part with a leading zero digit by digit."""
    def spell(m: re.Match) -> str:
        parts = (m.group(2) or m.group(3)).split(".")
        words = POINT[language].join(_digits(p, language) if p.startswith("0") and len(p) > 1
                                     else cardinal(int(p)) for p in parts)
        return (VERSION_WORD[language] if m.group(1) else "") + words

    return VERSION.sub(spell, text)


def phones(text: str, language: str, country: str) -> str:
    """Phone numbers digit by digit, a pause between their groups (Chinese reads 1 as 幺 in
    them, as people do)."""
    def spell(m: re.Match, hyphens: bool) -> str:
        groups = re.split(r"[ -]", m.group(2))
        digits = sum(map(len, groups))
        if hyphens and not (
                m.group(1) or groups[0].startswith("0") or digits >= 10
                or [len(g) for g in groups] == [3, 4]
                or len(groups) >= 3 and (" " not in m.group(2) or digits >= 8)):
            return m.group(0)
        prefix = m.group(1) or ""
        code = prefix.strip(" -+()")  # a country or area code, where the pattern has one
        lead = (PLUS[language] if "+" in prefix else "") + (
            _digits(code, language, True) + GROUP_PAUSE[language] if code else "")
        return lead + GROUP_PAUSE[language].join(_digits(g, language, True) for g in groups)

    text = PHONE.sub(lambda m: spell(m, True), text)
    text = SPACED.sub(lambda m: spell(m, False) if 10 <= len(re.sub(r"\D", "", m.group(2))) <= 15
                      else m.group(0), text)
    mobile = MOBILE.get(country)
    return mobile.sub(lambda m: spell(m, False), text) if mobile else text


def _digits(digits: str, language: str, phone: bool = False) -> str:
    names = DIGIT_WORDS[language]
    if language == "zh":
        if not phone:
            return "".join(names[int(d)] for d in digits)
        return "".join("幺" if d == "1" else names[int(d)] for d in digits)
    return " ".join(names[int(d)] for d in digits)


def signs(text: str, language: str) -> str:
    """A minus sign before a number as the word (``-5,000`` -> "minus 5,000")."""
    if language == "zh":  # the Chinese grammar garbles 负5000: written out here
        return SIGNED_ZH.sub(lambda m: "负" + chinese_number(m.group(1))
                             + ("摄氏度" if m.group(2) else ""), text)
    return SIGN.sub(MINUS[language], text)


def ranges(text: str, language: str) -> str:
    """``5-7`` as "5 to 7" in ``language`` (its numbers are read after)."""
    return RANGE.sub(lambda m: m.group(1) + TO[language] + m.group(2), text)
