"""Amounts of money, which no grammar reads right in Indian usage or in Chinese: ``₹1,50,000``,
``Rs 5 lacs``, ``₹2 Cr``, ``Rs. 500/-``, ``$1,234.56`` in Indian English, ``¥1,234.5元``. In
English and Chinese they are written out here; in Hindi around the Hindi grammar's reading of
whole numbers. The currency is said after the number, as people say it."""

from __future__ import annotations

import decimal
import re
from typing import Callable

from .numbers import MAX_DIGITS, chinese_number, english_cardinal

_DIGITS = r"\d{1,3}(?:,\d{2,3})*(?:\.\d+)?|\d+(?:\.\d+)?"
"""Digits of an amount (Python's \\d takes Devanagari digits too), any grouping."""
_SYMBOLS = {"₹": "INR", "rs": "INR", "inr": "INR", "रु": "INR", "$": "USD", "us$": "USD",
            "usd": "USD", "€": "EUR", "eur": "EUR", "£": "GBP", "gbp": "GBP", "¥": "JPY",
            "￥": "JPY", "jpy": "JPY", "cny": "CNY", "rmb": "CNY"}
_SCALES = {"lakh": "lakh", "lakhs": "lakh", "lac": "lakh", "lacs": "lakh", "l": "lakh",
           "crore": "crore", "crores": "crore", "cr": "crore", "crs": "crore",
           "thousand": "thousand", "k": "thousand", "million": "million", "mn": "million",
           "m": "million", "billion": "billion", "bn": "billion",
           "लाख": "lakh", "करोड़": "crore", "हज़ार": "thousand", "हजार": "thousand"}
_CURRENCY = (r"₹|\$|€|£|[¥￥]|(?i:(?<![A-Za-z])(?:Rs|INR|USD|US\$|EUR|GBP|JPY|CNY|RMB)"
             r"(?![A-Za-z])\.?)|रु\.?")
_SCALE = (r"\s?(?i:lakhs?|lacs?|crores?|thousand|million|billion"
          r"|(?:crs?|mn|bn|[lkm])(?:\.(?=\s*[a-z\u0900-\u097f]))?)(?!\w)"
          r"|\s?(?:लाख|करोड़|हज़ार|हजार)")
MONEY = re.compile(r"(" + _CURRENCY + r")\s?(" + _DIGITS + r")(?!\d)(" + _SCALE + r")?(/-)?")
"""An amount: the symbol or code, digits (any grouping), a scale word or its abbreviation
(any case; its dot unless a sentence ends there), and ``/-`` (no paise: not read)."""
MONEY_RANGE = re.compile(r"(" + _CURRENCY + r")\s?(" + _DIGITS + r")\s?[-–]\s?(?:(?:"
                         + _CURRENCY + r")\s?)?(" + _DIGITS + r")(?!\d)(" + _SCALE + r")?")
"""``Rs 50-100``, ``₹50-₹100``, ``₹5-7 lakh``: two amounts in one currency."""
TO = {"en": " to ", "hi": " से ", "zh": "到"}


def money_ranges(text: str, language: str) -> str:
    """``₹5-7 lakh`` as "₹5 lakh to ₹7 lakh" in ``language``: each amount is then read as
    one (the range rule alone would read "five rupees to seven")."""
    def spell(m: re.Match) -> str:
        symbol, scale = m.group(1), m.group(4) or ""
        return f"{symbol}{m.group(2)}{scale}{TO[language]}{symbol}{m.group(3)}{scale}"

    return MONEY_RANGE.sub(spell, text)


YUAN_AFTER = re.compile(r"[¥￥]\s?(" + _DIGITS + r")\s?元")
"""¥ before an amount with 元 after it (``¥1,234.5元``): yuan, said once, after the number."""
ALWAYS_OURS = ("INR", "JPY", "CNY")
"""Currencies the English grammar reads wrongly (rupees at all, yen and yuan with a decimal
part): written out here in every English locale (the others only in Indian English, or with a
scale word)."""
SCALE_VALUES = {"thousand": 10**3, "lakh": 10**5, "million": 10**6, "crore": 10**7,
                "billion": 10**9}

ENGLISH = {"INR": ("rupee", "rupees", "paisa", "paise"), "USD": ("dollar", "dollars", "cent",
                                                                 "cents"),
           "EUR": ("euro", "euros", "cent", "cents"), "GBP": ("pound", "pounds", "penny",
                                                              "pence"),
           "JPY": ("yen", "yen", "", ""), "CNY": ("yuan", "yuan", "fen", "fen")}
HINDI = {"INR": ("रुपया", "रुपए", "पैसे"), "USD": ("डॉलर", "डॉलर", "सेंट"),
         "EUR": ("यूरो", "यूरो", "सेंट"), "GBP": ("पाउंड", "पाउंड", "पेंस"),
         "JPY": ("येन", "येन", ""), "CNY": ("युआन", "युआन", "फ़ेन")}
