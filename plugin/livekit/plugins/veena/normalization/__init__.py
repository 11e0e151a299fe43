"""Text normalisation: numbers, money, dates, times and abbreviations spelled out as people say
them, in each profile's languages (Hindi and English for Veena, English for Orpheus and
Maya1, Chinese and English for Spark), before the text reaches the prompt. Transcripts keep
what was written."""

from .normalizer import (
    MODES,
    NormalizationOptions,
    TextNormalizer,
    check_mode,
    check_pronunciations,
    normalize_off_loop,
)

__all__ = ["MODES", "NormalizationOptions", "TextNormalizer", "check_mode",
           "check_pronunciations", "normalize_off_loop"]
