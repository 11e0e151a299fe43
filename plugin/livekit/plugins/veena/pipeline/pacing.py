"""Windows that follow the listener: each window's size is chosen when it can be decoded,
from what is known then.

The fixed ramp (``windowing.WindowPlanner``) decodes the same sizes whatever happens; this
planner knows how much audio the listener holds (it plays what it got and pauses when dry),
the request's measured token rate and the measured decode time of each window size on this
codec and device (the codec call alone, timed on the decode worker: a lagging event loop or a
queue is not read as a slow decoder). It picks the largest size whose missing tokens and
decode fit in ``margin`` of the listener's buffer, among sizes that decode faster than their
steps arrive and play; if none fits, a gap is coming and it picks the smallest such size.
A size larger than any measured is never assumed cheap or expensive from a fit: it is tried
one size step above the largest measured, so windows grow one measured step at a time. Sizes never
exceed the audio already delivered (as in the ramp), so a wrong cost estimate on a busy
machine costs at most that much. Once the buffer is thick windows grow up to ``max_new``
steps, so steady work approaches (N + L + R) / N of a one-pass decode. Sizes come from a
small fixed set (``first`` doubled up to ``max_new``), so equal sizes from different streams
still batch.

One stream has at most one window in the decoder: the next size is chosen when the last one
is decoded, so a stream that fell behind never has several of its windows queued (and
batched into one long call) ahead of its listener's need.

Below real time the listener must hear gaps somewhere. Policy: once the listener ran dry
while tokens come measurably slower than real time, the next window brings at least
``rebuffer_ms`` of audio, so the listener hears fewer, longer runs of speech instead of a
stutter of tiny gaps. Pure and synchronous: the caller passes the clock.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable

from ..validation import check_float, check_int
from .windowing import Window, WindowOptions

BELOW_REAL_TIME = 0.97
"""A measured token rate under this share of real time counts as a deficit, not noise."""


@dataclass(frozen=True)
class PacingOptions:
    max_new: int = 32
    """Largest window, in new steps."""
    pull_tick_ms: float = 5.0
    """Once the listener has audio, a request's producer parks until shortly before its
    next window can be decodable (woken on a shared tick of this length) instead of
    waking for every token; 0: take every token as it comes."""
    rebuffer_ms: float = 250.0
    """After the listener ran dry: the least audio the next window brings."""
    margin: float = 0.8
    """Wait for a larger window only while that costs at most this share of the buffered
    audio (measured costs are averages; the next window may be slower)."""

    def validate(self) -> "PacingOptions":
        check_int("max_new", self.max_new, 1, 4096)
        check_float("rebuffer_ms", self.rebuffer_ms, 0.0, 10_000.0)
        check_float("margin", self.margin, 0.0, 1.0, lo_open=True)
        check_float("pull_tick_ms", self.pull_tick_ms, 0.0, 1000.0)
        return self


def window_sizes(first: int, max_new: int) -> tuple[int, ...]:
    """``first``, doubled up to ``max_new`` (the largest may be ``max_new`` itself)."""
    sizes = [first]
    while sizes[-1] * 2 <= max_new:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


def planner_sizes(window: WindowOptions, pacing: PacingOptions) -> tuple[int, ...]:
    """The new-step sizes the adaptive planner chooses among."""
    return window_sizes(window.first, max(window.first, pacing.max_new))


class AdaptivePlanner:
    """Pull planner: ``add`` steps as they arrive, ``delivered`` each window's audio as the
    listener gets it, and ask ``next_window`` whenever no window is in flight (and again at
    ``recheck_at`` when it held one back for a larger size)."""

    def __init__(self, window: WindowOptions, pacing: PacingOptions, step_s: float,
                 decode_cost: Callable[[int], float | None]) -> None:
        """``decode_cost(steps)``: seconds the codec takes for a window of ``steps`` steps
        (context included) as measured on this codec and device, or None where that size was
        never measured (e.g. ``DecodeScheduler.decode_cost``)."""
        self.window = window.validate()
        self.pacing = pacing.validate()
        self.sizes = planner_sizes(window, pacing)
        self.step_s = step_s
        self.unheard_steps = 0
        """Steps at the start the listener never hears (the reference's warm-up trim)."""
        self._cost = decode_cost
        self._ctx = self.window.left + self.window.right
        self.kept = 0
        self.available = 0
        self.final = False
        self.first_audio_at: float | None = None
        self.play_end = 0.0
        """When the listener runs out of audio (it plays what it has, pauses when dry)."""
        self.dry = False
        self.delivered_steps = 0
        """Steps whose audio reached the listener (``kept`` less these: still decoding)."""
        self._arrivals: collections.deque[tuple[float, int, bool]] = collections.deque(maxlen=48)
        """(time, steps available, seen as it arrived): the last 48 arrivals."""
        self._rate: float | None = None
        self._rate_known = False
        """``token_rate`` as of the last arrival (asked several times per window, it changes
        only with an arrival)."""
        self._recheck_at: float | None = None

    # -- what the planner is told ---------------------------------------------------------
    def add(self, count: int, now: float, stale: bool = False) -> None:
        """``stale``: these steps waited while their producer was parked, so ``now`` is
        when they were taken, later than when they arrived."""
        self.available += count
        self._arrivals.append((now, self.available, not stale))
        self._rate_known = False

    def finish(self) -> None:
        self.final = True

    def cut(self, steps: int) -> None:
        """Only the first ``steps`` are played (a guard's cut; no window was planned past
        them)."""
        self.available = min(self.available, steps)

    def delivered(self, window: Window, now: float) -> None:
        """``window``'s audio reached the listener at ``now`` (less what is trimmed from
        the start, ``unheard_steps``: the listener never hears it)."""
        steps = window.keep_end - window.keep_start
        self.delivered_steps += steps
        heard = max(0, steps - self.unheard_steps)
        self.unheard_steps -= steps - heard
        duration = heard * self.step_s
        if not heard and self.first_audio_at is None:
            return
        if self.first_audio_at is None:
            self.first_audio_at, self.play_end = now, now + duration
            return
        if now > self.play_end:
            self.dry = True  # it arrived after the listener had run out
        self.play_end = max(self.play_end, now) + duration

    # -- what the planner knows -----------------------------------------------------------
    def buffer_s(self, now: float) -> float:
        """Audio the listener holds but has not heard yet (0 before first audio)."""
        return max(0.0, self.play_end - now)

    def token_rate(self) -> float | None:
        """Recent steps per second (None until two arrivals), over the last 48 arrivals:
        from the oldest one seen as it arrived (a late stamp there would bias every
        estimate until it leaves the window) to the newest (after a wake, ``pull_at``'s
        caller waits for a fresh one before it parks again)."""
        if self._rate_known:
            return self._rate
        arrivals = self._arrivals
        rate = None
        if len(arrivals) >= 2:
            t0, n0, _ = next((a for a in arrivals if a[2]), arrivals[0])
            t1, n1, _ = arrivals[-1]
            rate = (n1 - n0) / (t1 - t0) if t1 > t0 else None
        self._rate, self._rate_known = rate, True
        return rate

    @property
    def exhausted(self) -> bool:
        return self.final and self.kept >= self.available

    def cost(self, size: int, steps: int) -> float | None:
        """Expected decode seconds of a window of ``size`` new steps (``steps`` in all):
        measured, or for the one size above a measured one (sizes double) twice that one's
        cost (decode work grows at most linearly with steps); None further up, where nothing
        was measured: the planner never goes there before the size below it is measured."""
        measured = self._cost(steps)
        if measured is not None or size == self.sizes[0]:
            return measured if measured is not None else 0.0
        below = self.sizes[self.sizes.index(size) - 1]
        smaller = self._cost(steps - (size - below))
        return None if smaller is None else 2.0 * smaller

    # -- the decision ---------------------------------------------------------------------
    def sustainable_size(self) -> int:
        """The smallest size that decodes faster than its steps arrive and play: below it a
        stream falls further behind with every window, whatever its buffer. Tokens slower
        than real time leave the decoder that much more time per step. Only measured costs
        count: if no measured size keeps up, the next size up (one step beyond the largest
        measured), so a wrong or polluted measurement grows windows one step at a time."""
        rate = self.token_rate()
        period = max(self.step_s, 1.0 / rate) if rate else self.step_s
        ctx = self._ctx
        for s in self.sizes:
            cost = self._cost(s + ctx)
            if cost is None:
                return s  # the first size never measured: try it before anything larger
            if cost <= s * period:
                return s
        return self.sizes[-1]

    def choose_size(self, now: float) -> int:
        """The window size to decode next (and, when it is held back for more steps, when
        the choice can change as the buffer drains: ``recheck_at``)."""
        self._recheck_at = None
        sizes = self.sizes
        if self.kept == 0:
            return sizes[0]  # first audio as early as the fixed ramp
        # like the ramp, never more new steps than the listener has had: a wrong cost
        # estimate (a busy machine) then costs at most a gap as long as what was delivered
        limit = max(sizes[0], self.kept)
        cap = sizes[0]
        for s in sizes:
            if s <= limit:
                cap = s
        floor = min(self.sustainable_size(), cap)
        rate = self.token_rate()
        if self.dry:
            if not self.final and rate is not None and rate * self.step_s < BELOW_REAL_TIME:
                # tokens come slower than the audio plays: gaps will come whatever we do,
                # so make the next one a single pause before a longer run of speech
                need = self.pacing.rebuffer_ms / 1000.0 / self.step_s
                return next((s for s in sizes if s >= max(need, floor)), cap)
        # the largest size whose missing tokens and decode fit in the listener's buffer (a
        # window that takes longer than the buffer lasts is a gap: never chosen, whatever
        # the reason it would be cheaper per step); if none fits, a gap is coming: the
        # smallest size that does not fall further behind
        margin = self.pacing.margin
        budget = self.buffer_s(now) * margin
        right = 0 if self.final else self.window.right
        steps_extra = self.window.left + right
        best, held_need = None, None
        for size in sizes:
            if size < floor:
                continue
            if size > cap:
                break
            missing = self.kept + size + right - self.available
            if missing > 0 and (self.final or not rate):
                break
            cost = self.cost(size, size + steps_extra)
            if cost is None:
                break  # not measured, nor the one size above a measured one
            need = (missing / rate if missing > 0 else 0.0) + cost
            if need <= budget:
                best = size
                if missing > 0 and (held_need is None or need < held_need):
                    held_need = need
        if best is None:
            return floor
        if held_need is not None and self.kept + best + right > self.available:
            # held back for a larger size: once the buffer no longer covers the cheapest
            # such size, a size decodable now may win
            self._recheck_at = self.play_end - held_need / margin
        return best

    def next_window(self, now: float) -> Window | None:
        """The window to decode now, or None (wait for more steps, or until ``recheck_at``)."""
        remaining = self.available - self.kept
        self._recheck_at = None
        if remaining <= 0:
            return None
        o = self.window
        if not self.final and remaining < self.sizes[0] + o.right:
            return None  # nothing is decodable before more steps arrive
        size = self.choose_size(now)
        if self.final and remaining <= size:  # the last window: the rest, one-pass exact
            return self._take(remaining, self.available)
        end = self.kept + size + o.right
        if self.final:
            return self._take(size, min(end, self.available))
        if self.available < end:
            return None
        return self._take(size, end)

    def pull_at(self, now: float, tick_s: float) -> float | None:
        """When the producer must next take tokens, or None for now (the caller parks until
        then instead of waking for each token). Tokens matter again, a tick early, when the
        next size may be complete at the measured rate from the last arrival (each size
        completed may change the choice; while a window decodes, the smallest next one, as
        its decode asks again with what was seen by then), or before ``recheck_at`` of a
        window held back for a larger size (the steps seen by then move it); and never later
        than two ticks plus that window's decode before the listener would
        run dry, counting the audio still decoding as delivered after that decode (were it
        later, the listener's audio would end later too, so the wake is still early). Before
        first audio, at the end of the request, or with no rate measured yet: now."""
        if self.first_audio_at is None or self.final:
            return None
        rate = self.token_rate()
        if not rate:
            return None
        right = self.window.right
        # the next size to become complete (each may change the choice); while a window
        # decodes, the smallest: its end asks with every step seen by then
        sizes = self.sizes if self.kept == self.delivered_steps else self.sizes[:1]
        need = next((self.kept + s + right - self.available for s in sizes
                     if self.kept + s + right > self.available), 0)
        if need <= 0:
            return None
        first = self.sizes[0]
        cost = self._cost(self.window.left + first + right) or 0.0
        play_end = self.play_end
        if self.kept > self.delivered_steps:
            play_end = max(play_end, now + cost) + (self.kept - self.delivered_steps) * self.step_s
        due = self._arrivals[-1][0] + need / rate  # the rate runs from the last arrival
        at = min(due - tick_s, play_end - 2 * tick_s - cost)
        if self._recheck_at is not None:  # the steps seen by then move it: seen before it
            at = min(at, self._recheck_at - tick_s)
        return at if at > now + tick_s else None

    def recheck_at(self) -> float | None:
        """After ``next_window`` returned None: when its answer can change with no new step
        (a window decodable now was held back for a larger one, and the buffer drains), or
        None (only a new step, a finish or a decoded window can change it)."""
        if self.final or self.available - self.kept - self.window.right < self.sizes[0]:
            return None
        return self._recheck_at

    def _take(self, size: int, end: int) -> Window:
        w = Window(max(0, self.kept - self.window.left), end, self.kept, self.kept + size)
        self.kept += size
        self.dry = False
        self._recheck_at = None
        return w
