"""The NeuCodec family's profile (NeuTTS-style models: one FSQ codebook of 65,536 codes,
rendered as added tokens, continuing a reference clip's codes) and its published models:
neutts (NeuTTS Air, neuphonic/neutts-air) and llasa (HKUST Llasa over XCodec2).

A voice of this family is a reference: the clip's codes and their transcript. The prompt
says the transcript and the text (as phonemes for NeuTTS), then the reference's codes, and
the model continues them in the same voice. The voice's ``voice`` string is the transcript;
its codes travel where the other families carry speaker tokens (``speaker_globals``). The
voice "" is no reference at all: the model's own voice, which a later chunk may not keep.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Sequence

from ...pipeline.engine_options import SamplingOptions
from ...validation import check_int_list, check_str
from .base import TokenizerLike

NO_REFERENCE = ""
"""The voice with no reference clip (``voice`` "" and no codes)."""

MAX_TRANSCRIPT_CHARS = 1000
"""The longest reference transcript (a 15 s clip says about 250 characters)."""


def check_transcript(text: object) -> str:
    """A reference clip's transcript: a string of at most ``MAX_TRANSCRIPT_CHARS`` without
    control or format characters (newlines and tabs read as spaces); "" is no reference."""
    check_str("reference transcript", text, max_len=MAX_TRANSCRIPT_CHARS * 4)
    words = " ".join(text.split())
    if len(words) > MAX_TRANSCRIPT_CHARS:
        raise ValueError(f"reference transcript must be at most {MAX_TRANSCRIPT_CHARS} "
                         f"characters, got {len(words)}")
    for ch in words:
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co"):
            raise ValueError(f"reference transcript must not contain control or format "
                             f"characters, got U+{ord(ch):04X}")
    return words


@dataclass(frozen=True)
class NeuCodecProfile:
    """A model that continues a reference clip's codec tokens after its transcript and text.

    Prompt (token ids): ``encode(user_prefix)``, ``text_start``, the reference transcript and
    the text (phonemes where ``phoneme_language`` is set, joined by ``text_joiner``, encoded
    together), ``text_end``, ``encode(assistant_prefix)``, ``speech_start``, one token per
    reference code; the model stops with ``stop_tokens``.
    """

    name: str
    user_prefix: str
    assistant_prefix: str
    text_start: str
    text_end: str
    speech_start: str
    stop_tokens: tuple[str, ...]
    speech_token_format: str
    # espeak-ng language of the prompt's phonemes ("" : the text as written)
    phoneme_language: str = ""
    # what goes between the reference transcript and the text (NeuTTS: a space; Llasa's
    # model card joins them with nothing)
    text_joiner: str = " "
    # True: the user turn (``user_prefix`` and the text) and the assistant turn (up to
    # ``speech_start``) go through the tokenizer's chat template, the last turn left open
    chat_template: bool = False
    codebook_size: int = 65536
    # prompt plus output: the model was trained on this context (longer output is cut)
    max_context: int = 2048
    # a reference shorter than this many codes is refused (about 1 s), and one longer than
    # the most (15 s: Neuphonic's advice is 3-15 s) would leave too little of the context
    min_reference_codes: int = 50
    max_reference_codes: int = 750
    codec: str = "neucodec"
    # the codec checkpoint (a hub id, or a folder of that name beside the model's weights)
    codec_model: str = "neuphonic/neucodec"
    # its decoder's layout: "neucodec" (24 kHz, hop 480) or "xcodec2" (16 kHz, hop 320)
    codec_variant: str = "neucodec"
    # what cloning needs beside the codec checkpoint (``download-files`` fetches them)
    encoder_models: tuple[str, ...] = ("facebook/w2v-bert-2.0",)
    sample_rate: int = 24000
    samples_per_token: int = 480
    tokens_per_second: float = 50.0
    sampling: SamplingOptions = SamplingOptions(temperature=1.0, top_k=50)
    default_voice: str = NO_REFERENCE
    voices: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    languages: tuple[str, ...] = ("en",)
    locale: str = "en-US"
    runaway_s_per_char: float = 0.1
    model_ids: tuple[str, ...] = ()
    prompt_source: str = ""
    licence: str = ""
    # the watermark the reference applies to its output ("perth"; "": none), which
    # VEENA_WATERMARK=auto applies too (``watermark``)
    watermark: str = ""

    def check_voice(self, voice: str, speakers: Sequence[str] = ()) -> str:
        """A voice of this family is a reference transcript ("" : no reference); its codes
        are checked with it by the family (``check_reference``)."""
        return check_transcript(voice)

    def check_codes(self, codes: Sequence[int]) -> tuple[int, ...]:
        """A reference's codes: ``min_reference_codes`` to ``max_reference_codes`` codes,
        each in the codebook (ValueError otherwise)."""
        most = self.max_reference_codes
        if isinstance(codes, (list, tuple)) and len(codes) > most:
            raise ValueError(f"a reference may hold at most {most} codes "
                             f"({most / self.tokens_per_second:g} s of audio: it shares the "
                             f"model's {self.max_context}-token context with the text and "
                             f"its speech), got {len(codes)}")
        codes = check_int_list("reference codes", codes, 0, self.codebook_size - 1)
        if len(codes) < self.min_reference_codes:
            raise ValueError(f"a reference needs at least {self.min_reference_codes} codes "
                             f"({self.min_reference_codes / self.tokens_per_second:g} s of "
                             f"audio), got {len(codes)}")
        return codes

    def render_text(self, text: str) -> str:
        """What the prompt says for ``text``: its phonemes (``phoneme_language``), else the
        text, whitespace collapsed."""
        if not self.phoneme_language:
            return " ".join(text.split())
        from ..phonemes import phonemize

        return phonemize(text, self.phoneme_language)

    def build_prompt(self, tokenizer: TokenizerLike, text: str, transcript: str,
                     codes: Sequence[int]) -> list[int]:
        """The prompt's token ids (see the class); the codes as ``base + code`` through the
        speech tokens' one contiguous range (``families.neucodec.speech_token_table``)."""
        ids = tokenizer.convert_tokens_to_ids
        said = self.render_text(transcript) + self.text_joiner + self.render_text(text)
        speech = [ids(self.speech_token_format.format(0)) + int(c) for c in codes]
        if self.chat_template:
            chat = tokenizer.apply_chat_template(
                [{"role": "user", "content": self.user_prefix + self.text_start + said
                  + self.text_end},
                 {"role": "assistant", "content": self.speech_start}],
                tokenize=False, continue_final_message=True)
            return tokenizer.encode(chat, add_special_tokens=False) + speech
        words = tokenizer.encode(said, add_special_tokens=False)
        return (tokenizer.encode(self.user_prefix) + [ids(self.text_start)] + words
                + [ids(self.text_end)]
                + tokenizer.encode(self.assistant_prefix, add_special_tokens=False)
                + [ids(self.speech_start)] + speech)


