"""Saved voices in a small JSON file, so a voice made once is the voice of every later call,
process and server.

A BiCodec voice is its speaker's 32 global tokens (``veena-tts voice capture``, ``voice
clone``). A SNAC voice has no speaker tokens: it is kept by its words (a preset name, or a
description for a model that takes one, such as Maya1) and a sampling seed (``veena-tts voice
design``). The file names its profile and model, the voice, the globals or the seed, and a
format version; loading checks all of it (each value's type and range, the voice by the
profile's own rule) before any engine work, so a file for another profile or a hand-edited one
fails with a clear ``VoiceFileError``. Format version 1 throughout: ``seed`` is an optional
key a BiCodec file may leave out, and ``adapter`` (a LoRA adapter's name) one any file may
leave out, so every earlier file still loads.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..models.loading import speaker_encoder
from ..pipeline.adapters import check_adapter_name
from ..pipeline.engine_options import draw_seed
from ..pipeline.family import CLONED_VOICE, family_for
from ..validation import UNLOADABLE_JSON, check_int

FORMAT_VERSION = 1

MAX_SEED = 2**63 - 1
"""The largest seed a voice (or any request) may carry: vLLM takes a signed 64-bit seed."""


class VoiceFileError(ValueError):
    """A voice file that cannot be used here (malformed, another profile, bad ids)."""


@dataclass(frozen=True)
class VoiceFile:
    profile: str
    model: str
    voice: str
    """The profile voice (speaker prompt) the globals were captured with; "" for a voice
    cloned from a reference clip (no speaker prompt, the globals alone); for a SNAC voice,
    a preset name or (``described_voices``) a description in words."""
    speaker_globals: tuple[int, ...] | None = None
    """BiCodec: the 32 speaker globals every stream decodes with; SNAC: None."""
    format_version: int = FORMAT_VERSION
    seed: int | None = None
    """The sampling seed every stream speaks with (SNAC: required, it is half the voice;
    BiCodec: optional)."""
    adapter: str | None = None
    """The LoRA adapter (a registered name) the voice speaks with: a fine-tuned voice,
    combined with a description, globals or a controllable voice. Optional: files without
    it load as before."""

    def save(self, path: str | Path, *, exclusive: bool = False) -> Path:
        """Write the file whole or not at all (a temporary file, then one rename or link).
        With ``exclusive`` an existing file is never replaced (``FileExistsError``), even
        when several writers race for one name, in this process or another."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.to_json()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(data, indent=2) + "\n")
            os.chmod(tmp, 0o644)  # as a plain write would leave it (mkstemp makes it 0600)
            if exclusive:
                _link_new(tmp, path)
            else:
                os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return path

    def to_json(self) -> dict[str, Any]:
        """The file's JSON object: a key whose value is None is left out (a SNAC file has no
        ``speaker_globals``, a captured BiCodec file no ``seed``)."""
        data = {**asdict(self), "speaker_globals": (
            None if self.speaker_globals is None else list(self.speaker_globals))}
        return {k: v for k, v in data.items() if v is not None}


def design_voice(profile: Any, voice: str, *, seed: int | None = None,
                 model: str = "") -> VoiceFile:
    """A SNAC voice from words alone: ``voice`` (a preset name, or a description for a
    profile with ``described_voices``) checked by the profile, and ``seed`` (drawn when
    None). No engine work: the file pins what the prompt says and how it is sampled."""
    if family_for(profile).has_speaker_globals:
        raise VoiceFileError(f"model profile {profile.name} keeps a voice by its speaker "
                             "globals: use 'voice capture' or 'voice clone'")
    try:
        voice = profile.check_voice(voice)
        seed = draw_seed() if seed is None else check_int("seed", seed, 0, MAX_SEED)
    except ValueError as e:
        raise VoiceFileError(str(e)) from None
    return VoiceFile(profile.name, model, voice, None, seed=seed)


def _link_new(tmp: str, path: Path) -> None:
    """Give ``tmp`` the name ``path`` only if no file has it: ``os.link`` fails atomically
    on an existing name. A file system without hard links gets an O_EXCL create instead."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:
        with open(path, "x") as f, open(tmp) as src:
            f.write(src.read())


def is_voice_path(voice: str) -> bool:
    """Whether a ``voice`` option names a voice file rather than a profile voice."""
    return voice.endswith(".json")


def load_voice(path: str | Path, profile: Any) -> VoiceFile:
    """Read and check a voice file against ``profile`` (VoiceFileError on any problem)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise VoiceFileError(f"no voice file at {path}") from None
    except (OSError, *UNLOADABLE_JSON) as e:
        raise VoiceFileError(f"voice file {path} is not valid JSON: {e}") from None
    return parse_voice(data, profile, str(path))


