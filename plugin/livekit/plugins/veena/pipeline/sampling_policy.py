"""How one request samples, beyond what its caller asked: the model card's defaults, a token
budget per text (which stops runaway generation), the family's constraints, and a slower
hand-over for a chunk whose audio waits behind another."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from .engine_options import SamplingOptions
from .family import ModelFamily
from .options import PipelineOptions
from .parsing import TokenTable


class SamplingPolicy:
    def __init__(self, profile: Any, family: ModelFamily, options: PipelineOptions,
                 max_model_len: int) -> None:
        self._profile = profile
        self._family = family
        self._options = options
        self._max_model_len = max_model_len

    def defaults(self) -> SamplingOptions:
        """The model card's sampling with the model's stop rules (the budget is per text)."""
        return self._family.default_sampling()

    def max_chars_per_request(self) -> int:
        """The longest text whose prompt plus token budget fits the model context."""
        tokens_per_s = self._profile.tokens_per_second
        per_char = self._options.max_audio_s_per_char * tokens_per_s + 1.5
        fixed = 2.0 * tokens_per_s + 96
        return max(16, int((self._max_model_len - fixed) / per_char))

    def token_budget(self, text: str, prompt_len: int) -> int:
        """At most ``max_audio_s_per_char`` of audio per character (plus 2 s), within the
        model context."""
        seconds = 2.0 + self._options.max_audio_s_per_char * len(text)
        budget = self._family.round_budget(
            int(math.ceil(seconds * self._profile.tokens_per_second)))
        return max(1, min(budget, self._max_model_len - prompt_len))

    def card_cap(self, text: str) -> int:
        """The model card's cap on one request's new tokens for ``text`` (Veena's sample:
        ``min(int(len(text) * 1.3) * 7 + 21, 700)``); unbounded where the card sets none."""
        rule = getattr(self._profile, "card_max_new_tokens", None)
        if rule is None:
            return 1 << 30
        per_char, scale, extra, most = rule
        return min(int(len(text) * per_char) * scale + extra, most)

    def queued(self, sampling: SamplingOptions) -> SamplingOptions:
        """``sampling`` for a chunk whose audio waits behind a chunk still generating: its
        tokens handed over once per ``queued_output_steps`` codec steps."""
        steps = self._options.queued_output_steps
        if steps == 0:
            return sampling
        interval = steps * self._family.tokens_per_step()
        return replace(sampling, stream_interval=max(sampling.stream_interval, interval))

    def main(self, sampling: SamplingOptions, text: str, prompt_len: int,
             table: TokenTable) -> SamplingOptions:
        """The main request's sampling: the token budget for ``text`` and the family's
        constraints."""
        budget = self.token_budget(text, prompt_len)
        if sampling.max_tokens is None:  # the default: within the model card's cap, if any
            max_tokens = min(budget, self.card_cap(text))
        else:
            max_tokens = min(sampling.max_tokens, budget)
        s = replace(sampling, max_tokens=max_tokens,
                    min_tokens=min(sampling.min_tokens, max_tokens))
        return self._family.constrain(s, table)
