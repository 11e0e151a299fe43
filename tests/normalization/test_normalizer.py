"""Text normalisation: what a listener must hear, written out by hand (Indian grouping, rupees,
lakh and crore, the date's order, Hindi clock times, Hinglish), the grammars' own published
test cases through the product's stage, and the stage's guarantees (tags untouched, nothing
to normalise costs no grammar, pronunciations by whole word, bounded on pathological input)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from livekit.plugins.veena.normalization import grammars
from livekit.plugins.veena.normalization.dates import spell_dates
from livekit.plugins.veena.normalization.normalizer import TextNormalizer
from livekit.plugins.veena.normalization.numbers import english_cardinal
from livekit.plugins.veena.normalization.scripts import runs_by_script

DATA = Path(__file__).parent / "data"
needs_grammars = pytest.mark.skipif(not grammars.available(),
                                    reason="nemo-text-processing is not installed")
VEENA = TextNormalizer(("hi", "en"), "en-IN")


@pytest.mark.parametrize("n, indian, words", [
    (0, True, "zero"), (15, True, "fifteen"), (105, False, "one hundred five"),
    (150000, True, "one lakh fifty thousand"),
    (150000, False, "one hundred fifty thousand"),
    (1200500, True, "twelve lakh five hundred"),
    (25000000, True, "two crore fifty lakh"),
    (1234567890, True, "one hundred twenty three crore forty five lakh sixty seven thousand "
                       "eight hundred ninety"),
    (1234567890, False, "one billion two hundred thirty four million five hundred sixty "
                        "seven thousand eight hundred ninety"),
])
def test_english_cardinals_in_both_systems(n, indian, words):
    assert english_cardinal(n, indian) == words


@pytest.mark.parametrize("text, locale, want", [
    ("12/08/2026", "en-IN", "the twelfth of august twenty twenty six"),
    ("12/08/2026", "en-US", "december eighth twenty twenty six"),  # month first
    ("31-12-26", "en-GB", "the thirty first of december twenty twenty six"),
    ("13/13/2026", "en-IN", "13/13/2026"),  # no such date: left as written
    ("31/02/2026", "en-IN", "31/02/2026"),  # nor this one
    ("version 1.2.3", "en-IN", "version 1.2.3"),
    ("paid on 05/09/2026.", "en-IN", "paid on the fifth of september twenty twenty six."),
    ("2024-03-15", "en-IN", "the fifteenth of march twenty twenty four"),  # year first
    ("2024-03-15", "en-US", "march fifteenth twenty twenty four"),
    ("1/1/2005", "en-US", "january first two thousand five"),
    ("07/01/1905", "en-IN", "the seventh of january nineteen oh five"),
    ("3.11.12", "en-IN", "3.11.12"),  # dots and a two-digit year: a version
])
def test_numeric_dates_follow_the_locales_order(text, locale, want):
    assert spell_dates(text, "en", locale) == want


def test_runs_split_by_script_and_digits_join_the_run_after_them():
    assert runs_by_script("Aapka ₹500 और 3 बजे ok.") == [
        ("Latin", "Aapka"), ("Devanagari", " ₹500 और 3 बजे"), ("Latin", " ok.")]
    assert "".join(t for _, t in runs_by_script("订单 ¥35.5 and 2026年")) == "订单 ¥35.5 and 2026年"


# -- the rules of our own (no grammar needed) --------------------------------------------------
@pytest.mark.parametrize("text, want", [
    ("Pay ₹1,50,000 today", "Pay one lakh fifty thousand rupees today"),
    ("Rs. 5,00,000 only", "five lakh rupees only"),
    ("about ₹2.5 crore in all", "about two point five crore rupees in all"),
    ("It is Rs 1 each", "It is one rupee each"),
    ("Pay ₹35.50 now", "Pay thirty five rupees and fifty paise now"),
    ("We have 12,00,500 users", "We have twelve lakh five hundred users"),
])
def test_indian_english_reads_rupees_and_grouping_as_lakh_and_crore(text, want):
    assert _own_rules(text) == want
    if grammars.available():  # the grammar has nothing left to change
        assert VEENA.normalize(text) == want


def _own_rules(text: str) -> str:
    """The English stage without the grammar (what a machine without pynini says)."""
    from livekit.plugins.veena.normalization.money import english_money
    from livekit.plugins.veena.normalization.numbers import english_numbers

    return english_numbers(english_money(text, indian=True), indian=True)


def test_nothing_to_normalise_never_reaches_a_grammar(monkeypatch):
    def no_grammar(language):
        raise AssertionError("a grammar was asked")

    monkeypatch.setattr(grammars, "grammar", no_grammar)
    for text in ("Hello there, how are you?", "नमस्ते, आप कैसे हैं?", "<laugh> okay then",
                 "你好，很高兴认识你。"):
        assert not VEENA.needs(text)
        assert VEENA.normalize(text) is text


def test_pronunciations_replace_whole_words_with_their_case_rules():
    n = TextNormalizer(("en",), "en-US", {"SQL": "sequel", "livekit": "live kit"})
    assert n.normalize("SQL and sql, MySQL") == "sequel and sql, MySQL"  # as written only
    assert n.normalize("LiveKit, livekit and LIVEKIT") == "live kit, live kit and live kit"
    assert n.needs("we use SQL")


def test_pronunciations_never_rewrite_a_tag():
    n = TextNormalizer(("en",), "en-US", {"sigh": "sai", "laugh": "laff"})
    assert n.normalize("<sigh> I sigh, <laugh> laugh.") == "<sigh> I sai, <laugh> laff."
    assert n.normalize('<description="a sigh"> sigh') == '<description="a sigh"> sai'


def test_text_of_no_script_is_read_in_the_locales_language():
    assert VEENA.default_language == "en"  # en-IN: English, though Hindi is listed first
    assert TextNormalizer(("hi", "en"), "hi-IN").default_language == "hi"
    assert TextNormalizer(("zh", "en"), "zh-CN").default_language == "zh"
    assert TextNormalizer(("hi", "en"), "fr-FR").default_language == "hi"  # not spoken: first


def test_tags_pass_through_unchanged():
    text = '<laugh> Pay ₹1,50,000 <sigh> <description="2 kids, 40s">'
    out = VEENA.normalize(text)
    assert out.startswith("<laugh> ") and "<sigh>" in out
    assert out.endswith('<description="2 kids, 40s">') and "₹" not in out


def test_pathological_input_stays_bounded():
    blob = "9" * 100_000
    assert VEENA.normalize(blob) == blob  # past the grammar's limit: as written
    commas = ",".join(["123"] * 30_000)
    assert VEENA.normalize(commas) == commas  # not an amount: never expanded
    brackets = "(" * 5000 + "1" + ")" * 5000
    assert VEENA.normalize(brackets).count("(") == 5000


def test_text_past_the_grammars_bound_never_asks_one(monkeypatch):
    """Hindi numbers are read by the Hindi grammar: a long text of them must not ask it once
    per number (50,000 numbers took 97 s)."""
    def no_grammar(language):
        raise AssertionError("a grammar was asked")

    monkeypatch.setattr(grammars, "available", lambda: True)
    monkeypatch.setattr(grammars, "grammar", no_grammar)
    for blob in ("1 " * 50_000 + "दीजिए", "₹1-" * 25_000 + " दीजिए", "1.5 " * 30_000):
        assert TextNormalizer(("hi", "en"), "hi-IN").normalize(blob)


# -- with the grammars -------------------------------------------------------------------------
def _cases(name: str) -> list[tuple[str, str]]:
    lines = (DATA / f"nemo_{name}.txt").read_text("utf-8").splitlines()
    return [tuple(line.split("~", 1)) for line in lines if line and not line.startswith("#")]


@needs_grammars
@pytest.mark.parametrize("name, languages, locale", [
    ("hi_money", ("hi",), "hi-IN"), ("hi_cardinal", ("hi",), "hi-IN"),
    ("en_money", ("en",), "en-US"), ("en_cardinal", ("en",), "en-US"),
    ("zh_money", ("zh",), "zh-CN"), ("hi_time", ("hi",), "hi-IN"), ("hi_date", ("hi",), "hi-IN"),
    ("en_date", ("en",), "en-US"), ("zh_date", ("zh",), "zh-CN"),
])
def test_the_grammars_own_test_cases_through_the_stage(name, languages, locale):
    n = TextNormalizer(languages, locale)
    wrong = [(text, n.normalize(text), want) for text, want in _cases(name)
             if n.normalize(text).strip() != want.strip()]
    assert not wrong


@needs_grammars
@pytest.mark.parametrize("text, want", [
    # the sentence: the amount in lakh, the date day first, the time spelled out
    ("₹1,50,000 on 15/08/2026 at 3:30 PM",
     "one lakh fifty thousand rupees on the fifteenth of august twenty twenty six at three "
     "thirty PM"),
    ("₹1,50,000 दीजिए", "एक लाख पचास हज़ार रुपए दीजिए"),
    ("₹2.5 करोड़ का ऑर्डर", "दो दशमलव पाँच करोड़ रुपए का ऑर्डर"),
    ("15/08/2026 को 3:30 बजे", "पंद्रह अगस्त दो हज़ार छब्बीस को साढ़े तीन बजे"),
    ("मीटिंग 10:20 बजे है", "मीटिंग दस बजकर बीस मिनट है"),
    ("12/07/1970 को", "बारह जुलाई उन्नीस सौ सत्तर को"),  # a year as a year
    ("3.5 किलो", "तीन दशमलव पाँच किलो"),
    ("25 लोग", "पच्चीस लोग"),
    # Hinglish: each script's run in its language
    ("Aapka order ₹1,50,000 ka hai और delivery 15/08/2026 को होगी",
     "Aapka order one lakh fifty thousand rupees ka hai और delivery पंद्रह अगस्त दो हज़ार "
     "छब्बीस को होगी"),
    ("Dr. Rao will call at 10:05 am", "doctor Rao will call at ten o five AM"),
])
def test_what_a_listener_must_hear_in_indian_english_and_hindi(text, want):
    assert VEENA.normalize(text) == want


@needs_grammars
def test_orpheus_reads_dates_month_first_and_spark_reads_chinese():
    us = TextNormalizer(("en",), "en-US")
    assert us.normalize("on 12/08/2026") == "on december eighth twenty twenty six"
    zh = TextNormalizer(("zh", "en"), "zh-CN")
    assert zh.normalize("一共100美元") == "一共一百美元"


# -- per locale: the table of what a listener must hear, and what never comes out ----------------
LOCALES = {"en-IN": ("hi", "en"), "en-US": ("en",), "hi-IN": ("hi", "en"), "zh-CN": ("zh", "en")}
"""Each locale with the languages of the profile that speaks it (veena, orpheus, spark)."""
DIGITS = re.compile(r"\d[\d/.,:-]*\d|\d")
DEVANAGARI = re.compile(r"[\u0900-\u097f]")


def _table() -> list[tuple[str, str, str]]:
    lines = (DATA / "listener.txt").read_text("utf-8").splitlines()
    return [tuple(line.split("~")) for line in lines if line and not line.startswith("#")]


def assert_spoken_or_as_written(written: str, heard: str, locale: str) -> None:
    """Every number in ``heard`` is one of ``written``'s, whole (as written, never half
    read), glued to no letter it was not written beside; no Hindi in English where nothing
    was Hindi; no Latin word that was not written (``पंद्रहth``)."""
    for number in DIGITS.findall(heard):
        assert number in DIGITS.findall(written), (number, heard)
    for glued in re.findall(r"[A-Za-z\u0900-\u097f]\d+|\d+[A-Za-z\u0900-\u097f]", heard):
        assert glued in written, (glued, heard)
    if not DEVANAGARI.search(written) and not locale.startswith("hi"):
        assert not DEVANAGARI.search(heard), heard
    if not locale.startswith("en") and (DEVANAGARI.search(written)
                                        or re.search(r"[\u4e00-\u9fff]", written)):
        latin = set(re.findall(r"[A-Za-z]+", written.lower()))
        assert set(re.findall(r"[A-Za-z]+", heard.lower())) <= latin, heard


@needs_grammars
@pytest.mark.parametrize("locale, written, heard", _table())
def test_what_a_listener_must_hear_per_locale(locale, written, heard):
    said = TextNormalizer(LOCALES[locale], locale).normalize(written)
    assert said == heard
    assert_spoken_or_as_written(written, said, locale)


AROUND = {"en-IN": "Pay {} now.", "en-US": "Pay {} now.", "hi-IN": "{} दीजिए", "zh-CN": "共{}。"}
VALUES = ["₹1,50,000", "$1,234.56", "USD 1,000.50", "-5,000", "Rs 5 lacs", "₹2 Cr", "₹3 Lakh",
          "Rs. 500/-", "3.11.12", "v2.4", "05/09/2026", "31/02/2026", "2024-03-15",
          "2024-02-30", "10:30", "9876543210", "13812345678", "1800-22-3344", "12,00,500",
          "1,234,567", "99.5", "-3.25", "15%", "¥1,234.5元", "5-7", "2024-25", "5kg", "2026",
          "1/2", "2 1/2", "(555) 123-4567", "-3℃", "₹50-100", "10.30 बजे"]


@needs_grammars
@pytest.mark.parametrize("locale", LOCALES)
def test_every_class_in_every_locale_is_words_or_as_written(locale):
    n = TextNormalizer(LOCALES[locale], locale)
    wrong = []
    for value in VALUES:
        for written in (value, AROUND[locale].format(value)):
            try:
                assert_spoken_or_as_written(written, n.normalize(written), locale)
            except AssertionError:
                wrong.append((written, n.normalize(written)))
    assert not wrong
