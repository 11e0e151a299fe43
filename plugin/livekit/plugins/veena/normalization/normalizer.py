"""The normalisation stage: a chunk's text as the model must read it (numbers, money, dates,
times, units, abbreviations spelled out), in each run's own language.

Order: the user's pronunciations first (whole words, outside tags), then, only where the
chunk has something to normalise (a digit, a currency or unit symbol, a known abbreviation),
each run of one script in its language: the project's own rules for what the grammars get
wrong (amounts, dates in the locale's order, versions, phone numbers, ranges, signs, grouped
numbers, Hindi numbers and times), then that language's grammar on the words around whatever
is left. Tags (``<laugh>``) are never touched. A chunk with nothing to normalise costs one
regular-expression search; one our rules read entirely asks no grammar."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping

from . import grammars
from .dates import hindi_times, hindi_years, impossible_dates, spell_dates
from .money import chinese_money, english_money, hindi_money, money_ranges
from .numbers import (
    chinese_cardinal,
    english_cardinal,
    english_numbers,
    hindi_fractions,
    hindi_numbers,
    ungroup,
)
from .scripts import SCRIPT_LANGUAGES, runs_by_script
from .sequences import phones, ranges, signs, versions

logger = logging.getLogger(__name__)

MODES = ("auto", "off")

TRIGGER = re.compile(
    r"[\d₹$€£¥%°&@#+=]|\b(?:Dr|Mr|Mrs|Ms|Prof|Rs|St|Jr|Sr|vs|etc|No|approx|e\.g|i\.e)\.?(?=\s)"
    r"|\b(?:km|kg|cm|mm|ml|mg|hrs?|min|sec|AM|PM|am|pm|INR|USD)\b")
"""Something a grammar may change. Its absence skips the grammars entirely."""
TAG = re.compile(r"(<[^<>\n]{1,64}>)")


@dataclass(frozen=True)
class NormalizationOptions:
    mode: str = "auto"
    """``auto``: on where anything needs it (the grammars where installed, the project's own
    rules always); ``off``: the text as written."""
    locale: str | None = None
    """Date order and digit grouping (``en-IN``, ``hi-IN``, ``en-US``, ``zh-CN``); None: the
    profile's."""
    pronunciations: Mapping[str, str] = field(default_factory=dict)
    """Whole words replaced before anything else (``{"SQL": "sequel"}``): a key matches as
    written, except an all-lowercase key, which matches in any case."""


