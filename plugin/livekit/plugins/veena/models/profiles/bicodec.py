"""The BiCodec family's profile (Spark-TTS-style models: global speaker tokens, then 50 Hz
semantic tokens) and the published BiCodec models: spark and veena3."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ...pipeline.engine_options import SamplingOptions
from ...validation import check_int_list
from .base import (
    CLONED_VOICE,
    CodecKind,
    TokenizerLike,
    VoiceChecks,
    check_cloned_voice,
)


@dataclass(frozen=True)
class BiCodecProfile(VoiceChecks):
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
    # the languages its text is normalised in (``normalization``; text of no known script is
    # read in the locale's language where listed, else the first) and the locale that orders
    # dates and groups digits
    languages: tuple[str, ...] = ("en",)
    locale: str = "en-US"
    # the runaway guard's seconds of audio per character of text (``pipeline.guards``): about
    # 1.5x a slow speaker's, so a long pause or a tag's laugh stays within it
    runaway_s_per_char: float = 0.1
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
    sampling: SamplingOptions = SamplingOptions(temperature=0.8, top_p=0.95, top_k=50)
    licence: str = ""

    def check_voice(self, voice: str, speakers: Sequence[str] = ()) -> str:
        if voice == CLONED_VOICE and self.clone_prompt_template:
            return voice
        return super().check_voice(voice, speakers)

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
    languages=("zh", "en"),
    locale="zh-CN",
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
    sampling=SamplingOptions(temperature=0.8, top_p=0.95, top_k=50, repetition_penalty=1.0),
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
    languages=("hi", "en"),
    locale="en-IN",
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
