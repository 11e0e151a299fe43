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


def spell_dates(text: str, language: str, locale: str,
                cardinal: Callable[[int], str] | None = None) -> str:
    """Numeric dates with the month named, in ``language`` (en, hi), where the locale puts
    the day first (the English grammar reads month-first dates itself); a Hindi year is read
    as people say years (``cardinal`` reads the numbers: 1970 -> उन्नीस सौ सत्तर)."""
    names = MONTHS.get(language)
    if names is None or not day_first(locale) or not any(c.isdigit() for c in text):
        return text

    def spell(m: re.Match) -> str:
        day, month, year = int(m.group(1)), int(m.group(3)), m.group(4)
        if not (1 <= month <= 12 and 1 <= day <= 31):
            return m.group(0)
        year_n = int(year) + (2000 if len(year) == 2 else 0)
        if language == "hi" and cardinal is not None:
            return f"{cardinal(day)} {names[month - 1]} {hindi_year(year_n, cardinal)}"
        return f"{day} {names[month - 1]} {year_n}"

    return DATE.sub(spell, text)


def hindi_year(year: int, cardinal: Callable[[int], str]) -> str:
    """A year as Hindi speakers say it: in hundreds outside 2000-2099 (उन्नीस सौ सत्तर,
    इक्कीस सौ एक), else as a number (दो हज़ार छब्बीस)."""
    if 1100 <= year < 10000 and not 2000 <= year < 2100:
        hundreds, rest = divmod(year, 100)
        return f"{cardinal(hundreds)} सौ" + (f" {cardinal(rest)}" if rest else "")
    return cardinal(year)


HINDI_TIME = re.compile(r"(?<![\d:])(\d{1,2}):(\d{2})(?::(\d{2}))?(?![\d:])(\s*बजे)?")


def hindi_times(text: str, cardinal: Callable[[int], str]) -> str:
    """Clock times as Hindi speakers say them, ``cardinal`` reading the numbers (this
    version's Hindi grammar cannot read ``H:MM`` at all): ``8:00`` -> आठ बजे, ``7:21`` -> सात
    बजकर इक्कीस मिनट, ``3:18:43`` -> ... तैंतालीस सेकंड; and before बजे the quarter hours as
    spoken: ``9:15 बजे`` -> सवा नौ बजे, ``3:30 बजे`` -> साढ़े तीन बजे (डेढ़, ढाई), ``3:45 बजे`` ->
    पौने चार बजे."""
    def spell(m: re.Match) -> str:
        hour, minute = int(m.group(1)), int(m.group(2))
        second, baje = m.group(3), m.group(4) or ""
        if hour > 24 or minute > 59 or (second is not None and int(second) > 59):
            return m.group(0)
        if second is None and minute == 0:
            return f"{cardinal(hour)} बजे"
        if second is None and baje and minute in (15, 30, 45):
            if minute == 15:
                return f"सवा {cardinal(hour)} बजे"
            if minute == 30:
                return {1: "डेढ़", 2: "ढाई"}.get(hour, f"साढ़े {cardinal(hour)}") + " बजे"
            return f"पौने {cardinal(hour % 12 + 1)} बजे"
        spoken = f"{cardinal(hour)} बजकर {cardinal(minute)} मिनट"
        if second is not None:
            spoken += f" {cardinal(int(second))} सेकंड"
        return spoken

    return HINDI_TIME.sub(spell, text)