def parse_voice(data: Any, profile: Any, where: str = "voice") -> VoiceFile:
    if not isinstance(data, dict):
        raise VoiceFileError(f"{where}: a voice file is a JSON object")
    if data.get("format_version") != FORMAT_VERSION:
        raise VoiceFileError(f"{where}: format_version must be {FORMAT_VERSION}, "
                             f"got {data.get('format_version')!r}")
    for key in ("profile", "model", "voice"):
        if not isinstance(data.get(key), str):
            raise VoiceFileError(f"{where}: {key!r} must be a string")
    if data["profile"] != profile.name:
        raise VoiceFileError(f"{where}: captured for profile {data['profile']!r}, "
                             f"not {profile.name!r}")
    family = family_for(profile)
    try:
        adapter = data.get("adapter")
        if adapter is not None:
            check_adapter_name(adapter)
        voice = profile.check_voice(data["voice"], (adapter,) if adapter else ())
        seed = data.get("seed")
        if seed is not None:
            seed = check_int("seed", seed, 0, MAX_SEED)
        if family.has_speaker_globals:
            speaker_globals = family.check_globals(data.get("speaker_globals"))
        else:
            if data.get("speaker_globals") is not None:
                family.check_globals(data["speaker_globals"])  # says it takes none
            if seed is None:
                raise ValueError(f"a {profile.name} voice is kept by its words and its seed: "
                                 "'seed' (an integer) is required")
            speaker_globals = None
    except ValueError as e:
        raise VoiceFileError(f"{where}: {e}") from None
    return VoiceFile(data["profile"], data["model"], voice, speaker_globals, seed=seed,
                     adapter=adapter)


VOICE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A name a client may save a voice under, or look one up by in the folder: no path in it."""


def voices_in(folder: str | Path, profile: Any) -> dict[str, VoiceFile]:
    """Every ``*.json`` voice in ``folder`` by its file name (without ``.json``)."""
    return {p.stem: load_voice(p, profile) for p in sorted(Path(folder).glob("*.json"))}


async def capture_voice(pipeline: Any, text: str, voice: str, *, seed: int | None = None,
                        model: str | None = None) -> VoiceFile:
    """Speak ``text`` once with ``voice`` and keep the speaker globals it captured."""
    if not pipeline.family.captures_speaker_globals:
        raise VoiceFileError(f"model profile {pipeline.profile.name} has no speaker tokens to "
                             "capture (its voice is the speaker prompt alone)")
    # a budget of its own: enough for the speaker tokens and the first speech after them (the
    # rest is not needed, and the runaway guard applies to the default budget only)
    globals_ = getattr(pipeline.profile, "num_global_tokens", 32)
    sampling = replace(pipeline.sampling.defaults(), max_tokens=2 * globals_ + 64)
    syn = pipeline.synthesize(text, voice=voice, seed=seed, sampling=sampling)
    try:
        async for _ in syn:
            if syn.speaker_globals is not None:
                break  # the voice is known: the rest of the speech is not needed
    finally:
        await syn.aclose()
    if syn.speaker_globals is None:
        raise VoiceFileError("the model produced no complete set of speaker tokens")
    return VoiceFile(pipeline.profile.name, model or pipeline.engine.options.model, syn.voice,
                     tuple(syn.speaker_globals))


async def clone_voice(pipeline: Any, wav: bytes, *, model: str | None = None,
                      text: str | None = None) -> VoiceFile:
    """A voice from a reference clip (WAV bytes): the speaker tokens of the codec's encoder
    (BiCodec: 32 globals, spoken with no speaker prompt, ``CLONED_VOICE``; NeuTTS: the clip's
    codes, spoken after ``text``, what the clip says). The transcript and the clip are checked
    first (ValueError, ``reference_clip.ReferenceClipError``); parsing, resampling and the
    encoder run off the event loop."""
    import asyncio

    from .reference_clip import load_reference_clip

    family = pipeline.family
    if not family.has_speaker_globals:
        raise VoiceFileError(f"model profile {pipeline.profile.name} has no speaker tokens: "
                             "its voices are speaker prompts only, nothing to clone into")
    voice = family.cloned_voice(text)
    loop = asyncio.get_running_loop()
    encoder = await loop.run_in_executor(None, speaker_encoder, pipeline)
    clip = await loop.run_in_executor(None, load_reference_clip, wav, encoder.sample_rate)
    ids = await loop.run_in_executor(None, encoder.encode, clip.samples)
    voice, codes = family.check_voice(voice, ids)
    return VoiceFile(pipeline.profile.name, model or pipeline.engine.options.model, voice, codes)