def check_pronunciations(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ValueError("pronunciations must be a mapping of word to spoken form")
    out: dict[str, str] = {}
    for key, spoken in value.items():
        if not (isinstance(key, str) and isinstance(spoken, str) and key.strip()
                and len(key) <= 64 and len(spoken) <= 256 and "<" not in spoken + key):
            raise ValueError(f"pronunciation {key!r}: a word (1-64 characters) and its "
                             "spoken form (at most 256), neither with '<'")
        out[key.strip()] = spoken
    if len(out) > 10000:
        raise ValueError("at most 10000 pronunciations")
    return out


def check_mode(value: object) -> str:
    if value not in MODES:
        raise ValueError(f"text_normalization must be one of {MODES}, got {value!r}")
    return value  # type: ignore[return-value]


class TextNormalizer:
    """One profile's normaliser: its languages and locale, with the user's pronunciations. A
    run of no known script (``$1,234.56`` alone) is read in the locale's language where the
    profile speaks it (English in ``en-IN``), else in the profile's first."""

    def __init__(self, languages: tuple[str, ...], locale: str,
                 pronunciations: Mapping[str, str] | None = None) -> None:
        self.languages = languages
        self.locale = locale
        self.indian = locale.endswith("-IN") or locale.startswith("hi")
        self.country = locale.split("-")[-1].upper() if "-" in locale else "IN" * self.indian
        spoken = locale.split("-")[0].lower()
        self.default_language = spoken if spoken in languages else languages[0]
        self._words = self._pattern(pronunciations or {})
        self._spoken = {k.lower() if k.islower() else k: v
                        for k, v in (pronunciations or {}).items()}

    @staticmethod
    def _pattern(pronunciations: Mapping[str, str]) -> re.Pattern | None:
        if not pronunciations:
            return None
        keys = sorted(pronunciations, key=len, reverse=True)  # the longest match first
        alternatives = "|".join(("(?i:" + re.escape(k) + ")") if k.islower() else re.escape(k)
                                for k in keys)
        return re.compile(r"(?<!\w)(?:" + alternatives + r")(?!\w)")

    def needs(self, text: str) -> bool:
        """Whether ``normalize`` could change ``text`` (microseconds: one search each)."""
        return (TRIGGER.search(text) is not None
                or (self._words is not None and self._words.search(text) is not None))

    def normalize(self, text: str) -> str:
        """``text`` as the model must read it (synchronous; grammars may take tens of ms)."""
        if self._words is None and TRIGGER.search(text) is None:
            return text  # (microseconds: no split, no grammar)
        parts = TAG.split(text)  # odd indexes: tags, as written (pronunciations included)
        if self._words is not None:
            parts = [p if i % 2 else self._words.sub(self._say, p) for i, p in enumerate(parts)]
        if TRIGGER.search(text) is None:
            return "".join(parts)
        return "".join(p if i % 2 or TRIGGER.search(p) is None else self._normalize_untagged(p)
                       for i, p in enumerate(parts))

    def _say(self, m: re.Match) -> str:
        word = m.group(0)
        return self._spoken.get(word, self._spoken.get(word.lower(), word))

    def spoken_lengths(self, words: list[str]) -> list[int]:
        """Per word, the characters it is read as (a transcript's timing weights)."""
        return [len(self.normalize(w)) if self.needs(w) else len(w) for w in words]

    def _normalize_untagged(self, text: str) -> str:
        out = []
        for script, run in runs_by_script(text):
            language = SCRIPT_LANGUAGES.get(script or "", self.default_language)
            if language not in self.languages:
                language = self.default_language
            out.append(self._run(run, language) if TRIGGER.search(run) else run)
        return "".join(out)

    def _run(self, text: str, language: str) -> str:
        """One run in ``language``; an impossible date in it (``31/02/2026``) as written."""
        out, at = [], 0
        for begin, end in impossible_dates(text, self.locale):
            if begin >= at:
                out += [self._spoken_run(text[at:begin], language), text[begin:end]]
                at = end
        return "".join(out) + self._spoken_run(text[at:], language)

    def _spoken_run(self, text: str, language: str) -> str:
        """Our rules in order (each reads what the next would misread: an amount before its
        digits, a date before a range, a phone number before a sign), then the grammar."""
        lead = text[:len(text) - len(text.lstrip())]
        trail = text[len(text.rstrip()):]
        body = text.strip()
        if not body or TRIGGER.search(body) is None:
            return text
        # past the grammar's bound, no rule asks it either (a Hindi number is read by it)
        cardinal = self._cardinal(language) if len(body) <= MAX_GRAMMAR_CHARS else None
        body = money_ranges(body, language)
        if language == "en":
            body = english_money(body, self.indian)
        elif language == "hi" and cardinal is not None:
            body = hindi_money(body, cardinal)
        elif language == "zh":
            body = chinese_money(body)
        body = spell_dates(body, language, self.locale, cardinal)
        if cardinal is not None:
            body = versions(body, language, cardinal)
        body = signs(ranges(phones(body, language, self.country), language), language)
        if language == "en":
            body = english_numbers(body, self.indian)
        if language == "hi" and cardinal is not None:
            body = hindi_times(hindi_years(body, cardinal), cardinal)
            body = hindi_numbers(hindi_fractions(body, cardinal), cardinal)
        body = ungroup(body)
        if grammars.available() and TRIGGER.search(body) and len(body) <= MAX_GRAMMAR_CHARS:
            body = _by_grammar(body, language)
        return lead + body + trail

    def _cardinal(self, language: str) -> Callable[[int], str] | None:
        """Whole numbers in ``language``'s words (Hindi: its grammar's, where installed)."""
        if language == "en":
            return lambda n: english_cardinal(n, self.indian)
        if language == "zh":
            return chinese_cardinal
        if language == "hi" and grammars.available():
            return hindi_cardinal
        return None


@functools.lru_cache(maxsize=4096)
def hindi_cardinal(n: int) -> str:
    """``n`` in Hindi words, by the Hindi grammar (which reads whole numbers right), kept:
    the same small numbers come back in every chunk (``cache_clear()`` times a cold read)."""
    return grammars.grammar("hi").normalize(str(n)).strip()


GRAMMAR_CONTEXT = 3
"""Words either side of one the grammar must read, given to it with that word: enough for a
time's AM, a unit, a month beside a day (the grammar's time grows with its input, and what our
rules read leaves most of a sentence as words)."""


def _by_grammar(text: str, language: str) -> str:
    """``text`` with each stretch of words around something left to read read by
    ``language``'s grammar, the rest as it is."""
    words = text.split(" ")
    wanted = [i for i, w in enumerate(words) if TRIGGER.search(w + " ")]
    spans: list[list[int]] = []
    for i in wanted:
        begin, end = max(0, i - GRAMMAR_CONTEXT), min(len(words), i + GRAMMAR_CONTEXT + 1)
        if spans and begin <= spans[-1][1]:
            spans[-1][1] = end
        else:
            spans.append([begin, end])
    grammar = grammars.grammar(language)
    out, at = [], 0
    for begin, end in spans:
        read = grammar.normalize(" ".join(words[begin:end]), punct_post_process=True)
        if language == "hi":  # this version reads a Hindi decimal point in English
            read = re.sub(r"\bpoint\b", "दशमलव", read)
        out += words[at:begin] + [read]
        at = end
    return " ".join(out + words[at:])


# -- off the event loop ----------------------------------------------------------------------
MAX_GRAMMAR_CHARS = 2000
"""Longer text (100 kB of digits) keeps only the project's own rules: a grammar's time grows
with its input, and no real chunk is this long."""

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_failures = 0
_failure_listeners: list[Callable[[], None]] = []


def failures() -> int:
    """Chunks spoken as written because normalising them failed (process-wide)."""
    return _failures


def add_failure_listener(listener: Callable[[], None]) -> Callable[[], None]:
    """``listener()`` hears each failure as it is counted (the server's metrics); the
    returned call stops it."""
    _failure_listeners.append(listener)
    return lambda: _failure_listeners.remove(listener)


def _thread() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    if _pool is None:  # one thread: the grammars are used by one caller at a time
        _pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="veena-normalize")
    return _pool


