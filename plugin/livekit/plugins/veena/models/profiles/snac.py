"""The SNAC family's profile (Orpheus-style models: a Llama speaking SNAC 24 kHz codes) and
the published SNAC models: veena, orpheus and maya1."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ...pipeline.engine_options import SamplingOptions
from .base import CodecKind, TokenizerLike, VoiceChecks


@dataclass(frozen=True)
class SnacProfile(VoiceChecks):
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
    # what the parser does with an audio token outside its band, as the model's reference
    # does (``parsing.OUT_OF_RANGE_POLICIES``)
    out_of_range_codes: str = "drop_frame"
    # True: the reference hands its prompt to the tokenizer (or to vLLM) as a string with the
    # tokenizer's special tokens on, so a tokenizer that prepends BOS puts one more before
    # everything; ``build_prompt`` asks the loaded tokenizer and sends the same
    reference_string_prompt: bool = False
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
    # the model card's own cap on new tokens per request, (a, b, c, d) for
    # min(int(len(text) * a) * b + c, d): a chunk's default budget is at most this (a
    # max_tokens the caller gives is theirs)
    card_max_new_tokens: tuple[float, int, int, int] | None = None
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
    codec: CodecKind = "snac"
    codec_model: str = "hubertsiuzdak/snac_24khz"
    sample_rate: int = 24000
    samples_per_frame: int = 2048
    tokens_per_frame: int = 7
    codebook_size: int = 4096
    # codebook level of each interleave position: [c0, c1a, c2a, c2b, c1b, c2c, c2d]
    position_levels: tuple[int, ...] = (0, 1, 2, 2, 1, 2, 2)
    tokens_per_second: float = 7 * 24000 / 2048
    sampling: SamplingOptions = SamplingOptions()
    licence: str = ""

    @property
    def vocab_end(self) -> int:
        """One past the highest audio token id."""
        return self.audio_token_base + self.tokens_per_frame * self.codebook_size

    def build_prompt(self, tokenizer: TokenizerLike, text: str, voice: str,
                     speakers: Sequence[str] = ()) -> list[int]:
        """``speakers``: names a LoRA adapter adds (``check_voice``), in the same template."""
        voice = self.render_voice(self.check_voice(voice, speakers))
        lead = leading_bos(tokenizer) if self.reference_string_prompt else ()
        words = self.prompt_template.format(voice=voice, text=text)
        ids = tokenizer.encode(words, add_special_tokens=self.add_bos)
        return [*lead, *self.prefix_ids, *ids, *self.suffix_ids]


def leading_bos(tokenizer: TokenizerLike) -> tuple[int, ...]:
    """The ids a tokenizer puts before any text with its special tokens on: (BOS,) for a
    Llama-3 tokenizer, () for one that adds nothing. Read from its own behaviour, not from
    its config, since that is what the reference's ``tokenizer(prompt)`` does."""
    plain = tokenizer.encode("x", add_special_tokens=False)
    full = tokenizer.encode("x", add_special_tokens=True)
    if len(full) > len(plain) and full[len(full) - len(plain):] == plain:
        return tuple(full[:len(full) - len(plain)])
    return ()


_SNAC_LICENCE = "snac code: MIT; check the model card of your checkpoint for its weights' licence"

# maya-research/veena-tts model card: <spk_NAME> prompt between human/AI/speech markers,
# audio codes from 128266 in seven 4096-wide bands.
VEENA = SnacProfile(
    name="veena",
    languages=("hi", "en"),
    locale="en-IN",
    voices=("kavya", "agastya", "maitri", "vinaya"),
    default_voice="kavya",
    prompt_template="<spk_{voice}> {text}",
    prefix_ids=(128259,),  # START_OF_HUMAN
    suffix_ids=(128260, 128261, 128257),  # END_OF_HUMAN, START_OF_AI, START_OF_SPEECH
    stop_token_ids=(128258, 128262),  # END_OF_SPEECH, END_OF_AI
    audio_token_base=128266,
    sampling=SamplingOptions(temperature=0.4, top_p=0.9, repetition_penalty=1.05),
    # the card's sample: max_new_tokens = min(int(len(text) * 1.3) * 7 + 21, 700)
    card_max_new_tokens=(1.3, 7, 21, 700),
    out_of_range_codes="end_chunk",  # the card's decode raises on a code out of range
    model_ids=("maya-research/veena-tts",),
    licence=_SNAC_LICENCE,
)

ORPHEUS_TAGS = ("laugh", "chuckle", "sigh", "cough", "sniffle", "groan", "yawn", "gasp")
"""The tags canopylabs/orpheus-3b-0.1-ft's model card documents."""

# canopyai/Orpheus-TTS orpheus_tts/engine_class.py ``_format_prompt``: START_OF_HUMAN, the
# tokenizer's ids of "voice: text" (with its BOS), END_OF_TEXT, END_OF_HUMAN, START_OF_AI,
# START_OF_SPEECH; those ids are decoded to a string that vLLM tokenises again, with specials
# on: a tokenizer that prepends BOS puts one more first (``reference_string_prompt``). Stop
# on END_OF_SPEECH 128258, as the package's realtime streaming example passes it (its
# ``generate_tokens_sync`` default, 49158, is not an id of this tokenizer's layout).
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
    reference_string_prompt=True,
    out_of_range_codes="skip_token",  # decoder.py: dropped, the position not advanced
    tags=ORPHEUS_TAGS,
    model_ids=("canopylabs/orpheus-3b-0.1-ft",),
    sampling=SamplingOptions(temperature=0.6, top_p=0.8, repetition_penalty=1.3),
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

# maya-research/maya1 model card (its transformers example builds the prompt as one string):
# SOH, BOS, then <description="..."> and the text, then EOT (in the prompt, not a stop), EOH,
# SOA, SOS, tokenised with the tokenizer's specials on, so a tokenizer that prepends BOS puts
# one more first (``reference_string_prompt``); only END_OF_SPEECH stops; at least 4 frames
# (min_tokens 28); context 8192.
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
    reference_string_prompt=True,
    out_of_range_codes="wrap",  # its unpacking takes (id - base) % 4096 for every slot
    trim_start_frames=1,
    model_ids=("maya-research/maya1",),
    sampling=SamplingOptions(temperature=0.4, top_p=0.9, repetition_penalty=1.1,
                              min_tokens=28),
    prompt_source="maya-research/maya1 model card (transformers example)",
    licence="Apache-2.0 (maya-research/maya1 weights and code); snac code: MIT",
)
