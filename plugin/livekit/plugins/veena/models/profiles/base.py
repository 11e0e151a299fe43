"""What every model profile shares, whatever its family: the manifest beside a model's
weights, the tokenizer and sampling types, and the voice checks (named voices, voices
described in words, cloned voices). The family modules (``snac``, ``bicodec``) build on it.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any, Literal, Protocol, Sequence

from ...pipeline.family import CLONED_VOICE, check_cloned_voice  # noqa: F401  (re-exported)
from ...validation import check_str

CodecKind = Literal["snac", "bicodec", "neucodec"]

MANIFEST = "veena_tts.json"
"""A file beside a model's weights naming its profile and codec folder."""


def read_manifest(model: str) -> dict[str, Any]:
    """The model folder's ``veena_tts.json`` (empty for a hub id or a folder without one)."""
    path = Path(model) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


class TokenizerLike(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


MAX_DESCRIPTION_CHARS = 500
"""The longest voice description (Maya1's published examples are under 200 characters)."""

_DESCRIPTION_FORBIDDEN = '"<>'
"""A quote would close the ``description="..."`` attribute; angle brackets would open a tag
or a special token (``<|eot_id|>``) inside the prompt."""


def check_description(description: object) -> str:
    """A voice described in words, safe inside ``<description="...">`` (ValueError otherwise).

    The rule: a string of 1..``MAX_DESCRIPTION_CHARS`` characters once surrounding spaces
    are removed, with no ``"``, ``<`` or ``>`` and no control, format, separator or
    surrogate characters (newlines, tabs, zero-width and bidi marks), so it can neither end
    the attribute nor smuggle a special token or tag into the prompt."""
    check_str("voice description", description, max_len=MAX_DESCRIPTION_CHARS * 2)
    text = description.strip()
    if not text:
        raise ValueError("voice description must not be empty")
    if len(text) > MAX_DESCRIPTION_CHARS:
        raise ValueError(f"voice description must be at most {MAX_DESCRIPTION_CHARS} "
                         f"characters, got {len(text)}")
    for ch in text:
        if ch in _DESCRIPTION_FORBIDDEN:
            raise ValueError(f"voice description must not contain {ch!r}: quotes and angle "
                             "brackets could end the description or inject a tag or special "
                             "token into the prompt")
        if ch != " " and unicodedata.category(ch)[0] in "CZ":
            raise ValueError(f"voice description must not contain control, format or "
                             f"separator characters, got U+{ord(ch):04X}")
    return text


class VoiceChecks:
    """Voice checking shared by every profile (each has ``name``, ``voices``,
    ``voice_prompts`` and ``described_voices``)."""

    name: str
    voices: tuple[str, ...]
    # defaults for a profile of a family of its own that does not declare them (not fields)
    voice_prompts: tuple[tuple[str, str], ...] = ()
    described_voices: bool = False
    tags: tuple[str, ...] = ()
    runaway_s_per_char: float = 0.1

    def check_voice(self, voice: str, speakers: Sequence[str] = ()) -> str:
        """A named voice, or (``described_voices``) a description checked by
        ``check_description``; ValueError otherwise, before any engine work. ``speakers``:
        more speaker names the request may use (a LoRA adapter's own name, which its
        fine-tune learnt as a speaker)."""
        if isinstance(voice, str) and voice in speakers:
            return voice
        if self.described_voices and isinstance(voice, str) and voice not in self.voices:
            return check_description(voice)
        check_str("voice", voice, max_len=256)
        if voice not in self.voices:
            raise ValueError(
                f"unknown voice {voice!r} for model profile {self.name!r}; "
                f"valid voices: {', '.join(self.voices)}"
            )
        return voice

    def render_voice(self, voice: str) -> str:
        """What the prompt says for ``voice``: a preset's own words (``voice_prompts``), else
        the voice itself (a speaker name, or a description)."""
        for name, prompt in self.voice_prompts:
            if name == voice:
                return prompt
        return voice


