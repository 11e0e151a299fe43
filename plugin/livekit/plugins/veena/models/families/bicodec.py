"""The BiCodec family (Spark-TTS, Veena3): 32 global speaker tokens, then 50 Hz semantic
tokens. A first request gets its 32 globals from the model, and every later request of the
call is prompted with them pre-filled, so the voice cannot drift afterwards.

A constrained profile (Veena3) captures the globals in a request of its own, restricted to
global tokens, then continues with them. An unconstrained one (Spark-TTS) generates as its
official inference does: one free generation that writes the globals (and whatever the model
writes before them), then speaks; the parser keeps the BiCodec tokens."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from ...codecs.base import Codec, CodecInput
from ...pipeline.engine_options import SamplingOptions
from ...pipeline.family import DecodeShape, InvalidGlobalsError, ModelFamily, register_family
from ...pipeline.pacing import PacingOptions
from ...pipeline.parsing import (
    KIND_GLOBAL,
    KIND_SEMANTIC,
    KIND_STOP,
    BiCodecFramer,
    TokenTable,
)
from ...pipeline.windowing import Window, WindowOptions
from ..profiles import BiCodecProfile


class BiCodecTrack:
    """One request's globals and semantic tokens."""

    def __init__(self, profile: BiCodecProfile, table: TokenTable, request_id: str,
                 captured: Sequence[int] | None) -> None:
        self.framer = BiCodecFramer(profile, table, request_id, captured)
        self.stats = self.framer.stats
        self.steps: list[int] = []

    def feed(self, ids: Sequence[int]) -> int:
        new = self.framer.feed(ids)
        self.steps.extend(new)
        return len(new)

    def window_input(self, w: Window, seed: int) -> CodecInput:
        return CodecInput(
            codes=np.asarray(self.steps[w.start : w.end], dtype=np.int64),
            start_step=w.start,
            seed=seed,
            speaker=np.asarray(self.framer.globals_, dtype=np.int64),
        )

    @property
    def speaker_globals(self) -> tuple[int, ...] | None:
        return tuple(self.framer.globals_) if self.framer.has_globals else None


@register_family
class BiCodecFamily(ModelFamily):
    codec = "bicodec"
    has_speaker_globals = True
    captures_speaker_globals = True
    decode_defaults = DecodeShape(WindowOptions(first=10, new=50, left=40, right=20),
                                  PacingOptions(max_new=160))
    decode_env = "VEENA_BICODEC_WINDOW"
    profile: BiCodecProfile

    def load_codec(self, codec_model: str, device: str, *, cuda_graphs: bool = False,
                   streaming: bool = False) -> Codec:
        """BiCodec decodes windows (``streaming`` is SNAC's: BiCodec's decoder is not
        a stack of convolutions alone)."""
        from ...codecs.bicodec import BiCodecCodec

        return BiCodecCodec.load(codec_model, device=device, cuda_graphs=cuda_graphs)

    def load_speaker_encoder(self, codec_model: str, device: str) -> Any:
        from ...codecs.bicodec import bicodec_dir
        from ...codecs.bicodec_speaker import BiCodecSpeakerEncoder

        if not self.profile.clone_prompt_template:
            raise ValueError(f"model profile {self.profile.name} has no prompt for cloned voices")
        return BiCodecSpeakerEncoder.load(str(bicodec_dir(codec_model)), device=device)

    def token_table(self, tokenizer: Any) -> TokenTable:
        return TokenTable.for_bicodec(self.profile, tokenizer.get_vocab())

    def new_track(self, table: TokenTable, request_id: str,
                  speaker_globals: tuple[int, ...] | None) -> BiCodecTrack:
        return BiCodecTrack(self.profile, table, request_id, speaker_globals)

    def prompt(self, tokenizer: Any, text: str, voice: str,
               speaker_globals: tuple[int, ...] | None, speakers: Sequence[str] = ()
               ) -> list[int]:
        return self.profile.build_prompt(tokenizer, text, voice, speaker_globals)

    def constrain(self, sampling: SamplingOptions, table: TokenTable) -> SamplingOptions:
        stops = sampling.stop_token_ids or table.ids(KIND_STOP)
        if not self.profile.constrained:
            return replace(sampling, stop_token_ids=stops)
        return replace(sampling, stop_token_ids=stops,
                       allowed_token_ids=table.ids(KIND_SEMANTIC, KIND_STOP))

    def capture_sampling(self, sampling: SamplingOptions, table: TokenTable
                         ) -> SamplingOptions | None:
        if not self.profile.constrained:
            return None  # the first request's own generation writes the globals
        n = self.profile.num_global_tokens
        return replace(sampling, max_tokens=n, min_tokens=n, stop_token_ids=(),
                       allowed_token_ids=table.ids(KIND_GLOBAL))

    def round_budget(self, tokens: int) -> int:
        """Capped at the model's own limit (Spark-TTS: 3000 new tokens)."""
        cap = self.profile.max_new_tokens
        return tokens if cap is None else min(tokens, cap)

    def check_globals(self, global_ids: Sequence[int]) -> tuple[int, ...]:
        try:
            return self.profile.check_globals(global_ids)
        except ValueError as e:
            raise InvalidGlobalsError(str(e)) from None
