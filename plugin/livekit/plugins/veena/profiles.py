"""Model profiles: every per-model fact (prompt format, token ids, voices, codec) in one place.

The pipeline never hard-codes a token id; it asks the profile. Users override any field with
``with_overrides(VEENA, voices=(...))`` and make their own profile known by name with
``register_profile``. A profile's ``codec`` field picks its model family (``families``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, Sequence

from .validation import check_int_list, check_str

CodecKind = Literal["snac", "bicodec"]

MANIFEST = "veena_tts.json"
"""A file beside a model's weights naming its profile and codec folder."""


def read_manifest(model: str) -> dict[str, Any]:
    """The model folder's ``veena_tts.json`` (empty for a hub id or a folder without one)."""
    path = Path(model) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


class TokenizerLike(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass(frozen=True)
class SamplingDefaults:
    temperature: float = 0.4
    top_p: float = 0.9
    top_k: int = -1
    repetition_penalty: float = 1.05


class _Voices:
    """Voice checking shared by every profile (each has ``name`` and ``voices``)."""

    name: str
    voices: tuple[str, ...]

    def check_voice(self, voice: str) -> str:
        check_str("voice", voice, max_len=256)
        if voice not in self.voices:
            raise ValueError(
                f"unknown voice {voice!r} for model profile {self.name!r}; "
                f"valid voices: {', '.join(self.voices)}"
            )
        return voice


@dataclass(frozen=True)
class SnacProfile(_Voices):
    """An Orpheus-style model: a Llama that speaks SNAC 24 kHz codes, 7 tokens per frame.

    The prompt is ``prefix_ids + encode(prompt_template) + suffix_ids``; generated ids
    ``audio_token_base + p * 4096 + code`` carry the code of interleave position ``p``.
    """

    name: str
    voices: tuple[str, ...]
    default_voice: str
    prompt_template: str
    prefix_ids: tuple[int, ...]
    suffix_ids: tuple[int, ...]
    stop_token_ids: tuple[int, ...]
    audio_token_base: int
    add_bos: bool = False
    codec: CodecKind = "snac"
    codec_model: str = "hubertsiuzdak/snac_24khz"
    sample_rate: int = 24000
    samples_per_frame: int = 2048
    tokens_per_frame: int = 7
    codebook_size: int = 4096
    # codebook level of each interleave position: [c0, c1a, c2a, c2b, c1b, c2c, c2d]
    position_levels: tuple[int, ...] = (0, 1, 2, 2, 1, 2, 2)
    tokens_per_second: float = 7 * 24000 / 2048
    sampling: SamplingDefaults = SamplingDefaults()
    licence: str = ""

    @property
    def vocab_end(self) -> int:
        """One past the highest audio token id."""
        return self.audio_token_base + self.tokens_per_frame * self.codebook_size

    def build_prompt(self, tokenizer: TokenizerLike, text: str, voice: str) -> list[int]:
        words = self.prompt_template.format(voice=self.check_voice(voice), text=text)
        ids = tokenizer.encode(words, add_special_tokens=self.add_bos)
        return [*self.prefix_ids, *ids, *self.suffix_ids]


CLONED_VOICE = ""
"""The voice of a clone from a reference clip: no speaker prompt, the globals alone
(Spark-TTS's prompt-less cloning mode)."""


def check_cloned_voice(voice: str, speaker_globals: Sequence[int] | None) -> None:
    """A cloned voice has no speaker prompt: without its globals there is no voice at all."""
    if voice == CLONED_VOICE and speaker_globals is None:
        raise ValueError('voice "" is a cloned voice with no speaker prompt: it needs its '
                         "speaker globals (its voice file, or speaker_globals)")


@dataclass(frozen=True)
class BiCodecProfile(_Voices):
    """A Spark-TTS-style model: 32 global speaker tokens, then 50 Hz BiCodec semantic tokens.

    A first request is prompted with the speaker and generates the globals itself; a
    continuation request is prompted with captured globals already in place, so the
    model only emits semantic tokens and the voice cannot drift.
    """

    name: str
    voices: tuple[str, ...]
    default_voice: str
    # {voice} and {text}; the model then writes <|start_global_token|> + 32 globals ...
    first_prompt_template: str
    # {voice}, {text} and {globals}: the captured globals rendered as token strings
    continuation_prompt_template: str
    stop_tokens: tuple[str, ...]
    # {text} and {globals}, no speaker: a cloned voice (voice ``CLONED_VOICE``), where only
    # the globals condition the model; empty: this model cannot speak cloned voices
    clone_prompt_template: str = ""
    semantic_token_format: str = "<|bicodec_semantic_{}|>"
    global_token_format: str = "<|bicodec_global_{}|>"
    num_global_tokens: int = 32
    global_codebook_size: int = 4096
    semantic_codebook_size: int = 8192
    codec: CodecKind = "bicodec"
    codec_model: str = "BiCodec"
    sample_rate: int = 16000
    samples_per_token: int = 320
    tokens_per_second: float = 50.0
    sampling: SamplingDefaults = SamplingDefaults(temperature=0.8, top_p=0.95, top_k=50)
    licence: str = ""

    def check_voice(self, voice: str) -> str:
        if voice == CLONED_VOICE and self.clone_prompt_template:
            return voice
        return super().check_voice(voice)

    def check_globals(self, global_ids: Sequence[int]) -> tuple[int, ...]:
        """Exactly ``num_global_tokens`` integers in the codebook (ValueError otherwise)."""
        return check_int_list("speaker_globals", global_ids, 0, self.global_codebook_size - 1,
                              length=self.num_global_tokens)

    def render_globals(self, global_ids: Sequence[int]) -> str:
        return "".join(self.global_token_format.format(g) for g in global_ids)

    def build_prompt(
        self,
        tokenizer: TokenizerLike,
        text: str,
        voice: str,
        global_ids: Sequence[int] | None = None,
    ) -> list[int]:
        voice = self.check_voice(voice)
        if voice == CLONED_VOICE:
            check_cloned_voice(voice, global_ids)
            rendered = self.render_globals(self.check_globals(global_ids))
            words = self.clone_prompt_template.format(text=text, globals=rendered)
        elif global_ids is None:
            words = self.first_prompt_template.format(voice=voice, text=text)
        else:
            rendered = self.render_globals(self.check_globals(global_ids))
            words = self.continuation_prompt_template.format(
                voice=voice, text=text, globals=rendered
            )
        return tokenizer.encode(words, add_special_tokens=False)


ModelProfile = SnacProfile | BiCodecProfile

_SNAC_LICENCE = "snac code: MIT; check the model card of your checkpoint for its weights' licence"

# maya-research/veena-tts model card: <spk_NAME> prompt between human/AI/speech markers,
# audio codes from 128266 in seven 4096-wide bands.
VEENA = SnacProfile(
    name="veena",
    voices=("kavya", "agastya", "maitri", "vinaya"),
    default_voice="kavya",
    prompt_template="<spk_{voice}> {text}",
    prefix_ids=(128259,),  # START_OF_HUMAN
    suffix_ids=(128260, 128261, 128257),  # END_OF_HUMAN, START_OF_AI, START_OF_SPEECH
    stop_token_ids=(128258, 128262),  # END_OF_SPEECH, END_OF_AI
    audio_token_base=128266,
    sampling=SamplingDefaults(temperature=0.4, top_p=0.9, repetition_penalty=1.05),
    licence=_SNAC_LICENCE,
)

# canopylabs/orpheus-3b-0.1-ft: "voice: text" with BOS, then end-of-text/human, start AI/speech.
ORPHEUS = SnacProfile(
    name="orpheus",
    voices=("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe"),
    default_voice="tara",
    prompt_template="{voice}: {text}",
    prefix_ids=(128259,),
    suffix_ids=(128009, 128260, 128261, 128257),
    stop_token_ids=(128258,),
    audio_token_base=128266,
    add_bos=True,
    sampling=SamplingDefaults(temperature=0.6, top_p=0.8, repetition_penalty=1.3),
    licence=_SNAC_LICENCE,
)

# Spark-TTS / Veena3 layout: speaker-conditioned prompt; the model writes 32 globals, then
# semantic tokens. Continuations pre-fill the captured globals.
VEENA3 = BiCodecProfile(
    name="veena3",
    voices=(
        "aarav", "ananya", "arjun", "diya", "ishaan", "kavya",
        "meera", "neel", "priya", "rohan", "saanvi", "vivaan",
    ),
    default_voice="kavya",
    first_prompt_template=(
        "<|task_tts|><|start_speaker|>{voice}<|end_speaker|>"
        "<|start_content|>{text}<|end_content|><|start_global_token|>"
    ),
    continuation_prompt_template=(
        "<|task_tts|><|start_speaker|>{voice}<|end_speaker|>"
        "<|start_content|>{text}<|end_content|>"
        "<|start_global_token|>{globals}<|end_global_token|><|start_semantic_token|>"
    ),
    clone_prompt_template=(
        "<|task_tts|><|start_content|>{text}<|end_content|>"
        "<|start_global_token|>{globals}<|end_global_token|><|start_semantic_token|>"
    ),
    stop_tokens=("<|end_semantic_token|>", "<|im_end|>"),
    licence=(
        "Spark-TTS code: Apache-2.0; its released weights, BiCodec included: "
        "CC BY-NC-SA 4.0 (non-commercial)"
    ),
)

PROFILES: dict[str, ModelProfile] = {p.name: p for p in (VEENA, ORPHEUS, VEENA3)}


def get_profile(name: str) -> ModelProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown model profile {name!r}; known profiles: {', '.join(PROFILES)}"
        ) from None


def resolve_profile(model: str, profile: "str | ModelProfile | None" = None) -> "ModelProfile":
    """The profile a model is read with: the one given, else its folder's manifest, else
    ``VEENA_PROFILE`` (default ``veena``)."""
    prof = profile or read_manifest(model).get("profile") or os.environ.get("VEENA_PROFILE", "veena")
    return get_profile(prof) if isinstance(prof, str) else prof


def register_profile(profile: Any) -> Any:
    """Make ``profile`` known by its name (``get_profile``, ``VEENA_PROFILE``, manifests)."""
    PROFILES[profile.name] = profile
    return profile


def with_overrides(profile: ModelProfile, **changes: object) -> ModelProfile:
    """A copy of ``profile`` with some fields replaced (e.g. other voices or token ids)."""
    return dataclasses.replace(profile, **changes)  # type: ignore[arg-type]
