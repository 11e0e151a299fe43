"""The model-family seam: everything that differs between codec families (SNAC, BiCodec)
behind one object, picked once from the profile's ``codec`` field.

A family owns its token table, its per-request track (token ids to codec steps), prompt
building, sampling constraints, the first-request plan (BiCodec captures 32 global tokens
before it continues), its default decode window and its codec loading. The pipeline, the
turn and the server ask the family; none of them looks at a profile's type. A new family is
one module that subclasses ``ModelFamily`` and calls ``register_family``, plus a profile whose
``codec`` names it.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar, Protocol, Sequence

from ...codecs.base import Codec, CodecInput
from ...pipeline.engine_options import SamplingOptions
from ...pipeline.pacing import PacingOptions
from ...pipeline.parsing import ParseStats, TokenTable
from ...pipeline.windowing import Window, WindowOptions


class WindowDefaults(Protocol):
    """The pipeline's per-family window and pacing settings (``PipelineOptions``), as a
    family reads them: the family never imports the pipeline."""

    snac_window: WindowOptions
    bicodec_window: WindowOptions
    snac_pacing: PacingOptions
    bicodec_pacing: PacingOptions


class InvalidGlobalsError(ValueError):
    """Speaker tokens a request may not use: wrong count, out of range, or a family that
    has none."""


class Track(Protocol):
    """One engine request's codec steps, parsed as its tokens arrive."""

    stats: ParseStats

    def feed(self, ids: Sequence[int]) -> int:
        """Consume token ids; return how many new codec steps they completed."""
        ...

    def window_input(self, window: Window, seed: int) -> CodecInput: ...

    @property
    def speaker_globals(self) -> tuple[int, ...] | None:
        """The utterance's speaker tokens once known (families without them: None)."""
        ...


class ModelFamily:
    """Base of every family; subclasses set ``codec`` and implement the abstract parts."""

    codec: ClassVar[str]
    """The profile ``codec`` value this family serves."""
    has_speaker_globals: ClassVar[bool] = False
    """Whether a request captures speaker tokens that later requests can reuse."""

    def __init__(self, profile: Any) -> None:
        self.profile = profile

    @property
    def trim_start_steps(self) -> int:
        """Codec steps at the start of each request the model's reference never plays."""
        return getattr(self.profile, "trim_start_frames", 0)

    # -- what every family must say --------------------------------------------------------
    def default_window(self, options: WindowDefaults) -> WindowOptions:
        raise NotImplementedError

    def load_codec(self, codec_model: str, device: str, *, cuda_graphs: bool = False,
                   streaming: bool = False) -> Codec:
        """``cuda_graphs``: capture the decoder per shape where ``device`` is CUDA;
        ``streaming``: decode each request incrementally where the codec can (SNAC)."""
        raise NotImplementedError

    def load_speaker_encoder(self, codec_model: str, device: str) -> Any:
        """A reference clip -> speaker globals (voice cloning); families without speaker
        tokens have none."""
        raise ValueError(f"model profile {self.profile.name} has no speaker encoder: "
                         "its voices are speaker prompts only")

    def token_table(self, tokenizer: Any) -> TokenTable:
        raise NotImplementedError

    def new_track(self, table: TokenTable, request_id: str,
                  speaker_globals: tuple[int, ...] | None) -> Track:
        raise NotImplementedError

    def prompt(self, tokenizer: Any, text: str, voice: str,
               speaker_globals: tuple[int, ...] | None) -> list[int]:
        raise NotImplementedError

    # -- defaults a family may refine ------------------------------------------------------
    def default_pacing(self, options: WindowDefaults) -> PacingOptions:
        """How large listener-paced windows may grow (``pacing``)."""
        return options.snac_pacing

    def default_sampling(self) -> SamplingOptions:
        """The model card's sampling defaults; the token budget is derived per text."""
        d = self.profile.sampling
        return SamplingOptions(temperature=d.temperature, top_p=d.top_p, top_k=d.top_k,
                               repetition_penalty=d.repetition_penalty, max_tokens=None,
                               min_tokens=d.min_tokens,
                               stop_token_ids=tuple(getattr(self.profile, "stop_token_ids", ())),
                               ignore_eos=getattr(self.profile, "ignore_eos", False))

    def constrain(self, sampling: SamplingOptions, table: TokenTable) -> SamplingOptions:
        """Sampling constraints of the main request (stop ids, allowed ids)."""
        return sampling

    def capture_sampling(self, sampling: SamplingOptions, table: TokenTable
                         ) -> SamplingOptions | None:
        """A first request's extra engine request that captures speaker tokens before the
        main one (None: the family has none)."""
        return None

    def round_budget(self, tokens: int) -> int:
        """A token budget rounded to what the codec can use (e.g. whole frames)."""
        return tokens

    def tokens_per_step(self) -> int:
        """Tokens the model generates per codec step (one semantic token, by default)."""
        return 1

    def check_globals(self, global_ids: Sequence[int]) -> tuple[int, ...]:
        """Speaker tokens a continuation may reuse (InvalidGlobalsError otherwise)."""
        raise InvalidGlobalsError(f"model profile {self.profile.name} takes no speaker_globals")


_FAMILIES: dict[str, type[ModelFamily]] = {}
_BUILTIN = ("snac", "bicodec")


def register_family(family: type[ModelFamily]) -> type[ModelFamily]:
    """Make ``family`` serve every profile whose ``codec`` is ``family.codec``."""
    _FAMILIES[family.codec] = family
    return family


def family_for(profile: Any) -> ModelFamily:
    """The family object of ``profile`` (by its ``codec`` field)."""
    for builtin in _BUILTIN:  # the built-in families register themselves on import
        importlib.import_module(f"{__name__}.{builtin}")
    try:
        return _FAMILIES[profile.codec](profile)
    except KeyError:
        raise ValueError(f"no model family for codec {profile.codec!r} "
                         f"(known: {', '.join(sorted(_FAMILIES))})") from None
