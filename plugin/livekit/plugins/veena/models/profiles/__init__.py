"""Model profiles: every per-model fact (prompt format, token ids, voices, codec) in one place.

The pipeline never hard-codes a token id; it asks the profile. Users override any field with
``with_overrides(VEENA, voices=(...))`` and make their own profile known by name with
``register_profile``. A profile's ``codec`` field picks its model family (``families``).

This package is the registry; what every profile shares is in ``base``, each family's profile
class and its published models in ``snac``, ``bicodec`` and ``neucodec``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from .base import (
    CLONED_VOICE,
    MANIFEST,
    MAX_DESCRIPTION_CHARS,
    CodecKind,
    TokenizerLike,
    VoiceChecks,
    check_cloned_voice,
    check_description,
    read_manifest,
)
from .bicodec import SPARK, SPARK_GENDERS, SPARK_LEVELS, VEENA3, BiCodecProfile, spark_voice
from .neucodec import LLASA, NEUTTS, NeuCodecProfile
from .snac import MAYA1, MAYA1_PRESETS, MAYA1_TAGS, ORPHEUS, ORPHEUS_TAGS, VEENA, SnacProfile

__all__ = [
    "CLONED_VOICE", "LLASA", "MANIFEST", "MAX_DESCRIPTION_CHARS", "MAYA1", "MAYA1_PRESETS",
    "MAYA1_TAGS", "NEUTTS", "NeuCodecProfile",
    "ORPHEUS", "ORPHEUS_TAGS", "PROFILES", "SPARK", "SPARK_GENDERS", "SPARK_LEVELS", "VEENA",
    "VEENA3", "BiCodecProfile", "CodecKind", "ModelProfile", "SnacProfile",
    "TokenizerLike", "VoiceChecks", "as_profile", "check_cloned_voice", "check_description",
    "get_profile", "read_manifest", "register_profile", "resolve_profile", "spark_voice",
    "with_overrides",
]


ModelProfile = SnacProfile | BiCodecProfile | NeuCodecProfile

PROFILES: dict[str, ModelProfile] = {
    p.name: p for p in (VEENA, ORPHEUS, MAYA1, VEENA3, SPARK, NEUTTS, LLASA)
}


def get_profile(name: str) -> ModelProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown model profile {name!r}; known profiles: {', '.join(PROFILES)}"
        ) from None


def as_profile(value: "str | ModelProfile") -> "ModelProfile":
    """A profile given by name or as itself (any object with a ``codec`` and a
    ``sample_rate``: a family of its own brings its own profile class); ValueError else."""
    if isinstance(value, str):
        return get_profile(value)
    if not isinstance(getattr(value, "codec", None), str) or not hasattr(value, "sample_rate"):
        raise ValueError(f"profile must be a profile name or a model profile, got "
                         f"{type(value).__name__}")
    return value


def resolve_profile(model: str, profile: "str | ModelProfile | None" = None) -> "ModelProfile":
    """The profile a model is read with: the one given, else its folder's manifest, else
    ``VEENA_PROFILE``, else the profile whose ``model_ids`` name it (a hub id such as
    ``maya-research/maya1``, or its snapshot in the Hugging Face cache), else ``spark`` for a
    folder in Spark-TTS's layout (``LLM/`` beside ``BiCodec/``), else ``veena``."""
    prof = (profile or read_manifest(model).get("profile") or os.environ.get("VEENA_PROFILE")
            or _known_model(model) or ("spark" if _spark_layout(model) else "veena"))
    return as_profile(prof)


def _known_model(model: str) -> str | None:
    """The profile that publishes ``model``: its hub id, or a cache path
    ``.../models--OWNER--NAME/snapshots/...`` of it (case-insensitive, as the hub is)."""
    text = str(model).strip().lower()
    for candidate in PROFILES.values():
        for model_id in getattr(candidate, "model_ids", ()):
            mid = model_id.lower()
            if text == mid or f"models--{mid.replace('/', '--')}" in text.split("/"):
                return candidate.name
    return None


def _spark_layout(model: str) -> bool:
    folder = Path(model)
    return (folder / "LLM").is_dir() and (folder / "BiCodec").is_dir()


def register_profile(profile: Any) -> Any:
    """Make ``profile`` known by its name (``get_profile``, ``VEENA_PROFILE``, manifests)."""
    PROFILES[profile.name] = profile
    return profile


def with_overrides(profile: ModelProfile, **changes: object) -> ModelProfile:
    """A copy of ``profile`` with some fields replaced (e.g. other voices or token ids)."""
    return dataclasses.replace(profile, **changes)  # type: ignore[arg-type]
