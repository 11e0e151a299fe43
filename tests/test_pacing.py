"""Listener-paced windows, simulated on a virtual clock (no real time, no codec): every
step is kept exactly once, the first window is as early as the fixed ramp, windows grow when
the listener has audio buffered, and a stream below real time rebuffers instead of
stuttering."""

import heapq

import pytest

from livekit.plugins.veena.pipeline.pacing import (
    AdaptivePlanner,
    PacingOptions,
    window_sizes,
)
from livekit.plugins.veena.pipeline.windowing import WindowOptions, WindowPlanner

STEP_S = 2048 / 24000  # one SNAC frame
OPTS = WindowOptions(first=2, new=8, left=2, right=2)


class Listener:
    """Plays what it gets, pauses when dry: first audio time and the gaps after it."""

    def __init__(self) -> None:
        self.first, self.play_end, self.gaps, self.windows = None, 0.0, 0.0, []

    def hear(self, window, now: float) -> None:
        kept = (window.keep_end - window.keep_start) * STEP_S
        if self.first is None:
            self.first, self.play_end = now, now + kept
        else:
            self.gaps += max(0.0, now - self.play_end)
            self.play_end = max(self.play_end, now) + kept
        self.windows.append(window)


def simulate(rate_x: float, frames: int, cost_per_step: float, pacing=PacingOptions(),
             all_at_once: bool = False):
    """One stream: frames arrive at ``rate_x`` x real time (or all at t=0); one window in
    flight; a window of n steps decodes in n * cost_per_step seconds. Returns (windows,
    first audio time, total gap seconds after first audio)."""
    planner = AdaptivePlanner(OPTS, pacing, STEP_S, lambda n: n * cost_per_step)
    events = [(0.0 if all_at_once else (k + 1) * STEP_S / rate_x, 0, k) for k in range(frames)]
    heapq.heapify(events)
    now, in_flight, listener = 0.0, None, Listener()

    def pump():
        nonlocal in_flight
        if in_flight is None:
            w = planner.next_window(now)
            if w is not None:
                in_flight = w
                heapq.heappush(events, (now + w.steps * cost_per_step, 1, w))

    arrived = 0
    while events:
        now, kind, item = heapq.heappop(events)
        if kind == 0:
            planner.add(1, now)
            arrived += 1
            if arrived == frames:
                planner.finish()
        elif kind == 1:  # a window's audio reaches the listener
            listener.hear(item, now)
            planner.delivered(item, now)
            in_flight = None
        pump()
        if in_flight is None and planner.waiting_on_time():
            heapq.heappush(events, (now + 0.02, 2, 0))  # ask again as the buffer drains
    assert planner.exhausted
    return listener.windows, listener.first, listener.gaps


def _kept(windows):
    return [s for w in windows for s in range(w.keep_start, w.keep_end)]


def _work(windows):
    return sum(w.steps for w in windows) / sum(w.keep_end - w.keep_start for w in windows)


@pytest.mark.parametrize("rate_x", [0.5, 0.9, 1.0, 1.2, 2.0])
@pytest.mark.parametrize("frames", [1, 5, 37, 120])
def test_every_step_kept_once_in_order(rate_x, frames):
    windows, _, _ = simulate(rate_x, frames, cost_per_step=0.03)
    assert _kept(windows) == list(range(frames))
    for w in windows:
        assert w.keep_start - w.start <= OPTS.left and w.end <= frames
        size = w.keep_end - w.keep_start
        assert size in window_sizes(2, 32) or w.end == frames  # batchable sizes, or the tail


def test_first_window_as_early_as_the_fixed_ramp():
    ramp = WindowPlanner(OPTS)
    adaptive = AdaptivePlanner(OPTS, PacingOptions(), STEP_S, lambda n: 0.01)
    for k in range(4):
        ramp_w = ramp.add(1)
        adaptive.add(1, k * STEP_S)
        assert (adaptive.next_window(k * STEP_S) is None) == (not ramp_w)
    assert ramp_w[0].keep_end == 2


