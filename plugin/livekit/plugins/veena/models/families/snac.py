"""The SNAC family (Orpheus, Veena): 7 tokens per 2048-sample frame, no speaker tokens, so a
voice stays the same across requests by its speaker prompt and seed alone."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...codecs.base import Codec, CodecInput
from ...pipeline.family import DecodeShape, ModelFamily, register_family
from ...pipeline.pacing import PacingOptions
from ...pipeline.parsing import SnacFramer, TokenTable
from ...pipeline.windowing import Window, WindowOptions
from ..profiles import SnacProfile


class SnacTrack:
    """One request's SNAC frames."""

    def __init__(self, profile: SnacProfile, table: TokenTable, request_id: str) -> None:
        self._framer = SnacFramer(profile, table, request_id)
        self.stats = self._framer.stats
        self.steps: list[np.ndarray] = []

    def feed(self, ids: Sequence[int]) -> int:
        frames = self._framer.feed(ids)
        self.steps.extend(frames)
        return len(frames)

    def window_input(self, w: Window, seed: int) -> CodecInput:
        # np.array, not np.stack: the same [frames, 7] array for a third of the cost per window
        return CodecInput(codes=np.array(self.steps[w.start : w.end]), start_step=w.start,
                          seed=seed)

    @property
    def speaker_globals(self) -> tuple[int, ...] | None:
        return None


@register_family
class SnacFamily(ModelFamily):
    codec = "snac"
    decode_defaults = DecodeShape(WindowOptions(first=2, new=8, left=2, right=2),
                                  PacingOptions(max_new=32))
    decode_env = "VEENA_SNAC_WINDOW"
    profile: SnacProfile

    def load_codec(self, codec_model: str, device: str, *, cuda_graphs: bool = False,
                   streaming: bool = False) -> Codec:
        from ...codecs.snac import SnacCodec

        return SnacCodec.load(codec_model, device=device, cuda_graphs=cuda_graphs,
                              position_levels=self.profile.position_levels,
                              streaming=streaming)

    def token_table(self, tokenizer: Any) -> TokenTable:
        return TokenTable.for_snac(self.profile)

    def new_track(self, table: TokenTable, request_id: str,
                  speaker_globals: tuple[int, ...] | None) -> SnacTrack:
        return SnacTrack(self.profile, table, request_id)

    def prompt(self, tokenizer: Any, text: str, voice: str,
               speaker_globals: tuple[int, ...] | None, speakers: Sequence[str] = ()
               ) -> list[int]:
        return self.profile.build_prompt(tokenizer, text, voice, speakers)

    def adapter_voice(self, adapter: str) -> str:
        """A named-speaker model says the adapter's name (``<spk_acme>``, ``acme: text``: the
        fine-tune convention); Maya1 keeps its default description."""
        return self.profile.default_voice if self.profile.described_voices else adapter

    def round_budget(self, tokens: int) -> int:
        return tokens + -tokens % self.profile.tokens_per_frame

    def tokens_per_step(self) -> int:
        return self.profile.tokens_per_frame