async def normalize_off_loop(normalizer: TextNormalizer, text: str, request_id: str) -> str:
    """``normalizer.normalize(text)`` on the normalising thread (grammars take tens of ms:
    never on the event loop); a failure leaves ``text`` as written, with one warning."""
    global _failures
    if not normalizer.needs(text):
        return text
    try:
        out = await asyncio.get_running_loop().run_in_executor(
            _thread(), normalizer.normalize, text)
    except Exception as e:  # noqa: BLE001 - any grammar failure: the text is spoken as written
        _failures += 1
        for listener in list(_failure_listeners):
            listener()
        logger.warning("text normalisation failed: the chunk is spoken as written",
                       extra={"request_id": request_id, "error": repr(e)[:300]})
        return text
    if out != text:  # (-v) the line itself says it: the log format prints no extras
        logger.debug("normalised text [%s]: %r -> %r", request_id, text, out,
                     extra={"request_id": request_id, "text": text, "normalised": out})
    return out


def spoken_lengths_later(normalizer: TextNormalizer, words: list[str]) -> asyncio.Future:
    """``normalizer.spoken_lengths(words)``, queued on the normalising thread behind the text
    itself: a transcript needs it only after the chunk's audio, so it never delays it."""
    return asyncio.get_running_loop().run_in_executor(_thread(), normalizer.spoken_lengths,
                                                      words)
