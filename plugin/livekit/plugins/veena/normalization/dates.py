"""Dates and times as the locale says them. A numeric date is read in the order the locale
writes it (``12/08/2026`` is 12 August in India, December 8 in the United States) and
rewritten with the month's name, which every grammar reads unambiguously; an impossible date
is left as written."""

from __future__ import annotations

import datetime
import re
from typing import Callable

from .numbers import english_ordinal, english_year

DATE = re.compile(r"(?<![A-Za-z\d/.-])(\d{1,2})([/.-])(\d{1,2})\2(\d{4}|\d{2})"
                  r"(?![A-Za-z\d/]|[.-]\d)")
"""Day, month and year in the locale's order (a two-digit year never after dots: ``3.11.12``
is a version). A full stop after it ends the sentence."""
YMD = re.compile(r"(?<![A-Za-z\d/.-])(\d{4})([/.-])(\d{1,2})\2(\d{1,2})(?![A-Za-z\d/]|[.-]\d)")
"""Year first (ISO ``2024-03-15``, Chinese ``2019/2/10``): the same in every locale."""

MONTHS = {
    "en": ("January February March April May June July August September October November "
           "December").split(),
    "hi": "जनवरी फ़रवरी मार्च अप्रैल मई जून जुलाई अगस्त सितंबर अक्टूबर नवंबर दिसंबर".split(),
}

DAY_FIRST_LOCALES = ("IN", "GB", "AU", "NZ", "IE", "ZA")
"""Regions whose numeric dates put the day first (the rest: month first)."""


def day_first(locale: str) -> bool:
    return locale.split("-")[-1].upper() in DAY_FIRST_LOCALES or locale.startswith("hi")


def _date(m: re.Match, locale: str) -> tuple[int, int, int] | None:
    """(year, month, day) of a DATE or YMD match, None where no such day exists."""
    if m.re is YMD:
        year, month, day = int(m.group(1)), int(m.group(3)), int(m.group(4))
    else:
        first, second, written = int(m.group(1)), int(m.group(3)), m.group(4)
        day, month = (first, second) if day_first(locale) else (second, first)
        year = int(written) + (2000 if len(written) == 2 else 0)
    try:
        datetime.date(year, month, day)
    except ValueError:
        return None
    return year, month, day


def _version(m: re.Match) -> bool:
    """Dots and a two-digit last part (``3.11.12``): a version, not a date."""
    return m.re is DATE and m.group(2) == "." and len(m.group(4)) < 4


def impossible_dates(text: str, locale: str) -> list[tuple[int, int]]:
    """Spans of numeric dates no calendar has (``31/02/2026``), to be left as written."""
    return sorted(m.span() for pattern in (DATE, YMD) for m in pattern.finditer(text)
                  if not _version(m) and _date(m, locale) is None)


def spell_dates(text: str, language: str, locale: str,
                cardinal: Callable[[int], str] | None = None) -> str:
    """Numeric dates as ``language`` says them in the locale's order: English in words (no
    grammar needed after it), Hindi with ``cardinal`` reading the numbers and the year as
    people say years (1970 -> उन्नीस सौ सत्तर), Chinese as 2026年5月9日 for its grammar. An
    impossible date is left as written."""
    if not any(c.isdigit() for c in text):
        return text

    def spell(m: re.Match) -> str:
        found = None if _version(m) else _date(m, locale)
        if found is None:
            return m.group(0)
        year, month, day = found
        if language == "zh":
            return f"{year}年{month}月{day}日"
        names = MONTHS["hi" if language == "hi" else "en"]
        if language == "hi":
            if cardinal is None:
                return m.group(0)
            return f"{cardinal(day)} {names[month - 1]} {hindi_year(year, cardinal)}"
        month_name = names[month - 1].lower()  # (as the English grammar writes months)
        if day_first(locale):
            return f"the {english_ordinal(day)} of {month_name} {english_year(year)}"
        return f"{month_name} {english_ordinal(day)} {english_year(year)}"

    return YMD.sub(spell, DATE.sub(spell, text))


def hindi_year(year: int, cardinal: Callable[[int], str]) -> str:
    """A year as Hindi speakers say it: in hundreds outside 2000-2099 (उन्नीस सौ सत्तर,
    इक्कीस सौ एक), else as a number (दो हज़ार छब्बीस)."""
    if 1100 <= year < 10000 and not 2000 <= year < 2100:
        hundreds, rest = divmod(year, 100)
        return f"{cardinal(hundreds)} सौ" + (f" {cardinal(rest)}" if rest else "")
    return cardinal(year)


HINDI_YEAR = re.compile(r"((?:" + "|".join(MONTHS["hi"]) + r"|साल|सन्|सन|वर्ष)\s)(\d{4})(?!\d)")
"""A year written after a Hindi month or the word for year (``15 अगस्त 1947``, ``सन् 1947``)."""


def hindi_years(text: str, cardinal: Callable[[int], str]) -> str:
    """Years as years after a month or साल (1947 -> उन्नीस सौ सैंतालीस, not a number)."""
    return HINDI_YEAR.sub(lambda m: m.group(1) + hindi_year(int(m.group(2)), cardinal), text)


HINDI_TIME = re.compile(r"(?<![\d:.])(\d{1,2})(?::|\.(?=\d{2}\s*बजे))(\d{2})(?::(\d{2}))?(?![\d:])"
                        r"(\s*बजे)?")
"""``H:MM`` (and ``H.MM`` before बजे, as Indian text often writes it), seconds optional."""


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
