"""The TTS's options, snapshotted per stream as the first-party plugins do, each checked once
by type and range when it is given."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from livekit.agents import tokenize, tts

from ..normalization import check_mode, check_pronunciations
from ..pipeline.engine_options import SAMPLING_FIELDS, SamplingOptions
from ..pipeline.sentences import SentenceTokenizer
from ..validation import check_float, check_int

PLUGIN_SAMPLING_FIELDS = tuple(f for f in SAMPLING_FIELDS if f != "min_tokens")
"""The sampling a plugin user sets (``max_tokens`` is ``max_tokens_per_chunk``); a server
keeps its own model's ``min_tokens``."""


@dataclass(frozen=True)
class TTSOptions:
    sampling: SamplingOptions
    """The model card's defaults with the user's values; ``max_tokens`` None: the pipeline's
    per-chunk budget."""
    seed: int | None
    """None: the voice's seed (a voice file's; ``voice_scope="call"`` on a SNAC model: one
    drawn for the whole call), else each turn draws its own and keeps it for all its chunks."""
    tokenizer: tokenize.SentenceTokenizer
    text_pacing: tts.SentenceStreamPacer | None
    """Hold pieces back while enough audio is buffered (less generation wasted on an
    interruption)."""
    chunk_crossfade_ms: float
    max_chunks_in_flight: int
    startup_timeout: float
    text_normalization: str | None = None
    """``auto`` or ``off``; None: the engine's default (``VEENA_TEXT_NORMALIZATION``, or
    the server's)."""
    pronunciations: Mapping[str, str] = field(default_factory=dict)
    """Whole words spoken another way (``{"SQL": "sequel"}``), before the grammars."""

    def __post_init__(self) -> None:
        """Every option by type and range (ValueError) before any engine work; numbers are
        kept as plain Python ones (a numpy int passes, but JSON and vLLM's msgspec take only
        Python's own)."""
        s = self.sampling.validate()
        plain = SamplingOptions(
            **{**s.__dict__, "temperature": float(s.temperature), "top_p": float(s.top_p),
               "top_k": int(s.top_k), "repetition_penalty": float(s.repetition_penalty),
               "max_tokens": None if s.max_tokens is None else int(s.max_tokens)})
        set_ = object.__setattr__
        set_(self, "sampling", plain)
        set_(self, "seed", None if self.seed is None else check_int("seed", self.seed, 0,
                                                                     2**63 - 1))
        set_(self, "max_chunks_in_flight", check_int("max_chunks_in_flight",
                                                     self.max_chunks_in_flight, 1, 64))
        set_(self, "chunk_crossfade_ms", check_float("chunk_crossfade_ms",
                                                     self.chunk_crossfade_ms, 0.0, 1000.0))
        set_(self, "startup_timeout", check_float("startup_timeout", self.startup_timeout,
                                                  0.0, lo_open=True))
        if self.text_normalization is not None:
            check_mode(self.text_normalization)
        set_(self, "pronunciations", check_pronunciations(self.pronunciations))
        if not isinstance(self.tokenizer, tokenize.SentenceTokenizer):
            raise ValueError("tokenizer must be a livekit.agents.tokenize.SentenceTokenizer, "
                             f"got {type(self.tokenizer).__name__}")
        if self.text_pacing is not None and not isinstance(self.text_pacing,
                                                           tts.SentenceStreamPacer):
            raise ValueError("text_pacing must be a tts.SentenceStreamPacer or a bool, got "
                             f"{type(self.text_pacing).__name__}")

    @property
    def server_chunks(self) -> bool:
        """A server chunks raw text exactly as our default tokenizer would: send it as is."""
        return type(self.tokenizer) is SentenceTokenizer and self.text_pacing is None

    def remote_sampling(self) -> dict:
        """The user's sampling as a server context's first message carries it."""
        fields = {name: getattr(self.sampling, name) for name in PLUGIN_SAMPLING_FIELDS}
        return {k: v for k, v in fields.items() if v is not None}
