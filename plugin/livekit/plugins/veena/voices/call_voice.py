"""A call's voice: what one voice is made of, resolved in one place, and what a call keeps of
it across its streams.

Every surface that names a voice (the plugin, a server context or speech request, ``say``)
turns it into a checked ``Voice`` through ``resolve_voice``: a profile voice, a description
(Maya1), the path of a voice file, or a name a server saved. A ``CallVoice`` then keeps what
a call speaks with from stream to stream: a voice file's globals and seed, the speaker
globals its first stream captured (BiCodec), or the seed drawn for it (SNAC, whose voice is
its words and its seed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Collection, Sequence

from ..pipeline.engine_options import draw_seed
from ..pipeline.family import family_for
from ..validation import check_int
from .files import MAX_SEED, VoiceFile, is_voice_path, load_voice

logger = logging.getLogger(__name__)

VOICE_SCOPES = ("call", "turn")


@dataclass(frozen=True)
class Voice:
    """A voice checked against its profile: what a turn is prompted and sampled with."""

    voice: str
    """A profile voice, a description (``described_voices``), or "" for a cloned voice."""
    speaker_globals: tuple[int, ...] | None = None
    """Pinned speaker globals (BiCodec: a voice file's, or a client's)."""
    seed: int | None = None
    """A pinned seed (a voice file's, or one given)."""
    file: VoiceFile | None = None
    """The voice file it came from, if any."""
    adapter: str | None = None
    """The LoRA adapter every request of the voice carries (a registered name)."""


VoiceLookup = Callable[[str], "VoiceFile | None"]
"""Finds a voice file by what a caller named (None: not a file's name)."""


def voice_file_at(profile: Any) -> VoiceLookup:
    """The plugin's and the command line's lookup: a ``*.json`` path is a voice file."""
    return lambda name: load_voice(name, profile) if is_voice_path(name) else None


def resolve_voice(profile: Any, voice: Any, *, seed: Any = None,
                  speaker_globals: Sequence[int] | None = None,
                  lookup: VoiceLookup | None = None,
                  adapters: Collection[str] = ()) -> Voice:
    """The one resolver: ``voice`` (a caller that was given none passes the profile's
    ``default_voice``; None is refused as not a string) through ``lookup`` to a
    voice file where it names one, else to a LoRA adapter where it names one of
    ``adapters`` (the engine's), then every value checked by type and range (ValueError;
    ``VoiceFileError`` for a bad file) before any engine work. Globals or a seed given here
    win over a file's. A description that could end the prompt's attribute or inject a tag
    is refused by the profile's own check, never put in a prompt."""
    family = family_for(profile)
    file = lookup(voice) if lookup is not None and isinstance(voice, str) else None
    adapter = None
    if file is not None:
        voice, adapter = file.voice, file.adapter
        speaker_globals = file.speaker_globals if speaker_globals is None else speaker_globals
        seed = file.seed if seed is None else seed
    elif isinstance(voice, str) and voice in adapters:
        voice, adapter = family.adapter_voice(voice), voice
    if adapter is not None and adapter not in adapters:
        raise ValueError(f"the voice names adapter {adapter!r}, which is not registered "
                         f"(registered: {', '.join(sorted(adapters)) or 'none'})")
    speakers = {} if adapter is None else {"speakers": (adapter,)}
    checked, globals_ = family.check_voice(voice, speaker_globals, **speakers)
    if seed is not None:
        seed = check_int("seed", seed, 0, MAX_SEED)
    return Voice(checked, globals_, seed, file, adapter)


class CallVoice:
    """What every stream of one call speaks with (``voice_scope="call"``): the resolved
    voice, then the globals its first stream captures (BiCodec) or one seed drawn on first
    use (SNAC). ``reset()`` starts over; a stream made before a reset keeps its own (old)
    voice and keeps nothing of it as the call's. ``voice_scope="turn"``: each stream
    captures its own globals or draws its own seed."""

    def __init__(self, profile: Any, voice: Voice, scope: str = "call") -> None:
        if scope not in VOICE_SCOPES:
            raise ValueError(f"voice_scope must be 'call' or 'turn', got {scope!r}")
        self.profile = profile
        self.scope = scope
        self.voice = voice
        self._keeps_seed = (scope == "call"
                            and not family_for(profile).captures_speaker_globals)
        self._globals: tuple[int, ...] | None = None
        self._seed: int | None = None
        self.epoch = 0
        """Counts resets: a stream of an older epoch neither uses nor keeps the call's voice."""

    def change(self, voice: Voice) -> None:
        """A new voice for the streams made from now on (``update_options(voice=...)``)."""
        self.voice = voice
        self.reset()

    def reset(self) -> None:
        """Forget what the call captured or drew; a voice file's globals and seed stay."""
        self._globals = None
        self._seed = None
        self.epoch += 1

    @property
    def speaker_globals(self) -> tuple[int, ...] | None:
        """The globals every stream uses: a voice file's, or the first stream's capture."""
        return self.voice.speaker_globals or self._globals

    def seed(self, given: int | None = None, *, draw: bool = True) -> int | None:
        """The seed of a stream: ``given``, else the voice's, else the call's (SNAC in call
        scope; drawn on first use unless ``draw`` is False); None lets the turn draw one."""
        if given is not None:
            return given
        if self.voice.seed is not None:
            return self.voice.seed
        if not self._keeps_seed:
            return None
        if self._seed is None and draw:
            self._seed = draw_seed()
            logger.debug("the call's voice seed drawn", extra={"seed": self._seed})
        return self._seed

    def for_stream(self, seed: int | None = None) -> "StreamVoice":
        """A stream's hold on this voice, taken when the stream is made."""
        return StreamVoice(self, self.epoch, self.voice, seed)

    def _keep(self, epoch: int, speaker_globals: tuple[int, ...]) -> None:
        if epoch == self.epoch and self.scope == "call" and self._globals is None:
            self._globals = tuple(speaker_globals)


class StreamVoice:
    """One stream's voice: the call's as it was when the stream was made. ``start()`` says
    what its turn speaks with; ``captured()`` hands back what the turn learnt."""

    def __init__(self, call: CallVoice, epoch: int, voice: Voice, seed: int | None) -> None:
        self._call = call
        self._epoch = epoch
        self.voice = voice
        self._given_seed = seed
        self.speaker_globals: tuple[int, ...] | None = None
        """The globals this stream spoke with (BiCodec), once known."""
        self.seed: int | None = None
        """The seed this stream spoke with, once known (through a server: where the plugin
        chose it; else the server draws one)."""

    @property
    def current(self) -> bool:
        return self._epoch == self._call.epoch

    def start(self) -> tuple[tuple[int, ...] | None, int | None]:
        """(speaker globals, seed) the stream's turn starts with; None: the turn captures
        or draws its own. A stream of a voice since reset speaks only its own voice."""
        given = self.voice.speaker_globals
        if given is None and self.current and self._call.scope == "call":
            given = self._call.speaker_globals
        self.speaker_globals = given
        self.seed = self._call.seed(self._given_seed)
        return given, self.seed

    def captured(self, speaker_globals: tuple[int, ...]) -> None:
        """The turn captured these globals: noted, and kept as the call's voice."""
        self.speaker_globals = speaker_globals
        self._call._keep(self._epoch, speaker_globals)
