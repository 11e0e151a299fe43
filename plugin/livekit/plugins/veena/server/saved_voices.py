"""Saved voices (``VEENA_VOICES_DIR``): the ones this server knows, those another replica
sharing the folder saved since, and the names being saved right now."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from ..models.profiles import ModelProfile
from ..voices.files import VOICE_NAME, VoiceFile, VoiceFileError, load_voice, voices_in

logger = logging.getLogger(__name__)


class SavedVoices:
    """The one resolver of a saved voice's name, for every route."""

    def __init__(self, voices_dir: str | None, profile: ModelProfile) -> None:
        self.voices_dir = voices_dir
        self._profile = profile
        self.by_name: dict[str, VoiceFile] = voices_in(voices_dir, profile) if voices_dir else {}
        """Saved voices by name; a bad file stops the server at start-up with its reason. A
        file the operator put there may carry a profile voice's name (``arjun.json``: that
        voice with pinned globals, tests/voices/test_voices.py); an upload may not."""
        self._unreadable: set[tuple[str, int]] = set()
        """(name, mtime) of voice files found bad: not parsed, nor warned about, again."""
        self.names_taken: set[str] = set()
        """Names being saved right now (POST /v1/voices): a second upload is refused at once."""
        self.clone_lock = asyncio.Lock()

    def find(self, name: Any) -> VoiceFile | None:
        """A saved voice by name: one this server knows, or one another replica sharing
        ``VEENA_VOICES_DIR`` saved since (read from the folder on first use, then kept)."""
        if not isinstance(name, str):
            return None
        saved = self.by_name.get(name)
        if (saved is not None or self.voices_dir is None
                or not VOICE_NAME.fullmatch(name) or self.is_profile_voice(name)):
            return saved  # a profile voice's name never touches the disk: the hot path
        path = Path(self.voices_dir) / f"{name}.json"
        try:
            version = (name, path.stat().st_mtime_ns)
        except OSError:
            return None
        if version in self._unreadable:
            return None
        try:
            saved = load_voice(path, self._profile)
        except VoiceFileError as e:  # half written, or put there by hand: not a voice now
            self._unreadable.add(version)  # said once, read again once rewritten
            logger.warning("saved voice not loaded: %s", e, extra={"voice_name": name})
            return None
        self.by_name[name] = saved
        return saved

    def refresh(self) -> None:
        """Take in the voices other replicas saved in the shared folder since (listing)."""
        if self.voices_dir is None:
            return
        for path in sorted(Path(self.voices_dir).glob("*.json")):
            if path.stem not in self.by_name:
                self.find(path.stem)

    def is_profile_voice(self, name: str) -> bool:
        """Names are compared case-insensitively: on a case-insensitive file system
        ``Kavya.json`` would otherwise stand beside the built-in ``kavya``."""
        return name.casefold() in {v.casefold() for v in self._profile.voices}
