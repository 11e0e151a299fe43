"""Model profiles: every per-model fact (prompt format, token ids, voices, codec) in one place.

The pipeline never hard-codes a token id; it asks the profile. Users override any field with
``with_overrides(VEENA, voices=(...))`` and make their own profile known by name with
``register_profile``. A profile's ``codec`` field picks its model family (``families``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, Sequence

from ..validation import check_int_list, check_str

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
    min_tokens: int = 0


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


class _Voices:
    """Voice checking shared by every profile (each has ``name``, ``voices``,
    ``voice_prompts`` and ``described_voices``)."""

    name: str
    voices: tuple[str, ...]
    # defaults for a profile of a family of its own that does not declare them (not fields)
    voice_prompts: tuple[tuple[str, str], ...] = ()
    described_voices: bool = False
    tags: tuple[str, ...] = ()

    def check_voice(self, voice: str) -> str:
        """A named voice, or (``described_voices``) a description checked by
        ``check_description``; ValueError otherwise, before any engine work."""
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
    # True: a voice may also be a description in words (Maya1); ``voices`` are presets
    described_voices: bool = False
    # what {voice} stands for in the prompt, per preset (absent: the voice itself)
    voice_prompts: tuple[tuple[str, str], ...] = ()
    # the expressive tags the model performs (``<laugh>``); any other tag is removed
    tags: tuple[str, ...] = ()
    # True: only ``stop_token_ids`` end a request, never the tokenizer's EOS (Maya1's
    # prompt carries 128009 and its generation must not stop on it)
    ignore_eos: bool = False
    # frames the model's reference drops at the start of each generation (the decoder's
    # warm-up): Maya1's transformers_inference.py cuts ``audio[2048:]`` ("Trim warmup") and
    # its vLLM streaming reference never outputs frame 0
    trim_start_frames: int = 0
    prompt_source: str = ""
    # hub ids of checkpoints this profile reads (picked for them when no profile is named)
    model_ids: tuple[str, ...] = ()
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
        voice = self.render_voice(self.check_voice(voice))
        words = self.prompt_template.format(voice=voice, text=text)
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
    # {voice} and {text}; the model then writes its 32 globals (and, constrained, nothing else)
    first_prompt_template: str
    # {voice}, {text} and {globals}: the captured globals rendered as token strings
    continuation_prompt_template: str
    stop_tokens: tuple[str, ...]
    # {text} and {globals}, no speaker: a cloned voice (voice ``CLONED_VOICE``), where only
    # the globals condition the model; empty: this model cannot speak cloned voices
    clone_prompt_template: str = ""
    # what {voice} stands for in the prompts, per voice (absent: the voice's name itself)
    voice_prompts: tuple[tuple[str, str], ...] = ()
    described_voices: bool = False
    # no BiCodec model publishes expressive tags: every tag is removed from its text
    tags: tuple[str, ...] = ()
    # True: a first request captures exactly 32 globals in a request of its own, restricted
    # to global tokens, and every request after it is restricted to semantic and stop tokens
    # (the prompts must then end where the model's next token is audio). False: the model
    # generates as its own inference code lets it (any token; the parser keeps the BiCodec
    # ones), and a first request is one generation that writes its globals, then speaks.
    constrained: bool = True
    # the most tokens one request may generate (None: only the per-text budget)
    max_new_tokens: int | None = None
    # hub ids of checkpoints this profile reads (picked for them when no profile is named)
    model_ids: tuple[str, ...] = ()
    # the LLM's folder inside a checkpoint that keeps it beside BiCodec/ (Spark-TTS: LLM/)
    llm_folder: str = ""
    # where the prompt format comes from; "UNVERIFIED ..." where it is a guess
    prompt_source: str = ""
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
            words = self.first_prompt_template.format(voice=self.render_voice(voice), text=text)
        else:
            rendered = self.render_globals(self.check_globals(global_ids))
            words = self.continuation_prompt_template.format(
                voice=self.render_voice(voice), text=text, globals=rendered
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
    model_ids=("maya-research/veena-tts",),
    licence=_SNAC_LICENCE,
)

ORPHEUS_TAGS = ("laugh", "chuckle", "sigh", "cough", "sniffle", "groan", "yawn", "gasp")
"""The tags canopylabs/orpheus-3b-0.1-ft's model card documents."""

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
    tags=ORPHEUS_TAGS,
    model_ids=("canopylabs/orpheus-3b-0.1-ft",),
    sampling=SamplingDefaults(temperature=0.6, top_p=0.8, repetition_penalty=1.3),
    licence=_SNAC_LICENCE,
)

MAYA1_TAGS = (
    "angry", "appalled", "chuckle", "cry", "curious", "disappointed", "excited", "exhale",
    "gasp", "giggle", "gulp", "laugh", "laugh_harder", "mischievous", "sarcastic", "scream",
    "sigh", "sing", "snort", "whisper",
)
"""maya-research/maya1's emotion tags, each a single token of its tokenizer."""

# Presets: short names for descriptions written in Maya1's published style (our words).
MAYA1_PRESETS = (
    ("ava", "Realistic female voice in her 30s with an American accent. Normal pitch, warm "
            "timbre, conversational pacing."),
    ("noah", "Realistic male voice in his 40s with an American accent. Low pitch, calm and "
             "steady, measured pacing."),
    ("isla", "Young female voice in her 20s with a British accent. Bright timbre, friendly "
             "and upbeat, quick pacing."),
    ("arjun", "Male voice in his 30s with an Indian English accent. Medium pitch, clear and "
              "confident, conversational pacing."),
    ("narrator", "Mature male narrator in his 50s with a neutral accent. Deep pitch, rich "
                 "timbre, slow and expressive storytelling."),
)

