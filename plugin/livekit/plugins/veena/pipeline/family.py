"""The model-family seam: everything that differs between codec families (SNAC, BiCodec)
behind one object, picked once from the profile's ``codec`` field.

A family owns its token table, its per-request track (token ids to codec steps), prompt
building, sampling constraints, the first-request plan (BiCodec captures 32 global tokens
before it continues), its decode window and its codec loading. The pipeline, the turn and
the server ask the family; none of them looks at a profile's type. This module is the
interface the pipeline runs a model through; the families themselves live in
``models.families``. A new family is one module that subclasses ``ModelFamily`` and calls
``register_family``, plus a profile whose ``codec`` names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol, Sequence

from ..codecs.base import Codec, CodecInput
from .engine_options import SamplingOptions
from .pacing import PacingOptions
from .parsing import ParseStats, TokenTable
from .windowing import Window, WindowOptions

CLONED_VOICE = ""
"""The voice of a clone from a reference clip: no speaker prompt, the globals alone
(Spark-TTS's prompt-less cloning mode)."""


def check_cloned_voice(voice: str, speaker_globals: Sequence[int] | None) -> None:
    """A cloned voice has no speaker prompt: without its globals there is no voice at all."""
    if voice == CLONED_VOICE and speaker_globals is None:
        raise ValueError('voice "" is a cloned voice with no speaker prompt: it needs its '
                         "speaker globals (its voice file, or speaker_globals)")


@dataclass(frozen=True)
class DecodeShape:
    """A family's decode windows (``windowing``) and how large listener-paced windows may
    grow (``pacing``)."""

    window: WindowOptions
    pacing: PacingOptions


class InvalidGlobalsError(ValueError):
    """Speaker tokens a request may not use: wrong count, out of range, or a family that
    has none."""


class Track(Protocol):
    """One engine request's codec steps, parsed as its tokens arrive."""

    stats: ParseStats
    steps: list
    """The codec steps parsed so far (a guard's cut shortens it)."""

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
    """Whether a voice carries speaker tokens (``speaker_globals``: BiCodec's 32 globals, a
    NeuTTS reference's codes) that voice files keep and requests reuse."""
    captures_speaker_globals: ClassVar[bool] = False
    """Whether a request without them generates its speaker tokens, which later requests of
    the call then reuse (BiCodec); a family whose voice brings them (NeuTTS) never waits."""
    decode_defaults: ClassVar[DecodeShape] = DecodeShape(
        WindowOptions(first=2, new=8, left=2, right=2), PacingOptions(max_new=32))
    """Its decode windows unless the pipeline's options give others."""
    decode_env: ClassVar[str] = ""
    """The prefix of the environment variables that override ``decode_defaults``
    (``VEENA_SNAC_WINDOW``: ``_FIRST``, ``_NEW``, ``_LEFT``, ``_RIGHT``, ``_MAX``)."""

    def __init__(self, profile: Any) -> None:
        self.profile = profile

    @property
    def trim_start_steps(self) -> int:
        """Codec steps at the start of each request the model's reference never plays."""
        return getattr(self.profile, "trim_start_frames", 0)

    # -- what every family must say --------------------------------------------------------
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
               speaker_globals: tuple[int, ...] | None, speakers: Sequence[str] = ()
               ) -> list[int]:
        """``speakers``: speaker names the request's LoRA adapter adds to the profile's."""
        raise NotImplementedError

    # -- defaults a family may refine ------------------------------------------------------
    def decode_shape(self, overrides: Mapping[str, DecodeShape]) -> DecodeShape:
        """This family's decode shape: one given for its ``codec``, else its own defaults."""
        return overrides.get(self.codec, self.decode_defaults)

    def default_sampling(self) -> SamplingOptions:
        """The model card's sampling (the profile's) with the model's stop rules; the token
        budget is derived per text."""
        return replace(self.profile.sampling, max_tokens=None,
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

    def voice_prompt_tokens(self, tokenizer: Any, voice: str,
                            speaker_globals: tuple[int, ...] | None) -> int:
        """Prompt tokens a voice takes beyond the text's: a reference clip's transcript and
        codes (NeuTTS) share the model's context with the text and its speech, so they set
        how much text one request may carry; the other families' voices fit the fixed
        allowance (0)."""
        return 0

    def round_budget(self, tokens: int) -> int:
        """A token budget rounded to what the codec can use (e.g. whole frames)."""
        return tokens

    def tokens_per_step(self) -> int:
        """Tokens the model generates per codec step (one semantic token, by default)."""
        return 1

    def check_voice(self, voice: Any, speaker_globals: Sequence[int] | None,
                    speakers: Sequence[str] = ()) -> tuple[str, tuple[int, ...] | None]:
        """A voice and speaker globals a request may use, checked together (ValueError):
        the profile's voice rule, the family's globals, and a clone's need for its globals.
        ``speakers``: names a LoRA adapter adds (``adapter_voice``)."""
        checked = self.profile.check_voice(voice, speakers)
        globals_ = None if speaker_globals is None else self.check_globals(speaker_globals)
        check_cloned_voice(checked, globals_)
        return checked, globals_

    def cloned_voice(self, transcript: str | None) -> str:
        """The voice string of a clone (``voices.files.clone_voice``) whose clip says
        ``transcript``: ``CLONED_VOICE`` here, where a clone is its speaker tokens alone (a
        transcript is refused, never silently dropped)."""
        if transcript is not None:
            raise ValueError(f"model profile {self.profile.name} clones from the clip alone: "
                             "it takes no transcript")
        return CLONED_VOICE

    def adapter_voice(self, adapter: str) -> str:
        """The voice a request speaks when its voice names LoRA adapter ``adapter``: the
        profile's default here (a description, globals or a controllable voice come from a
        voice file that names the adapter); families whose prompt names a speaker use the
        adapter's own name, as its fine-tune learnt it."""
        return self.profile.default_voice

    def check_globals(self, global_ids: Sequence[int]) -> tuple[int, ...]:
        """Speaker tokens a continuation may reuse (InvalidGlobalsError otherwise)."""
        raise InvalidGlobalsError(f"model profile {self.profile.name} takes no speaker_globals")


FAMILIES: dict[str, type[ModelFamily]] = {}
"""Every family by the profile ``codec`` value it serves (``models.families`` registers the
built-in ones as it is imported, which any code holding a built-in profile has done)."""


def register_family(family: type[ModelFamily]) -> type[ModelFamily]:
    """Make ``family`` serve every profile whose ``codec`` is ``family.codec``."""
    FAMILIES[family.codec] = family
    return family


def family_for(profile: Any) -> ModelFamily:
    """The family object of ``profile`` (by its ``codec`` field)."""
    try:
        return FAMILIES[profile.codec](profile)
    except KeyError:
        raise ValueError(f"no model family for codec {profile.codec!r} "
                         f"(known: {', '.join(sorted(FAMILIES))})") from None
