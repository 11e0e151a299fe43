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
- ``runaway``: more audio than the chunk's bound (``chunk_bound_s``, the one bound on a
  chunk's default budget): the chunk ends there with a short fade. A ``max_tokens`` the
  caller gives is theirs: such a request has no bound.
- ``silence``: a silent stretch (peak under ``silence_dbfs``) longer than ``silence_s``: the
  rest of it is dropped and the chunk goes on; it ends only where the model stops.

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
MIN_LOOP_S = 0.1
"""The shortest ``loop_min_s``: at least two steps of every codec (SNAC's are 85 ms), so a
held sound (one step repeated) is never a loop."""


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
    """The shortest run that counts (``VEENA_GUARD_LOOP_MIN_S``, at least ``MIN_LOOP_S``):
    shorter repeats are a held sound or silence, which the silence guard judges."""
    loop_max_s: float = 3.0
    """The longest run looked for (``VEENA_GUARD_LOOP_MAX_S``; a phrase, not a sentence)."""
    runaway_base_s: float = 1.5
    """Audio any chunk may have beyond its per-character allowance
    (``VEENA_GUARD_RUNAWAY_BASE_S``)."""
    runaway_s_per_char: float | None = None
    """Seconds of audio per character (``VEENA_GUARD_RUNAWAY_S_PER_CHAR``); None: the
    profile's ``runaway_s_per_char``; 0: no bound. A request with a ``max_tokens`` of its
    own has no bound whatever this says."""
    silence_s: float = 2.0
    """The longest silence heard inside a chunk (``VEENA_GUARD_SILENCE_S``): the rest of a
    longer one is dropped."""
    silence_dbfs: float = -45.0
    """Peak level under which audio counts as silent (``VEENA_GUARD_SILENCE_DBFS``)."""
    fade_ms: float = 20.0
    """The fade-out where a loop or a runaway is cut (``VEENA_GUARD_FADE_MS``)."""

    def validate(self) -> "GuardOptions":
        check_int("empty_tokens", self.empty_tokens, 0, 1 << 16)
        check_int("loop_repeats", self.loop_repeats, 0, 100)
        if self.loop_repeats == 1:
            raise ValueError("loop_repeats must be 0 (off) or at least 2")
        check_float("loop_min_s", self.loop_min_s, MIN_LOOP_S, 60.0)
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


# -- the one bound on a chunk --------------------------------------------------------------
MAX_SPOKEN_PER_CHAR = 3
"""The most one character counts in ``spoken_length`` (a Han character)."""


def spoken_length(text: str) -> int:
    """Characters as time to say them, the one length measure of a chunk's bound: a Han
    character (a syllable) counts as three."""
    han = sum(1 for c in text if "\u3400" <= c <= "\u9fff")
    return len(text) + (MAX_SPOKEN_PER_CHAR - 1) * han


def s_per_char(options: GuardOptions, profile: Any) -> float:
    """Seconds of audio per unit of ``spoken_length``: the option, else the profile's."""
    if options.runaway_s_per_char is not None:
        return options.runaway_s_per_char
    return float(getattr(profile, "runaway_s_per_char", 0.0))


def chunk_bound_s(options: GuardOptions, profile: Any, text: str) -> float | None:
    """The most audio a chunk of ``text`` may have on the default budget (None: unbounded):
    ``runaway_base_s`` plus the seconds per character times ``spoken_length``. The runaway
    guard cuts there, the engine's own ``max_tokens`` is set just past it (the guard, not
    the engine, ends a runaway: with a fade, counted) and a request's text is sized to fit
    it in the model's context."""
    per_char = s_per_char(options, profile)
    return options.runaway_base_s + per_char * spoken_length(text) if per_char > 0 else None


def retry_seed(seed: int) -> int:
    """The seed an empty generation is asked again with: derived, so a call replays alike."""
    return (seed * 1000003 + 0x9E3779B) & 0x7FFFFFFF


# -- the checks ----------------------------------------------------------------------------
class LoopDetector:
    """Finds a run of steps repeated ``repeats`` times in a row, as each step arrives, on
    plain ints: per period ``p`` it keeps how many steps in a row equal the one ``p`` before,
    for the periods where the newest step recurs (mostly none: O(1) per step; a held
    sound, O(max period))."""

    def __init__(self, repeats: int, min_period: int, max_period: int) -> None:
        self._repeats = repeats
        self._min = max(2, min_period)
        self._max = max(max_period, self._min)
        self._ring: list[object] = [None] * (self._max + 1)
        self._seen: dict[int, list[int]] = {}
        """Key -> its positions within the last ``max_period`` steps, oldest first."""
        self._runs: dict[int, int] = {}
        """Period -> steps in a row equal to the one that period before (absent: 0)."""
        self._n = 0

    def push(self, key: int) -> int | None:
        """Add the next step's key; return where its loop's second copy starts (the first
        repeated step's index) once a loop is complete, else None."""
        n, size = self._n, self._max + 1
        if n >= size:  # the step leaving the window: its position is its key's oldest
            old = self._ring[n % size]
            where = self._seen[old]
            del where[0]
            if not where:
                del self._seen[old]
        self._ring[n % size] = key
        self._n = n + 1
        where = self._seen.get(key)
        if where is None:
            self._seen[key] = [n]
            self._runs = {}
            return None
        runs, before = {}, self._runs
        for i in where:
            p = n - i
            runs[p] = before.get(p, 0) + 1
        where.append(n)
        self._runs = runs
        need = self._repeats - 1
        done = [p for p, run in runs.items() if run >= need * p]
        if not done:
            return None
        period = min(done)
        if period < self._min:  # a held sound repeats at every period: not a loop
            return None
        return self._n - runs[period]