# maya-research/maya1 model card and its vLLM streaming reference: SOH, BOS, then
# <description="..."> and the text, then EOT (in the prompt, not a stop), EOH, SOA, SOS; only
# END_OF_SPEECH stops; at least 4 frames (min_tokens 28); context 8192.
MAYA1 = SnacProfile(
    name="maya1",
    voices=tuple(name for name, _ in MAYA1_PRESETS),
    default_voice="ava",
    prompt_template='<description="{voice}"> {text}',
    prefix_ids=(128259, 128000),  # START_OF_HUMAN, BOS
    suffix_ids=(128009, 128260, 128261, 128257),  # EOT, END_OF_HUMAN, START_OF_AI, SOS
    stop_token_ids=(128258,),  # END_OF_SPEECH only
    audio_token_base=128266,
    described_voices=True,
    voice_prompts=MAYA1_PRESETS,
    tags=MAYA1_TAGS,
    ignore_eos=True,
    trim_start_frames=1,
    model_ids=("maya-research/maya1",),
    sampling=SamplingDefaults(temperature=0.4, top_p=0.9, repetition_penalty=1.1,
                              min_tokens=28),
    prompt_source="maya-research/maya1 model card and its vLLM streaming reference",
    licence="Apache-2.0 (maya-research/maya1 weights and code); snac code: MIT",
)

_SPARK_LICENCE = ("Spark-TTS code: Apache-2.0; its released weights, BiCodec included: "
                  "CC BY-NC-SA 4.0 (non-commercial)")

SPARK_GENDERS = ("female", "male")
"""``<|gender_0|>``, ``<|gender_1|>`` (``sparktts/utils/token_parser.py``, GENDER_MAP)."""
SPARK_LEVELS = ("very_low", "low", "moderate", "high", "very_high")
"""``<|pitch_label_N|>`` / ``<|speed_label_N|>``, N = 0..4 (LEVELS_MAP)."""


def spark_voice(gender: str, pitch: str = "moderate", speed: str = "moderate") -> str:
    """The ``spark`` profile's name for a controllable voice, e.g. ``female-moderate-high``."""
    if gender not in SPARK_GENDERS or pitch not in SPARK_LEVELS or speed not in SPARK_LEVELS:
        raise ValueError(f"a Spark voice is gender ({'/'.join(SPARK_GENDERS)}), pitch and speed "
                         f"({'/'.join(SPARK_LEVELS)})")
    return f"{gender}-{pitch}-{speed}"


def _spark_style_tokens(voice: str) -> str:
    gender, pitch, speed = voice.split("-")
    return (f"<|gender_{SPARK_GENDERS.index(gender)}|><|pitch_label_{SPARK_LEVELS.index(pitch)}|>"
            f"<|speed_label_{SPARK_LEVELS.index(speed)}|>")


_SPARK_VOICES = tuple(spark_voice(g, p, s) for g in SPARK_GENDERS for p in SPARK_LEVELS
                      for s in SPARK_LEVELS)

# SparkAudio/Spark-TTS-0.5B, prompts as its cli/SparkTTS.py builds them. Named voices are
# controllable TTS (process_prompt_control): the style labels, after which the model writes
# its own globals and speaks, in one generation. Later requests of the same call, and cloned
# voices, use the voice-cloning prompt (process_prompt without a transcript) with those
# globals: the only published prompt that takes globals, so a continuation keeps the voice's
# globals (its timbre and pitch), not its speed label. Generation is free, as in the official
# inference (its regex keeps the BiCodec tokens); its sampling and 3000-token cap.
SPARK = BiCodecProfile(
    name="spark",
    voices=_SPARK_VOICES,
    default_voice=spark_voice("female"),
    first_prompt_template=(
        "<|task_controllable_tts|><|start_content|>{text}<|end_content|>"
        "<|start_style_label|>{voice}<|end_style_label|>"
    ),
    continuation_prompt_template=(
        "<|task_tts|><|start_content|>{text}<|end_content|>"
        "<|start_global_token|>{globals}<|end_global_token|>"
    ),
    clone_prompt_template=(
        "<|task_tts|><|start_content|>{text}<|end_content|>"
        "<|start_global_token|>{globals}<|end_global_token|>"
    ),
    voice_prompts=tuple((v, _spark_style_tokens(v)) for v in _SPARK_VOICES),
    stop_tokens=("<|im_end|>",),
    constrained=False,
    max_new_tokens=3000,
    llm_folder="LLM",
    model_ids=("SparkAudio/Spark-TTS-0.5B",),
    sampling=SamplingDefaults(temperature=0.8, top_p=0.95, top_k=50, repetition_penalty=1.0),
    prompt_source="SparkAudio/Spark-TTS cli/SparkTTS.py (process_prompt, process_prompt_control)",
    licence=_SPARK_LICENCE,
)

# Veena3: a Spark-TTS-layout model whose prompt format is NOT public. The speaker prompt
# (<|start_speaker|>NAME<|end_speaker|>, a token Spark-TTS does not have) and the
# <|start_semantic_token|> that ends its continuation and clone prompts are an UNVERIFIED
# guess, kept so that such a checkpoint can be tried; replace them with ``with_overrides``
# once the real format is known. Generation is constrained (globals alone, then semantic
# tokens), so every prompt ends where audio tokens follow. Its sampling (repetition penalty
# 1.05, no token cap) is ours too, not a published default.
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
    prompt_source="UNVERIFIED: Veena3's prompt format is not public; this template is a guess",
    licence=_SPARK_LICENCE,
)

PROFILES: dict[str, ModelProfile] = {
    p.name: p for p in (VEENA, ORPHEUS, MAYA1, VEENA3, SPARK)
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
