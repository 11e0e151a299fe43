"""Guards against an LLM-codec model going wrong inside a chunk: no audio at all, a loop, a
runaway past what the text could take to say, a long silence. Each is a pure, synchronous
check the request's run asks as its steps or its decoded audio arrive; none holds audio
back, so none adds a wait to first audio.

What each does when it fires:
- ``empty``: no codec step within ``empty_tokens`` tokens, or a stop before any: the run
  asks again once with another seed (nothing of the chunk was heard), then ends the chunk.
- ``loop``: the same run of steps (SNAC frames, BiCodec semantic tokens) repeated
  ``loop_repeats`` times in a row: the chunk ends after its first copy, or where the
  listener already is.
- ``runaway``: more audio than ``runaway_base_s`` plus the profile's seconds per character
  (a Han character counts as three): the chunk ends there with a short fade. It narrows the
  default token budget only: a ``max_tokens`` the caller gives is theirs.
- ``silence``: ``silence_s`` of decoded audio under ``silence_dbfs`` (peak): the chunk ends.

Every firing is counted process-wide (``guard_counts``; the server exports it) and logged
once per turn and guard, with the request id, by the turn's ``GuardLog``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..validation import check_float, check_int

logger = logging.getLogger(__name__)

GUARDS = ("empty", "loop", "runaway", "silence")


@dataclass(frozen=True)
class GuardOptions:
    """The guards' thresholds (``models.loading.pipeline_options_from_env`` reads each from
    its ``VEENA_GUARD_*`` variable); 0 turns a guard off."""

    empty_tokens: int = 64
    """Tokens (other than speaker globals) a request may generate before its first codec
    step (``VEENA_GUARD_EMPTY_TOKENS``)."""
    loop_repeats: int = 3
    """Copies in a row of one run of steps that make a loop (``VEENA_GUARD_LOOP_REPEATS``;
    at least 2)."""
    loop_min_s: float = 0.25
    """The shortest run that counts (``VEENA_GUARD_LOOP_MIN_S``): shorter repeats are a held
    sound or silence, which the silence guard judges."""
    loop_max_s: float = 3.0
    """The longest run looked for (``VEENA_GUARD_LOOP_MAX_S``; a phrase, not a sentence)."""
    runaway_base_s: float = 1.5
    """Audio any chunk may have beyond its per-character allowance
    (``VEENA_GUARD_RUNAWAY_BASE_S``)."""
    runaway_s_per_char: float | None = None
    """Seconds of audio per character (``VEENA_GUARD_RUNAWAY_S_PER_CHAR``); None: the
    profile's ``runaway_s_per_char``. A request with a ``max_tokens`` of its own has no
    runaway bound."""
    silence_s: float = 2.0
    """Silence inside a chunk that ends it (``VEENA_GUARD_SILENCE_S``)."""
    silence_dbfs: float = -45.0
    """Peak level under which audio counts as silent (``VEENA_GUARD_SILENCE_DBFS``)."""
    fade_ms: float = 20.0
    """The fade-out where a loop or a runaway is cut (``VEENA_GUARD_FADE_MS``)."""

    def validate(self) -> "GuardOptions":
        check_int("empty_tokens", self.empty_tokens, 0, 1 << 16)
        check_int("loop_repeats", self.loop_repeats, 0, 100)
        if self.loop_repeats == 1:
            raise ValueError("loop_repeats must be 0 (off) or at least 2")
        check_float("loop_min_s", self.loop_min_s, 0.0, 60.0)
        check_float("loop_max_s", self.loop_max_s, self.loop_min_s, 60.0)
        check_float("runaway_base_s", self.runaway_base_s, 0.0, 3600.0)
        if self.runaway_s_per_char is not None:
            check_float("runaway_s_per_char", self.runaway_s_per_char, 0.0, 60.0)
        check_float("silence_s", self.silence_s, 0.0, 3600.0)
        check_float("silence_dbfs", self.silence_dbfs, -120.0, 0.0)
        check_float("fade_ms", self.fade_ms, 0.0, 1000.0)
        return self


# -- counting and logging ------------------------------------------------------------------
_counts = dict.fromkeys(GUARDS, 0)
_listeners: list[Callable[[str], None]] = []


def guard_counts() -> dict[str, int]:
    """How often each guard fired in this process (monotonic)."""
    return dict(_counts)


def add_guard_listener(listener: Callable[[str], None]) -> Callable[[], None]:
    """``listener(guard)`` hears each firing as it is counted (the server's metrics); the
    returned call stops it."""
    _listeners.append(listener)
    return lambda: _listeners.remove(listener)


class GuardLog:
    """One turn's guard firings: each counted, each guard logged once per turn (a model that
    loops on every chunk of a long answer warns once, not once per chunk)."""

    def __init__(self) -> None:
        self.fired: list[tuple[str, str]] = []
        """(guard, request id) of every firing in this turn, in order."""

    def fire(self, guard: str, request_id: str, **details: object) -> None:
        first = all(g != guard for g, _ in self.fired)
        self.fired.append((guard, request_id))
        _counts[guard] += 1
        for listener in list(_listeners):
            listener(guard)
        if first:
            logger.warning(f"guard fired: {guard} (later ones in this turn are counted only)",
                           extra={"request_id": request_id, "guard": guard, **details})


# -- the checks ----------------------------------------------------------------------------
def spoken_length(text: str) -> int:
    """Characters as time to say them: a Han character (a syllable) counts as three."""
    han = sum(1 for c in text if "\u3400" <= c <= "\u9fff")
    return len(text) + 2 * han


def retry_seed(seed: int) -> int:
    """The seed an empty generation is asked again with: derived, so a call replays alike."""
    return (seed * 1000003 + 0x9E3779B) & 0x7FFFFFFF


class LoopDetector:
    """Finds a run of steps repeated ``repeats`` times in a row, as each step arrives: per
    period ``p`` it keeps how many steps in a row equal the one ``p`` before (O(max period)
    numpy work per step)."""

    def __init__(self, repeats: int, min_period: int, max_period: int) -> None:
        self._repeats = repeats
        self._min = max(1, min_period)
        self._periods = np.arange(1, max(max_period, self._min) + 1)
        self._need = (repeats - 1) * self._periods
        self._ring = np.zeros(len(self._periods) + 1, dtype=np.int64)
        self._runs = np.zeros(len(self._periods), dtype=np.int64)
        self._n = 0

    def push(self, key: int) -> int | None:
        """Add the next step's key; return where its loop's second copy starts (the first
        repeated step's index) once a loop is complete, else None."""
        size, n = len(self._ring), self._n
        back = self._ring[(n - self._periods) % size]
        same = (back == key) & (self._periods <= n)
        self._runs = np.where(same, self._runs + 1, 0)
        self._ring[n % size] = key
        self._n = n + 1
        done = np.flatnonzero(self._runs >= self._need)
        if not done.size:
            return None
        period = int(self._periods[done[0]])
        if period < self._min:  # a held sound repeats at every period: not a loop
            return None
        return self._n - int(self._runs[done[0]])


class SilenceMeter:
    """Counts silent samples in a row across pushes of decoded audio."""

    def __init__(self, seconds: float, dbfs: float, sample_rate: int) -> None:
        self._limit = int(seconds * sample_rate)
        self._level = 10.0 ** (dbfs / 20.0)
        self._run = 0

    def push(self, pcm: np.ndarray) -> int | None:
        """Where in ``pcm`` the silent run reaches the limit (the samples before it are the
        ones to keep), or None."""
        loud = np.flatnonzero(np.abs(pcm) > self._level)
        run, limit = self._run, self._limit
        if not loud.size:
            self._run = run + len(pcm)
            return limit - run if self._run >= limit else None
        self._run = len(pcm) - 1 - int(loud[-1])
        if run + int(loud[0]) >= limit:
            return limit - run
        gaps = np.flatnonzero(np.diff(loud) - 1 >= limit)
        if gaps.size:
            return int(loud[gaps[0]]) + 1 + limit
        return int(loud[-1]) + 1 + limit if self._run >= limit else None


def fade_out(pcm: np.ndarray, samples: int) -> np.ndarray:
    """``pcm`` with its last ``samples`` faded to zero (a cut must not click)."""
    n = min(samples, len(pcm))
    if n <= 0:
        return pcm
    out = pcm.astype(np.float32, copy=True)
    out[-n:] *= np.linspace(1.0, 0.0, n, dtype=np.float32)
    return out


def step_key(step: object) -> int:
    """A step as one int: a BiCodec semantic token is one, a SNAC frame is its 7 codes."""
    if isinstance(step, np.ndarray):
        return hash(step.tobytes())
    return int(step)  # type: ignore[call-overload]


class RunGuards:
    """The guards of one request's run, sized for its text and codec."""

    def __init__(self, options: GuardOptions, text: str, steps_per_s: float,
                 sample_rate: int, s_per_char: float, unheard_steps: int = 0) -> None:
        self.options = options
        self._loop = (LoopDetector(options.loop_repeats,
                                   math.ceil(options.loop_min_s * steps_per_s),
                                   math.ceil(options.loop_max_s * steps_per_s))
                      if options.loop_repeats else None)
        per_char = (options.runaway_s_per_char if options.runaway_s_per_char is not None
                    else s_per_char)
        self.max_steps = (unheard_steps + math.ceil(
            (options.runaway_base_s + per_char * spoken_length(text)) * steps_per_s)
            if per_char > 0 else None)
        """Steps past which the run is a runaway (None: no bound)."""
        self._silence = (SilenceMeter(options.silence_s, options.silence_dbfs, sample_rate)
                         if options.silence_s > 0 else None)
        self.fade_samples = int(options.fade_ms * sample_rate / 1000)

    @classmethod
    def for_run(cls, options: GuardOptions, text: str, codec: Any, family: Any,
                default_budget: bool) -> "RunGuards":
        """A run's guards: the runaway bound narrows the default budget only (a
        ``max_tokens`` the caller gives is theirs, a benchmark's fixed length, as with the
        model card's cap)."""
        per_char = getattr(family.profile, "runaway_s_per_char", 0.0) if default_budget else 0.0
        return cls(options, text, codec.sample_rate / codec.samples_per_step,
                   codec.sample_rate, per_char, family.trim_start_steps)

    def empty(self, tokens_without_audio: int) -> bool:
        """No step yet after this many tokens."""
        n = self.options.empty_tokens
        return n > 0 and tokens_without_audio >= n

    def steps(self, steps: Sequence[object], new: int) -> tuple[str, int] | None:
        """The ``new`` steps at the end of ``steps`` arrived: (guard, steps to keep) where a
        loop or a runaway is found, else None."""
        start = len(steps) - new
        if self._loop is not None:
            for i in range(start, len(steps)):
                at = self._loop.push(step_key(steps[i]))
                if at is not None:
                    return "loop", at
        if self.max_steps is not None and len(steps) > self.max_steps:
            return "runaway", self.max_steps
        return None

    def silence_end(self, pcm: np.ndarray) -> int | None:
        """Where in ``pcm`` a silence long enough to cut at ends, or None."""
        if self._silence is None or not len(pcm):
            return None
        return self._silence.push(pcm)