class SilenceMeter:
    """Shortens every silent stretch to ``seconds`` as decoded audio is pushed (a stretch
    goes on across pushes)."""

    def __init__(self, seconds: float, dbfs: float, sample_rate: int) -> None:
        self._limit = int(seconds * sample_rate)
        self._level = 10.0 ** (dbfs / 20.0)
        self._run = 0
        self._cut = False
        """The current silent stretch has been shortened already."""

    def trim(self, pcm: np.ndarray) -> tuple[np.ndarray, int]:
        """``pcm`` without the silence past the limit, and how many silent stretches were
        first shortened in it."""
        limit, run, n = self._limit, self._run, len(pcm)
        loud = np.abs(pcm) > self._level
        first = int(loud.argmax())  # (stops at the first loud sample)
        if not loud[first]:
            self._run = run + n
            keep = min(n, max(0, limit - run))
            if keep == n:
                return pcm, 0
            first_cut, self._cut = not self._cut, True
            return pcm[:keep], int(first_cut)
        last = n - 1 - int(loud[::-1].argmax())
        drop: list[tuple[int, int]] = []  # [start, end) spans of silence past the limit
        cuts = 0
        if run + first > limit:
            drop.append((max(0, limit - run), first))
            cuts += not self._cut
        if last - first > limit:  # a long stretch between two sounds may lie inside
            at = np.flatnonzero(loud)
            for g in np.flatnonzero(np.diff(at) > limit + 1).tolist():
                drop.append((int(at[g]) + 1 + limit, int(at[g + 1])))
                cuts += 1
        tail = n - 1 - last
        self._run, self._cut = tail, tail > limit
        if tail > limit:
            drop.append((last + 1 + limit, n))
            cuts += 1
        if not drop:
            return pcm, 0
        pieces, at = [], 0
        for start, end in drop:
            pieces.append(pcm[at:start])
            at = end
        pieces.append(pcm[at:])
        return np.concatenate(pieces), cuts


def fade_out(pcm: np.ndarray, samples: int) -> np.ndarray:
    """``pcm`` with its last ``samples`` faded to zero (a cut must not click)."""
    n = min(samples, len(pcm))
    if n <= 0:
        return pcm
    out = pcm.astype(np.float32, copy=True)
    out[-n:] *= np.linspace(1.0, 0.0, n, dtype=np.float32)
    return out


def step_key(step: object) -> int:
    """A step as one int: a BiCodec semantic token is one, a SNAC frame is its codes'
    bytes' hash (every code counts: two frames alike in one code are different sounds)."""
    if type(step) is int:
        return step
    if isinstance(step, np.ndarray):
        return hash(step.tobytes())
    return int(step)  # type: ignore[call-overload]


class RunGuards:
    """The guards of one request's run, sized for its text and codec."""

    def __init__(self, options: GuardOptions, steps_per_s: float, sample_rate: int,
                 bound_s: float | None, unheard_steps: int = 0) -> None:
        """``bound_s``: the chunk's bound (``chunk_bound_s``; None: none)."""
        self.options = options
        self._loop = (LoopDetector(options.loop_repeats,
                                   math.ceil(options.loop_min_s * steps_per_s),
                                   math.ceil(options.loop_max_s * steps_per_s))
                      if options.loop_repeats else None)
        self.max_steps = (unheard_steps + math.ceil(bound_s * steps_per_s)
                          if bound_s is not None else None)
        """Steps past which the run is a runaway (None: no bound)."""
        self._silence = (SilenceMeter(options.silence_s, options.silence_dbfs, sample_rate)
                         if options.silence_s > 0 else None)
        self.fade_samples = int(options.fade_ms * sample_rate / 1000)

    @classmethod
    def for_run(cls, options: GuardOptions, text: str, codec: Any, family: Any,
                default_budget: bool) -> "RunGuards":
        """A run's guards: the chunk's bound on the default budget only (a ``max_tokens``
        the caller gives is theirs, whatever the options say)."""
        bound = chunk_bound_s(options, family.profile, text) if default_budget else None
        return cls(options, codec.sample_rate / codec.samples_per_step, codec.sample_rate,
                   bound, family.trim_start_steps)

    def empty(self, tokens_without_audio: int) -> bool:
        """No step yet after this many tokens."""
        n = self.options.empty_tokens
        return n > 0 and tokens_without_audio >= n

    def steps(self, steps: Sequence[object], new: int) -> tuple[str, int] | None:
        """The ``new`` steps at the end of ``steps`` arrived: (guard, steps to keep) where a
        loop or a runaway is found, else None."""
        loop = self._loop
        if loop is not None:
            for i in range(len(steps) - new, len(steps)):
                at = loop.push(step_key(steps[i]))
                if at is not None:
                    return "loop", at
        if self.max_steps is not None and len(steps) > self.max_steps:
            return "runaway", self.max_steps
        return None

    def trim_silence(self, pcm: np.ndarray) -> tuple[np.ndarray, int]:
        """``pcm`` with silence past ``silence_s`` dropped, and how many silent stretches
        were first shortened in it (each a firing)."""
        if self._silence is None or not len(pcm):
            return pcm, 0
        return self._silence.trim(pcm)
