"""Rupee amounts, which no grammar reads right in Indian usage: ``₹1,50,000``, ``Rs. 5,00,000``
and ``₹2.5 crore``. In English they are written out here (lakh and crore, rupees and paise);
in Hindi they are written out around the Hindi grammar's reading of whole numbers."""

from __future__ import annotations

import re
from typing import Callable

from .numbers import MAX_DIGITS, english_cardinal

_DIGITS = r"\d{1,3}(?:,\d{2,3})*(?:\.\d+)?|\d+(?:\.\d+)?"
"""Digits of an amount (Python's \\d takes Devanagari digits too), any grouping."""
RUPEES = re.compile(
    r"(?:₹|\bRs\.?|\bINR|रु\.?)\s?(" + _DIGITS + r")(\s?(?:lakhs?|crores?|लाख|करोड़))?(?!\d)")
"""A rupee amount: the symbol or abbreviation, digits (any grouping), a scale word."""


def _english_amount(digits: str, scale: str) -> str:
    whole, _, frac = digits.replace(",", "").partition(".")
    words = english_cardinal(int(whole), indian=True)
    if scale:
        if frac:
            words += " point " + " ".join(english_cardinal(int(d)) for d in frac)
        return f"{words} {scale.strip()} rupees"
    rupees = f"{words} {'rupee' if int(whole) == 1 else 'rupees'}"
    paise = int((frac + "00")[:2]) if frac else 0
    return rupees if not paise else f"{rupees} and {english_cardinal(paise)} paise"


def english_rupees(text: str) -> str:
    """Rupee amounts in words (Indian English)."""
    return RUPEES.sub(lambda m: m.group(0) if len(m.group(1)) > MAX_DIGITS else
                      _english_amount(m.group(1), m.group(2) or ""), text)


HINDI_CURRENCIES = {"₹": ("रुपए", "रुपया", "पैसे"), "$": ("डॉलर", "डॉलर", "सेंट"),
                    "€": ("यूरो", "यूरो", "सेंट"), "£": ("पाउंड", "पाउंड", "पेंस")}
"""(plural, one, the hundredth) of each currency a Hindi amount names."""
HINDI_MONEY = re.compile(
    r"(₹|\$|€|£|\bRs\.?|\bINR|रु\.?)\s?(" + _DIGITS + r")(\s?(?:लाख|करोड़|हज़ार|हजार))?(?!\d)")


def hindi_money(text: str, cardinal: Callable[[int], str]) -> str:
    """Amounts in Hindi words, ``cardinal`` reading whole numbers (the Hindi grammar, which
    reads them right; its own money rules read decimals as "centiles", ``₹१`` as plural and
    put the currency before a scale word)."""
    def spell(m: re.Match) -> str:
        symbol, digits, scale = m.group(1), m.group(2), (m.group(3) or "").strip()
        if len(digits) > MAX_DIGITS:
            return m.group(0)
        plural, one, hundredth = HINDI_CURRENCIES.get(symbol, HINDI_CURRENCIES["₹"])
        whole, _, frac = _hindi_digits(digits).replace(",", "").partition(".")
        words = cardinal(int(whole))
        if scale:
            if frac.strip("0"):
                words += " दशमलव " + " ".join(cardinal(int(d)) for d in frac.rstrip("0"))
            return f"{words} {scale} {plural}"
        words += f" {one if int(whole) == 1 else plural}"
        paise = int((frac + "00")[:2]) if frac else 0
        return words if not paise else f"{words} {cardinal(paise)} {hundredth}"

    return HINDI_MONEY.sub(spell, text)


def _hindi_digits(text: str) -> str:
    """Devanagari digits as ASCII ones."""
    return text.translate(_DEVANAGARI_DIGITS)


_DEVANAGARI_DIGITS = str.maketrans("०१२३४५६७८९", "0123456789")