def simulate_ramp(rate_x: float, frames: int, cost_per_step: float):
    """The fixed ramp on the same clock: every window is queued as soon as it is decodable
    and one decoder works through the queue in order. Returns (windows, first audio, gaps)."""
    ramp, free_at, listener = WindowPlanner(OPTS), 0.0, Listener()
    for k in range(frames):
        planned = ramp.add(1) + (ramp.finish() if k == frames - 1 else [])
        for w in planned:
            free_at = max(free_at, (k + 1) * STEP_S / rate_x) + w.steps * cost_per_step
            listener.hear(w, free_at)
    return listener.windows, listener.first, listener.gaps


COST = STEP_S / 4  # about this CPU's SNAC decode per step (bench/scheduler.py measures it)


def test_ahead_of_the_listener_windows_grow_and_work_falls():
    windows, _, gaps = simulate(2.0, 120, cost_per_step=COST)
    assert gaps == 0.0
    sizes = [w.keep_end - w.keep_start for w in windows]
    assert sizes[0] == 2 and max(sizes) == 32
    ramp, _, _ = simulate_ramp(2.0, 120, COST)
    assert _work(windows) < _work(ramp)


def test_all_tokens_at_once():
    windows, first, gaps = simulate(1.0, 120, cost_per_step=COST, all_at_once=True)
    assert first == pytest.approx(4 * COST)  # the first window: 2 new + 2 right
    assert gaps == 0.0 and _work(windows) <= 1.3


@pytest.mark.parametrize("rate_x", [1.0, 1.2, 2.0])
def test_fewer_gaps_than_the_ramp_with_the_same_first_audio(rate_x):
    adaptive, first, gaps = simulate(rate_x, 120, COST)
    ramp, ramp_first, ramp_gaps = simulate_ramp(rate_x, 120, COST)
    assert first == pytest.approx(ramp_first)
    # at most one short lag adjustment (the goal at 1.0x: under 50 ms per 10 s)
    assert gaps < ramp_gaps / 2 and gaps < 0.05


@pytest.mark.parametrize("rate_x", [0.4, 0.7, 1.0, 2.0])
@pytest.mark.parametrize("cost_x", [0.4, 0.6])
def test_a_slow_decoder_is_no_worse_than_the_ramp(rate_x, cost_x):
    """Decode taking 0.4-0.6 of a step's duration per step (a loaded CPU; with 4 steps of
    context a 2-step window then decodes slower than it plays): no more gaps than the
    ramp, whatever the token rate, because sizes never outgrow the audio delivered."""
    _, first, gaps = simulate(rate_x, 60, STEP_S * cost_x)
    _, ramp_first, ramp_gaps = simulate_ramp(rate_x, 60, STEP_S * cost_x)
    assert first == pytest.approx(ramp_first) and gaps <= ramp_gaps + 1e-9


def test_below_real_time_rebuffers_instead_of_stuttering():
    windows, _, gaps = simulate(0.8, 120, COST, pacing=PacingOptions(rebuffer_ms=500))
    assert gaps > 0  # a 0.8x stream must pause somewhere
    stutter, _, _ = simulate(0.8, 120, COST, pacing=PacingOptions(rebuffer_ms=0))
    assert len(windows) < len(stutter) / 2  # fewer, longer runs of speech


def test_options_checked():
    with pytest.raises(ValueError):
        PacingOptions(max_new=0).validate()
    for bad in (dict(margin=0), dict(margin=float("nan")), dict(rebuffer_ms=float("nan")),
                dict(max_new=True), dict(max_new=8.0), dict(rebuffer_ms=-1)):
        with pytest.raises(ValueError):
            PacingOptions(**bad).validate()
    assert window_sizes(2, 32) == (2, 4, 8, 16, 32) and window_sizes(10, 160)[-1] == 160
