"""Text to phonemes with espeak-ng, as NeuTTS's prompts carry them (its model reads IPA, not
words).

The phonemes depend on espeak-ng's version, so the library and its data come from a pinned
wheel (``espeakng-loader``, the ``[neutts]`` extra), never from whatever the system has: a
fresh clone needs no system package, and the strings equal those of Neuphonic's bundled
1.52. ``phonemizer`` and espeak-ng are GPL-3.0, which is why they are an optional extra; a
profile that needs them and finds them missing fails with ``PhonemizerMissingError``.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

ESPEAK_VERSION = (1, 52, 0)
"""The espeak-ng that ``espeakng-loader==0.2.4`` ships; Neuphonic bundles 1.52 and warns on
any other (phoneme strings change between versions)."""

_INSTALL_HINT = "install the [neutts] extra: pip install 'livekit-plugins-veena[neutts]'"


class PhonemizerMissingError(ValueError):
    """espeak-ng or phonemizer is not installed (or is another espeak-ng version)."""


_quiet = logging.getLogger(__name__ + ".phonemizer")
"""phonemizer's own log: with words_mismatch="ignore" it still warns "words count mismatch"
on every sentence whose phonemes count other words than its text (NeuTTS read as three
letters; the output is unaffected): only its errors are logged, under our name."""
_quiet.setLevel(logging.ERROR)

_lock = threading.Lock()
"""espeak-ng keeps global state in its library: one phonemisation at a time."""


@functools.lru_cache(maxsize=8)
def _backend(language: str) -> Any:
    try:
        import espeakng_loader
        from phonemizer.backend import EspeakBackend
        from phonemizer.backend.espeak.wrapper import EspeakWrapper
    except ImportError as e:
        raise PhonemizerMissingError(f"phonemes need espeak-ng and phonemizer ({e.name} is "
                                     f"missing): {_INSTALL_HINT}") from None
    EspeakWrapper.set_library(espeakng_loader.get_library_path())
    EspeakWrapper.set_data_path(espeakng_loader.get_data_path())
    backend = EspeakBackend(language, preserve_punctuation=True, with_stress=True,
                            words_mismatch="ignore", language_switch="remove-flags",
                            logger=_quiet)
    if tuple(backend.version()[:2]) != ESPEAK_VERSION[:2]:
        raise PhonemizerMissingError(
            f"espeak-ng {'.'.join(map(str, backend.version()))} loaded where "
            f"{'.'.join(map(str, ESPEAK_VERSION))} is pinned: {_INSTALL_HINT}")
    return backend


def check_phonemizer(language: str = "en-us") -> None:
    """Fail now (``PhonemizerMissingError``) rather than at the first request."""
    _backend(language)


@functools.lru_cache(maxsize=256)
def phonemize(text: str, language: str = "en-us") -> str:
    """``text`` in IPA with stress marks and its punctuation, whitespace collapsed to single
    spaces (a voice's transcript is phonemised once, then cached)."""
    backend = _backend(language)
    if not text.strip():
        return ""  # (phonemizer drops an empty line from its output)
    with _lock:
        phones = backend.phonemize([text])
    return " ".join(phones[0].split()) if phones else ""