_NEUTTS_OPEN = "NeuTTS Open License 1.0 (commercial use only below a revenue cap)"

# neuphonic/neutts-air (Qwen2 0.5B over NeuCodec), prompts as neutts 1.4.1 builds them
# (NeuTTS._apply_chat_template, phoneme input), its sampling (NeuTTS.infer: temperature 1.0,
# top_k 50; _infer_torch: min_new_tokens 50, max_length 2048). Its sibling checkpoints
# (neutts-nano, the 2E models) share the layout under another licence: run them with this
# profile and their own licence terms.
NEUTTS = NeuCodecProfile(
    name="neutts",
    user_prefix="user: Convert the text to speech:",
    assistant_prefix="\nassistant:",
    text_start="<|TEXT_PROMPT_START|>",
    text_end="<|TEXT_PROMPT_END|>",
    speech_start="<|SPEECH_GENERATION_START|>",
    stop_tokens=("<|SPEECH_GENERATION_END|>",),
    speech_token_format="<|speech_{}|>",
    phoneme_language="en-us",
    # transformers' generate with only these set: top_p 1.0 and no repetition penalty
    sampling=SamplingOptions(temperature=1.0, top_k=50, top_p=1.0, repetition_penalty=1.0,
                             min_tokens=50),
    model_ids=("neuphonic/neutts-air",),
    prompt_source="neutts 1.4.1 neutts/neutts.py (NeuTTS._apply_chat_template, phonemes)",
    watermark="perth",  # NeuTTS.__init__: PerthImplicitWatermarker, applied to every output
    licence=("NeuTTS Air weights: Apache-2.0; NeuTTS Nano and 2E weights: " + _NEUTTS_OPEN
             + "; neucodec: Apache-2.0; phonemes through phonemizer and espeak-ng: GPL-3.0 "
             "(the optional [neutts] extra)"),
)

# HKUSTAudio/Llasa-1B/3B/8B (Llama over XCodec2: 16 kHz, hop 320, <|s_N|> tokens), the
# prompt of its model card's cloning example: the tokenizer's own chat template (Llasa's is
# Llama-3.2-Instruct's, which opens with a system header holding the day it runs) over a user
# turn "Convert the text to speech:" with the transcript and the text, joined with nothing
# between them, between <|TEXT_UNDERSTANDING_START|> and <|TEXT_UNDERSTANDING_END|>, and an
# assistant turn opened with <|SPEECH_GENERATION_START|> and the reference's codes, continued.
# Equal token for token to the card's own lines: tests/golden/llasa, tests/models/test_llasa.py.
LLASA = NeuCodecProfile(
    name="llasa",
    user_prefix="Convert the text to speech:",
    assistant_prefix="",
    chat_template=True,
    text_joiner="",
    text_start="<|TEXT_UNDERSTANDING_START|>",
    text_end="<|TEXT_UNDERSTANDING_END|>",
    speech_start="<|SPEECH_GENERATION_START|>",
    stop_tokens=("<|SPEECH_GENERATION_END|>",),
    speech_token_format="<|s_{}|>",
    codec_model="HKUSTAudio/xcodec2",
    codec_variant="xcodec2",
    sample_rate=16000,
    samples_per_token=320,
    model_ids=("HKUSTAudio/Llasa-1B", "HKUSTAudio/Llasa-3B", "HKUSTAudio/Llasa-8B"),
    prompt_source="HKUSTAudio/Llasa-1B model card (voice cloning example: golden ids)",
    licence="Llasa weights: CC-BY-NC-4.0 (non-commercial); XCodec2 weights: CC-BY-NC-4.0",
    # the model card's generate (do_sample, top_p 1, temperature 0.8): no repetition penalty
    sampling=SamplingOptions(temperature=0.8, top_p=1.0, repetition_penalty=1.0),
)
