"""The NeuCodec family (NeuTTS Air; Llasa over XCodec2): one codec token per 50 Hz step, a
voice that is a reference clip (its codes and its transcript), and a model that continues the
reference's codes in the same voice.

Every request of a call is prompted with the same reference, so the voice stays without any
capture. The reference's last codes are also the first windows' left context, so the first
audio decodes as the continuation it is rather than from silence. Prompt plus output must fit
the model's context (2048 tokens for NeuTTS): the reference's share of it sets how much text
one request may carry.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np

from ...codecs.base import Codec, CodecInput
from ...pipeline.engine_options import SamplingOptions
from ...pipeline.family import DecodeShape, InvalidGlobalsError, ModelFamily, register_family
from ...pipeline.pacing import PacingOptions
from ...pipeline.parsing import KIND_SEMANTIC, KIND_STOP, ParseStats, TokenTable
from ...pipeline.windowing import Window, WindowOptions
from ..profiles.neucodec import NO_REFERENCE, NeuCodecProfile, check_transcript


def speech_token_table(profile: NeuCodecProfile, vocab: Mapping[str, int]) -> TokenTable:
    """The lookup table of a tokenizer whose ``codebook_size`` speech tokens form ONE
    contiguous id range in code order (as they were added), with the prompt's and the stop's
    tokens present; ValueError for any other tokenizer (a prompt's codes are written as
    ``base + code``, and a gap would shift every code after it)."""
    fmt, n = profile.speech_token_format, profile.codebook_size
    base = vocab.get(fmt.format(0))
    if base is None:
        raise ValueError(f"the tokenizer has no {fmt.format(0)!r} token: is it a "
                         f"{profile.name} tokenizer?")
    for code in range(n):
        if vocab.get(fmt.format(code)) != base + code:
            raise ValueError(
                f"the tokenizer's {fmt.format('N')} tokens are not one contiguous id range "
                f"from {base} in code order: {fmt.format(code)!r} is "
                f"{vocab.get(fmt.format(code))!r}, not {base + code}")
    needed = (profile.text_start, profile.text_end, profile.speech_start, *profile.stop_tokens)
    missing = [t for t in needed if t not in vocab]
    if missing:
        raise ValueError(f"the tokenizer lacks the {profile.name} prompt tokens "
                         f"{', '.join(missing)}")
    size = max(max(vocab.values()) + 1, base + n)
    kind = np.zeros(size, dtype=np.int8)
    value = np.full(size, -1, dtype=np.int64)
    kind[base : base + n] = KIND_SEMANTIC
    value[base : base + n] = np.arange(n)
    for stop in profile.stop_tokens:
        kind[vocab[stop]] = KIND_STOP
    return TokenTable(kind, value)


class NeuCodecTrack:
    """One request's codec steps (one code per token), and the reference it continues."""

    def __init__(self, table: TokenTable, reference: tuple[int, ...] | None,
                 left: int) -> None:
        self._kind, self._value = table.as_lists()
        self._reference = reference or ()
        self._left = left
        self.stats = ParseStats()
        self.steps: list[int] = []

    def feed(self, ids: Sequence[int]) -> int:
        kind, value, size, stats = self._kind, self._value, len(self._kind), self.stats
        before = len(self.steps)
        for tid in ids:
            stats.tokens += 1
            k = kind[tid] if 0 <= tid < size else 0
            if k == KIND_SEMANTIC:
                self.steps.append(value[tid])
            elif k == KIND_STOP:
                stats.stopped = True
                break
            else:
                stats.other_tokens += 1
        new = len(self.steps) - before
        stats.frames += new
        return new

    def window_input(self, w: Window, seed: int) -> CodecInput:
        """A window's codes, led by the reference's last codes where its left context would
        reach before the utterance's first step."""
        missing = self._left - (w.keep_start - w.start) if w.start == 0 else 0
        context = self._reference[max(0, len(self._reference) - missing):] if missing > 0 else ()
        codes = np.asarray((*context, *self.steps[w.start : w.end]), dtype=np.int64)
        return CodecInput(codes=codes, start_step=w.start, seed=seed,
                          context_steps=len(context))

    @property
    def speaker_globals(self) -> tuple[int, ...] | None:
        """The reference's codes (given with the voice, never captured)."""
        return self._reference or None


