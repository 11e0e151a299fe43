"""NVIDIA NeMo's text-normalisation grammars (``nemo-text-processing``, WFSTs on pynini), one
per language, loaded once per process and cached on disk: the first load compiles them
(about a minute per language on a small CPU), later ones read the cache in under a second.

Optional: where the package is not installed (a client-only install, a machine without
pynini) ``available()`` is False and normalisation uses the project's own rules alone."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

LANGUAGES = ("en", "hi", "zh")
"""The grammar languages the profiles use."""


def cache_dir() -> Path:
    """Where compiled grammars are kept: under ``VEENA_NORMALIZATION_CACHE`` (default
    ``~/.cache/veena-tts/grammars``), one folder per NeMo version, since NeMo names its
    compiled files by language alone and would load another version's."""
    given = os.environ.get("VEENA_NORMALIZATION_CACHE")
    base = Path(given) if given else Path.home() / ".cache" / "veena-tts" / "grammars"
    return base / f"nemo-{importlib.metadata.version('nemo-text-processing')}"


def available() -> bool:
    return importlib.util.find_spec("nemo_text_processing") is not None


_loaded: dict[str, Any] = {}
_lock = threading.Lock()


def grammar(language: str) -> Any:
    """The loaded NeMo normaliser of ``language`` (compiled and cached on first use; called
    off the event loop). Raises where the package is missing or the language unknown."""
    if language not in LANGUAGES:
        raise ValueError(f"no grammar for language {language!r}; known: {LANGUAGES}")
    with _lock:
        found = _loaded.get(language)
        if found is None:
            from nemo_text_processing.text_normalization.normalize import Normalizer

            folder = cache_dir()
            folder.mkdir(parents=True, exist_ok=True)
            started = time.perf_counter()
            logger.info("loading text-normalisation grammars (compiled once, then cached)",
                        extra={"language": language, "cache": str(folder)})
            found = Normalizer(input_case="cased", lang=language, cache_dir=str(folder))
            logger.info("text-normalisation grammars ready", extra={
                "language": language, "s": round(time.perf_counter() - started, 1)})
            _loaded[language] = found
        return found


def prepare(languages: tuple[str, ...] = LANGUAGES) -> None:
    """Compile or load the grammars of ``languages`` now (``download``, ``prewarm``), unless
    ``VEENA_TEXT_NORMALIZATION=off``; a failure is logged, never raised (normalisation then
    uses the project's rules alone)."""
    if not available() or os.environ.get("VEENA_TEXT_NORMALIZATION") == "off":
        return
    for language in languages:
        try:
            grammar(language)
        except Exception as e:  # noqa: BLE001 - a broken grammar install must not stop a start
            logger.warning("text-normalisation grammars unavailable",
                           extra={"language": language, "error": repr(e)[:300]})
