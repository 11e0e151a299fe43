"""Dates and times as the locale says them. A numeric date is read in the order the locale
writes it (``12/08/2026`` is 12 August in India, December 8 in the United States) and
rewritten with the month's name, which every grammar reads unambiguously; an impossible date
is left as written."""

from __future__ import annotations

import re
from typing import Callable

DATE = re.compile(r"(?<![\d/.-])(\d{1,2})([/.-])(\d{1,2})\2(\d{4}|\d{2})(?![\d/.-]|\.\d)")

MONTHS = {
    "en": ("January February March April May June July August September October November "
           "December").split(),
    "hi": "जनवरी फ़रवरी मार्च अप्रैल मई जून जुलाई अगस्त सितंबर अक्टूबर नवंबर दिसंबर".split(),
}

DAY_FIRST_LOCALES = ("IN", "GB", "AU", "NZ", "IE", "ZA")
"""Regions whose numeric dates put the day first (the rest: month first)."""


def day_first(locale: str) -> bool:
    return locale.split("-")[-1].upper() in DAY_FIRST_LOCALES or locale.startswith("hi")


def spell_dates(text: str, language: str, locale: str) -> str:
    """Numeric dates with the month named, in ``language`` (en, hi); others unchanged."""
    names = MONTHS.get(language)
    if names is None or not any(c.isdigit() for c in text):
        return text
    first_is_day = day_first(locale)

    def spell(m: re.Match) -> str:
        a, b, year = int(m.group(1)), int(m.group(3)), m.group(4)
        day, month = (a, b) if first_is_day else (b, a)
        if not (1 <= month <= 12 and 1 <= day <= 31):
            return m.group(0)
        if len(year) == 2:
            year = f"20{year}"
        if language == "en" and not first_is_day:
            return f"{names[month - 1]} {day}, {year}"
        return f"{day} {names[month - 1]} {year}"

    return DATE.sub(spell, text)


HINDI_TIME = re.compile(r"(?<![\d:])(\d{1,2}):(\d{2})(?![\d:])(\s*बजे)?")


def hindi_times(text: str, cardinal: Callable[[int], str]) -> str:
    """Clock times as Hindi speakers say them (``3:30 बजे`` -> साढ़े तीन बजे, ``3:15`` -> सवा
    तीन, ``3:45`` -> पौने चार, ``3:20`` -> तीन बजकर बीस मिनट), ``cardinal`` reading the
    numbers (the Hindi grammar of this version cannot read ``H:MM`` at all)."""
    def spell(m: re.Match) -> str:
        hour, minute, baje = int(m.group(1)), int(m.group(2)), m.group(3) or ""
        if hour > 24 or minute > 59:
            return m.group(0)
        if minute == 0:
            return cardinal(hour) + baje
        if minute == 15:
            return f"सवा {cardinal(hour)}" + baje
        if minute == 30:
            special = {1: "डेढ़", 2: "ढाई"}.get(hour)
            return (special or f"साढ़े {cardinal(hour)}") + baje
        if minute == 45:
            return f"पौने {cardinal(hour % 12 + 1)}" + baje
        return f"{cardinal(hour)} बजकर {cardinal(minute)} मिनट"

    return HINDI_TIME.sub(spell, text)
