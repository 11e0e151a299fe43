"""How one request samples, beyond what its caller asked: the model card's defaults, the
engine's token budget for a text (just past the chunk's one bound, ``guards.chunk_bound_s``,
which the runaway guard enforces), the family's constraints, and a slower hand-over for a
chunk whose audio waits behind another."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .engine_options import SamplingOptions
from .family import ModelFamily
from .guards import MAX_SPOKEN_PER_CHAR, s_per_char, spoken_length
from .options import PipelineOptions
from .parsing import TokenTable


class SamplingPolicy:
    def __init__(self, profile: Any, family: ModelFamily, options: PipelineOptions,
                 max_model_len: int) -> None:
        self._profile = profile
        self._family = family
        self._options = options
        # a model trained on a shorter context than the engine's (NeuTTS: 2048 tokens, longer
        # output is cut) is held to its own
        self._max_model_len = min(max_model_len,
                                  getattr(profile, "max_context", None) or max_model_len)

    def defaults(self) -> SamplingOptions:
        """The model card's sampling with the model's stop rules (the budget is per text)."""
        return self._family.default_sampling()

    def max_chars_per_request(self, voice_tokens: int = 0) -> int:
        """The longest text whose prompt plus token budget fits the model context, beside a
        voice that takes ``voice_tokens`` of it (``ModelFamily.voice_prompt_tokens``);
        ValueError where the voice leaves no room for a short sentence."""
        tokens_per_s = self._profile.tokens_per_second
        guards = self._options.guards
        audio_s = s_per_char(guards, self._profile) or self._profile.runaway_s_per_char
        # a model that reads Chinese or Japanese may get text of Han characters only
        han = {"zh", "ja"} & set(getattr(self._profile, "languages", ()))
        per_char = audio_s * (MAX_SPOKEN_PER_CHAR if han else 1) * tokens_per_s + 1.5
        fixed = (guards.runaway_base_s * tokens_per_s + 2 * self._family.tokens_per_step()
                 + self._allowance() + 96)
        chars = int((self._max_model_len - fixed - voice_tokens) / per_char)
        if voice_tokens and chars < 16:
            raise ValueError(f"the voice's reference takes {voice_tokens} of the model's "
                             f"{self._max_model_len} context tokens: too little is left for "
                             "the text and its speech (use a shorter reference clip or "
                             "transcript)")
        return max(16, chars)

    def _allowance(self) -> int:
        """Tokens a request may write beyond its steps: the empty guard's before the first
        step, and speaker tokens a first request writes itself."""
        return (self._options.guards.empty_tokens
                + getattr(self._profile, "num_global_tokens", 0))

    def token_budget(self, bound_steps: int | None, prompt_len: int) -> int:
        """The engine's budget for a chunk bounded at ``bound_steps`` steps
        (``RunGuards.max_steps``; None: no bound): one step past it, so that the runaway
        guard, not the engine, ends a runaway (with a fade, counted), within the model
        context."""
        room = max(1, self._max_model_len - prompt_len)
        if bound_steps is None:
            return room
        tokens = (bound_steps + 1) * self._family.tokens_per_step() + self._allowance()
        return max(1, min(self._family.round_budget(tokens), room))

    def card_cap(self, text: str) -> int:
        """The model card's own cap on one request's new tokens, as its reference applies it
        (Veena's sample: ``min(int(len(text) * 1.3) * 7 + 21, 700)``), with the text measured
        as the chunk's bound measures it (``spoken_length``); unbounded where the card sets
        none."""
        rule = getattr(self._profile, "card_max_new_tokens", None)
        if rule is None:
            return 1 << 30
        per_char, scale, extra, most = rule
        return min(int(spoken_length(text) * per_char) * scale + extra, most)

    def queued(self, sampling: SamplingOptions) -> SamplingOptions:
        """``sampling`` for a chunk whose audio waits behind a chunk still generating: its
        tokens handed over once per ``queued_output_steps`` codec steps."""
        steps = self._options.queued_output_steps
        if steps == 0:
            return sampling
        interval = steps * self._family.tokens_per_step()
        return replace(sampling, stream_interval=max(sampling.stream_interval, interval))

    def main(self, sampling: SamplingOptions, text: str, prompt_len: int,
             table: TokenTable, bound_steps: int | None = None) -> SamplingOptions:
        """The main request's sampling: a ``max_tokens`` the caller gives is theirs (within
        the model context); the default is the budget of the chunk's bound
        (``bound_steps``), within the model card's cap; and the family's constraints."""
        if sampling.max_tokens is None:
            max_tokens = min(self.token_budget(bound_steps, prompt_len), self.card_cap(text))
        else:
            max_tokens = min(sampling.max_tokens, self.token_budget(None, prompt_len))
        s = replace(sampling, max_tokens=max_tokens,
                    min_tokens=min(sampling.min_tokens, max_tokens))
        return self._family.constrain(s, table)