HINDI_SCALES = {"lakh": "लाख", "crore": "करोड़", "thousand": "हज़ार", "million": "मिलियन",
                "billion": "बिलियन"}
CHINESE = {"INR": "卢比", "USD": "美元", "EUR": "欧元", "GBP": "英镑", "JPY": "日元", "CNY": "元"}
YUAN = re.compile(r"[¥￥]\s?(" + _DIGITS + r")(?!\d)\s?(元?)")
"""¥ before an amount, with or without 元 after it (``¥1,234.5元`` says 元 once)."""


def _parts(m: re.Match) -> tuple[str, str, str, str]:
    """(currency code, whole digits, fraction digits, scale) of a MONEY match."""
    code = _SYMBOLS[m.group(1).lower().rstrip(".")]
    whole, _, frac = m.group(2).replace(",", "").partition(".")
    scale = (m.group(3) or "").strip().rstrip(".")
    return code, whole, frac, _SCALES.get(scale.lower(), scale) if scale else ""


def english_money(text: str, indian: bool) -> str:
    """Amounts in English words: rupees always, other currencies in Indian English (lakh and
    crore) or with a scale word; the rest is the English grammar's."""
    def spell(m: re.Match) -> str:
        code, whole, frac, scale = _parts(m)
        if len(m.group(2)) > MAX_DIGITS or not (indian or scale or code in ALWAYS_OURS):
            return m.group(0)
        one, many, cent, cents = ENGLISH[code]
        words = english_cardinal(int(whole), indian)
        if scale:
            if frac:
                words += " point " + " ".join(english_cardinal(int(d)) for d in frac)
            return f"{words} {scale} {many}"
        if len(frac) > 2 or (frac and not cent):  # not a sum in cents (or yen): a decimal
            return f"{words} point {' '.join(english_cardinal(int(d)) for d in frac)} {many}"
        words += f" {one if int(whole) == 1 else many}"
        hundredths = int((frac + "00")[:2]) if frac else 0
        if not hundredths:
            return words
        return f"{words} and {english_cardinal(hundredths)} {cent if hundredths == 1 else cents}"

    return MONEY.sub(spell, _yuan(text))


def _yuan(text: str) -> str:
    """``¥1,234.5元`` as ``CNY 1,234.5``: one currency, said once."""
    return YUAN_AFTER.sub(lambda m: f"CNY {m.group(1)}", text)


def hindi_money(text: str, cardinal: Callable[[int], str]) -> str:
    """Amounts in Hindi words, ``cardinal`` reading whole numbers (the Hindi grammar, which
    reads them right; its own money rules read decimals as "centiles", ``₹१`` as plural and
    put the currency before a scale word)."""
    def spell(m: re.Match) -> str:
        if len(m.group(2)) > MAX_DIGITS:
            return m.group(0)
        code, whole, frac, scale = _parts(m)
        one, plural, hundredth = HINDI[code]
        whole, frac = _hindi_digits(whole), _hindi_digits(frac)
        words = cardinal(int(whole))
        if scale:
            if frac.strip("0"):
                words += " दशमलव " + " ".join(cardinal(int(d)) for d in frac.rstrip("0"))
            return f"{words} {HINDI_SCALES.get(scale, scale)} {plural}"
        words += f" {one if int(whole) == 1 else plural}"
        paise = int((frac + "00")[:2]) if frac else 0
        return words if not paise else f"{words} {cardinal(paise)} {hundredth}"

    return MONEY.sub(spell, _yuan(text))


def chinese_money(text: str) -> str:
    """Amounts in Chinese, the currency after the number (``$1,234.56`` ->
    一千二百三十四点五六美元, ``₹5 lakh`` -> 五十万卢比; the grammar garbles grouped digits and
    ``¥...元``)."""
    def spell(m: re.Match) -> str:
        code, whole, frac, scale = _parts(m)
        if len(m.group(2)) > MAX_DIGITS or scale not in SCALE_VALUES and scale:
            return m.group(0)
        amount = decimal.Decimal(_hindi_digits(f"{whole}.{frac or 0}"))
        amount *= SCALE_VALUES.get(scale, 1)
        digits = _no_zero_fraction(format(amount, "f"))
        return chinese_number(digits) + CHINESE[code]

    text = YUAN.sub(lambda m: m.group(0) if len(m.group(1)) > MAX_DIGITS else
                    chinese_number(_no_zero_fraction(m.group(1))) + "元", text)
    return MONEY.sub(spell, text)


def _no_zero_fraction(digits: str) -> str:
    """``99.00`` as ``99``, ``99.50`` as ``99.5``: said as the amount, not its zeros."""
    return digits.rstrip("0").rstrip(".") if "." in digits else digits


def _hindi_digits(text: str) -> str:
    """Devanagari digits as ASCII ones."""
    return text.translate(_DEVANAGARI_DIGITS)


_DEVANAGARI_DIGITS = str.maketrans("०१२३४५६७८९", "0123456789")