@register_family
class NeuCodecFamily(ModelFamily):
    codec = "neucodec"
    has_speaker_globals = True
    # bench/neucodec_stream.py (full-size random NeuCodec, beside Neuphonic's scheme): 1.55x
    # one pass's decode work, half the error of its 3.23x windows, first audio after 25 codes
    decode_defaults = DecodeShape(WindowOptions(first=20, new=100, left=30, right=5),
                                  PacingOptions(max_new=160))
    decode_env = "VEENA_NEUCODEC_WINDOW"
    profile: NeuCodecProfile

    def __init__(self, profile: Any) -> None:
        super().__init__(profile)
        self._left = self.decode_defaults.window.left

    def decode_shape(self, overrides: Mapping[str, DecodeShape]) -> DecodeShape:
        """Also notes the windows' left context: the reference fills it for the first."""
        shape = super().decode_shape(overrides)
        self._left = shape.window.left
        return shape

    def load_codec(self, codec_model: str, device: str, *, cuda_graphs: bool = False,
                   streaming: bool = False) -> Codec:
        """NeuCodec decodes bounded windows (its decoder attends over the whole window);
        XCodec2 (Llasa) is the same decoder at 16 kHz, hop 320."""
        from ...codecs.neucodec import NeuCodecCodec
        from ...codecs.neucodec_model import XCODEC2_CONFIG

        config = XCODEC2_CONFIG if self.profile.codec_variant == "xcodec2" else None
        codec = NeuCodecCodec.load(codec_model, device=device, cuda_graphs=cuda_graphs,
                                   config=config)
        if (codec.sample_rate, codec.samples_per_step) != (self.profile.sample_rate,
                                                           self.profile.samples_per_token):
            raise ValueError(f"codec checkpoint {codec_model} decodes {codec.sample_rate} Hz "
                             f"at hop {codec.samples_per_step}; profile {self.profile.name} "
                             f"needs {self.profile.sample_rate} Hz at hop "
                             f"{self.profile.samples_per_token}")
        return codec

    def load_speaker_encoder(self, codec_model: str, device: str) -> Any:
        """A reference clip -> its codes (``voice clone``): NeuCodec's encoder, or XCodec2's
        (Llasa) where the profile's codec is that variant."""
        from ...codecs.neucodec_encoder import NeuCodecEncoder

        return NeuCodecEncoder.load(codec_model, device=device,
                                    variant=self.profile.codec_variant)

    def token_table(self, tokenizer: Any) -> TokenTable:
        """Checked as the pipeline starts, with what its prompts need: the tokenizer's
        speech and prompt tokens, and espeak-ng where the prompt is phonemes
        (``PhonemizerMissingError`` names the extra to install)."""
        if self.profile.phoneme_language:
            from ..phonemes import check_phonemizer

            check_phonemizer(self.profile.phoneme_language)
        return speech_token_table(self.profile, tokenizer.get_vocab())

    def new_track(self, table: TokenTable, request_id: str,
                  speaker_globals: tuple[int, ...] | None) -> NeuCodecTrack:
        return NeuCodecTrack(table, speaker_globals, self._left)

    def prompt(self, tokenizer: Any, text: str, voice: str,
               speaker_globals: tuple[int, ...] | None, speakers: Sequence[str] = ()
               ) -> list[int]:
        return self.profile.build_prompt(tokenizer, text, voice, speaker_globals or ())

    def voice_prompt_tokens(self, tokenizer: Any, voice: str,
                            speaker_globals: tuple[int, ...] | None) -> int:
        """The prompt without text: the reference's transcript and codes, and the frame."""
        return len(self.prompt(tokenizer, "", voice, speaker_globals))

    def check_voice(self, voice: Any, speaker_globals: Sequence[int] | None,
                    speakers: Sequence[str] = ()) -> tuple[str, tuple[int, ...] | None]:
        """A reference (a transcript and its codes, both or neither); ValueError for a
        transcript without codes or codes without their transcript."""
        transcript = self.profile.check_voice(voice)
        codes = None if speaker_globals is None else self.check_globals(speaker_globals)
        if transcript == NO_REFERENCE and codes is not None:
            raise ValueError("a reference's codes need their transcript: the voice is what the "
                             "reference clip says (veena-tts voice clone CLIP --text ...)")
        if transcript != NO_REFERENCE and codes is None:
            raise ValueError(f"voice {voice[:60]!r} is not a voice of {self.profile.name}: a "
                             "voice is a reference clip's codes and transcript (a voice file "
                             "or a saved voice: veena-tts voice clone CLIP --text ...)")
        return transcript, codes

    def cloned_voice(self, transcript: str | None) -> str:
        """A clone is its clip's codes and what the clip says: the transcript is required."""
        if transcript is None or not check_transcript(transcript):
            raise ValueError(f"a {self.profile.name} voice needs the reference clip's "
                             "transcript: what the clip says, word for word (--text)")
        return check_transcript(transcript)

    def check_globals(self, global_ids: Sequence[int]) -> tuple[int, ...]:
        try:
            return self.profile.check_codes(global_ids)
        except ValueError as e:
            raise InvalidGlobalsError(str(e)) from None

    def constrain(self, sampling: SamplingOptions, table: TokenTable) -> SamplingOptions:
        """Stops at the end-of-speech token; generation is otherwise free, as in the
        reference (the parser keeps the speech tokens)."""
        return replace(sampling, stop_token_ids=sampling.stop_token_ids or table.ids(KIND_STOP))
