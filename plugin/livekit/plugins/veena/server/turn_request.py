"""What a client asks one turn to do (voice, sampling, seed, speaker globals), validated once
for every route before any engine work."""

from __future__ import annotations

from typing import Any

from ..normalization import check_mode, check_pronunciations
from ..pipeline.turn import TurnOptions
from ..voices.call_voice import resolve_voice
from .state import ServerState


def turn_options(state: ServerState, voice: Any, sampling: Any, seed: Any,
                 speaker_globals: Any, text_normalization: Any = None,
                 pronunciations: Any = None) -> TurnOptions:
    """Validate everything a client asked for, by type and range, before any engine work.
    A saved voice's name stands for its voice (a profile voice, or a description) with its
    speaker globals (BiCodec) or its seed (SNAC); globals or a seed the client gives win.
    A LoRA adapter's name (or a saved voice that names one) speaks with that adapter.
    ``text_normalization`` (auto, off; None: the server's default) and ``pronunciations``
    say how the text is normalised."""
    if text_normalization is not None:
        check_mode(text_normalization)
    words = None if pronunciations is None else check_pronunciations(pronunciations)
    pipeline = state.pipeline
    profile = pipeline.profile
    resolved = resolve_voice(profile, profile.default_voice if voice is None else voice,
                             seed=seed, speaker_globals=speaker_globals,
                             lookup=state.voices.find, adapters=pipeline.engine.adapters.names)
    return TurnOptions(voice=resolved.voice, adapter=resolved.adapter,
                       sampling=pipeline.sampling.defaults().overridden(sampling),
                       seed=resolved.seed, speaker_globals=resolved.speaker_globals,
                       chunk_crossfade_ms=state.options.chunk_crossfade_ms,
                       max_chunks_in_flight=state.options.max_chunks_in_flight,
                       timeout=state.options.turn_timeout_s,
                       startup_timeout=pipeline.engine.options.startup_timeout_s,
                       text_normalization=text_normalization, pronunciations=words)
