"""Listener-paced windows, simulated on a virtual clock (no real time, no codec): every
step is kept exactly once, the first window is as early as the fixed ramp, windows grow when
the listener has audio buffered, and a stream below real time rebuffers instead of
stuttering."""

import heapq

import pytest

from livekit.plugins.veena.pipeline.pacing import (
    AdaptivePlanner,
    PacingOptions,
    planner_sizes,
    window_sizes,
)
from livekit.plugins.veena.pipeline.windowing import (
    Window,
    WindowOptions,
    WindowPlanner,
    ramp_sizes,
    steady_window_steps,
)

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
             all_at_once: bool = False, tick_s: float | None = None, pulls: list | None = None,
             tokens_per_step: int = 1):
    """One stream: frames arrive at ``rate_x`` x real time (or all at t=0); one window in
    flight; a window of n steps decodes in n * cost_per_step seconds. With ``tick_s`` the
    producer parks as ``RequestRun`` does (``pull_at``, woken at the start of its tick) and
    frames that arrive meanwhile are taken together when it wakes, as vLLM merges them;
    ``pulls`` gets one entry per delta taken, of ``tokens_per_step`` tokens per step (a
    step reaches the planner when its last token is taken). Returns (windows, first audio
    time, total gap seconds after first audio)."""
    planner = AdaptivePlanner(OPTS, pacing, STEP_S, lambda n: n * cost_per_step)
    tokens = frames * tokens_per_step
    events = [(0.0 if all_at_once else (k + 1) * STEP_S / tokens_per_step / rate_x, 0, k)
              for k in range(tokens)]
    heapq.heapify(events)
    now, in_flight, listener = 0.0, None, Listener()
    parked_until, waiting = None, 0
    pulls = [] if pulls is None else pulls

    woke = False

    def take(count: int) -> None:
        nonlocal parked_until, woke
        pulls.append(count)
        steps = (sum(pulls) // tokens_per_step) - planner.available
        if steps:
            planner.add(steps, now, stale=woke)
        if arrived == tokens:
            planner.finish()
        pump()  # as RequestRun: the planner sees the steps before the producer parks
        if woke:  # what waited is stamped with the wake's time: park again after an arrival
            woke = False
        elif tick_s is not None:
            at = planner.pull_at(now, tick_s)
            if at is not None:
                parked_until = (at // tick_s) * tick_s
                heapq.heappush(events, (parked_until, 3, 0))

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
            arrived += 1
            if parked_until is None:
                take(1)
            else:
                waiting += 1
        elif kind == 3:  # the producer wakes and takes what arrived while it was parked
            parked_until, count, waiting = None, waiting, 0
            if count:
                woke = True
                take(count)
        elif kind == 1:  # a window's audio reaches the listener
            listener.hear(item, now)
            planner.delivered(item, now)
            in_flight = None
        pump()
        at = planner.recheck_at() if in_flight is None else None
        if at is not None:  # ask again when the draining buffer can change the answer
            heapq.heappush(events, (max(at, now + 1e-3), 2, 0))
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


@pytest.mark.parametrize("rate_x", [0.7, 0.9, 1.0, 1.05, 1.2, 2.0])
@pytest.mark.parametrize("cost", [0.003 / 6, COST])
@pytest.mark.parametrize("tick_s", [0.01, 0.005])
def test_parking_between_needed_tokens_changes_no_window(rate_x, cost, tick_s):
    """A producer that parks until its next window can be complete (woken a tick early,
    never after the listener's buffer minus two ticks and a decode) takes far fewer deltas
    at about real time, and every window is the same, at the same time. The steps taken on
    a wake carry the wake's time, not their arrival's: the token rate must not run from
    such a stamp (at 1.05x with a 5 ms tick, one 48 steps old changed a window)."""
    eager, eager_first, eager_gaps = simulate(rate_x, 120, cost)
    pulls: list[int] = []
    parked, first, gaps = simulate(rate_x, 120, cost, tick_s=tick_s, pulls=pulls)
    assert parked == eager and first == eager_first and gaps == pytest.approx(eager_gaps)
    assert sum(pulls) == 120
    pulls.clear()
    parked, first, gaps = simulate(rate_x, 120, cost, tick_s=tick_s, pulls=pulls,
                                   tokens_per_step=7)
    assert parked == eager and first == eager_first and gaps == pytest.approx(eager_gaps)
    assert sum(pulls) == 7 * 120
    if rate_x == 1.0:  # waiting for every token: parks most (dry listeners never park)
        assert len(pulls) < 7 * 120 / 3
        if tick_s == 0.005:
            # a finer tick wakes between the last two tokens of a window: one delta fewer
            # per 2-step window than with 10 ms (237-247 there)
            assert len(pulls) < 200
    if rate_x > 1.0 and cost < COST:
        # ahead of the listener a window is held back for a larger size: tokens matter only
        # as each size completes and before its recheck, not one by one (a GPU-fast decoder;
        # while a slow one decodes, every step still counts)
        assert len(pulls) < 7 * 120 / 4


def test_pull_at():
    planner = AdaptivePlanner(OPTS, PacingOptions(), STEP_S, lambda n: 0.004)
    for k in range(4):
        planner.add(1, k * STEP_S)
        assert planner.pull_at(k * STEP_S, 0.01) is None  # before first audio: every token
    now = 4 * STEP_S
    w = planner.next_window(now)
    assert planner.pull_at(now, 0.01) is None  # still no audio delivered
    planner.delivered(w, now + 0.004)
    now += 0.005
    at = planner.pull_at(now, 0.01)
    # the next 2-step window needs steps 4 and 5 beyond the 4 there: 2 steps at 1x from the
    # last arrival, a tick early; and the listener's 2 steps of audio, minus two ticks and
    # a decode
    due = 3 * STEP_S + 2 * STEP_S - 0.01
    dry = now - 0.001 + 2 * STEP_S - 0.02 - 0.004
    assert at == pytest.approx(min(due, dry))
    planner.finish()
    assert planner.pull_at(now, 0.01) is None  # the end: take it at once


def test_pull_at_counts_audio_still_decoding():
    """A window in the decoder counts as the listener's once decoded: the wake is bounded by
    the listener's audio including it, and here that bound comes before the tokens do."""
    planner = AdaptivePlanner(OPTS, PacingOptions(), STEP_S, lambda n: 0.004)
    for k in range(4):
        planner.add(1, k * STEP_S)
    first = planner.next_window(3 * STEP_S)
    planner.delivered(first, 3 * STEP_S + 0.004)  # the listener holds steps 0-1 until 5S
    for k in (4, 5):
        planner.add(1, k * STEP_S)
    now = 5 * STEP_S + 0.001
    second = planner.next_window(now)
    assert (second.keep_start, second.keep_end) == (2, 4)  # decoding, not yet delivered
    at = planner.pull_at(now, 0.01)
    # listener: steps 0-1 until 5S + 4 ms, then steps 2-3 once decoded: 7S + 5 ms; less two
    # ticks and a decode. Tokens for the next window: 2 steps from the last arrival (5S).
    dry = 7 * STEP_S + 0.005 - 0.02 - 0.004
    due = 7 * STEP_S - 0.01
    assert dry < due and at == pytest.approx(dry)
    planner.delivered(second, now + 0.004)  # decoded as expected: the same wake as before
    assert planner.pull_at(now + 0.004, 0.01) == pytest.approx(at)


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


# -- disturbances: a lagging event loop, a stalled engine -----------------------------------
# The decoder is GPU-like (3 ms a call, timed on its worker, so never more); the planner sees
# only sizes already measured, as from ``DecodeScheduler.decode_cost``. Events (a token's
# arrival, a decoded window reaching the listener) are handled when the event loop gets to
# them: ``handle(t)`` is that time for an event due at ``t``.

GPU_CALL_S = 0.003


def _half_blocked(start: float, length: float, slice_s: float = 0.1):
    """The loop is blocked every other ``slice_s`` during [start, start + length): an event
    due in a blocked slice is handled when that slice ends."""
    def handle(t: float) -> float:
        k = int((t - start) // slice_s) if start <= t < start + length else 1
        return start + (k + 1) * slice_s if k % 2 == 0 else t
    return handle


def _arrivals_1x(frames: int, stall_at: float | None = None, stall_s: float = 0.0):
    """Frame k due at (k + 1) steps at exactly real time; an engine stall at ``stall_at``
    delays every later frame by ``stall_s`` (nothing is generated meanwhile)."""
    due = [(k + 1) * STEP_S for k in range(frames)]
    return [t + stall_s if stall_at is not None and t >= stall_at else t for t in due]


def simulate_disturbed(arrivals, handle=lambda t: t):
    """The adaptive planner on a disturbed clock. Returns (listener, chosen) where chosen
    holds (time, window size, buffer s, largest size the buffer allowed) per window."""
    measured: dict[int, float] = {}

    def cost(steps):  # the scheduler's rule: measured, or bounded by a larger measured one
        if steps in measured:
            return measured[steps]
        larger = [k for k in measured if k > steps]
        return measured[min(larger)] if larger else None

    planner = AdaptivePlanner(OPTS, PacingOptions(), STEP_S, cost)
    events = [(handle(t), 0, k) for k, t in enumerate(arrivals)]
    heapq.heapify(events)
    now, in_flight, listener, chosen = 0.0, None, Listener(), []

    def pump():
        nonlocal in_flight
        if in_flight is not None:
            return
        buffer, dry = planner.buffer_s(now), planner.dry
        w = planner.next_window(now)
        if w is not None:
            in_flight = w
            chosen.append((now, w.keep_end - w.keep_start, buffer, dry))
            heapq.heappush(events, (handle(now + GPU_CALL_S), 1, w))
        elif (at := planner.recheck_at()) is not None:
            heapq.heappush(events, (max(at, now + 1e-3), 2, 0))

    while events:
        now, kind, item = heapq.heappop(events)
        if kind == 0:
            planner.add(1, now)
            if item == len(arrivals) - 1:
                planner.finish()
        elif kind == 1:
            measured[item.steps] = GPU_CALL_S  # timed on the worker: the loop adds nothing
            listener.hear(item, now)
            planner.delivered(item, now)
            in_flight = None
        pump()
    assert planner.exhausted and _kept(listener.windows) == list(range(len(arrivals)))
    return listener, chosen


def simulate_ramp_disturbed(arrivals, handle=lambda t: t):
    """The fixed ramp on the same disturbed clock: windows queue when decodable, one decoder
    works through them in order, each result reaches the listener when the loop handles it."""
    ramp, free_at, listener = WindowPlanner(OPTS), 0.0, Listener()
    for k, t in enumerate(arrivals):
        planned = ramp.add(1) + (ramp.finish() if k == len(arrivals) - 1 else [])
        for w in planned:
            free_at = max(free_at, handle(t)) + GPU_CALL_S
            listener.hear(w, handle(free_at))
    return listener


def _rebuffer_size() -> int:
    need = PacingOptions().rebuffer_ms / 1000.0 / STEP_S
    return next(s for s in window_sizes(2, 32) if s >= need)


@pytest.mark.parametrize("case", ["half_blocked_loop", "engine_stall"])
def test_a_lagging_loop_or_a_stalled_engine_never_makes_windows_outgrow_the_buffer(case):
    """Exactly real time (the listener holds about two steps): the loop half blocked for 2 s,
    or the engine silent for 1.5 s. Adaptive windows never outgrow the ramp's, no window
    the listener waits for is larger than its buffer covered (or, once it ran dry below
    real time, the rebuffer size), and the listener hears no more gap than with the ramp."""
    frames = 150
    if case == "half_blocked_loop":
        arrivals, handle = _arrivals_1x(frames), _half_blocked(4.0, 2.0)
    else:
        arrivals, handle = _arrivals_1x(frames, stall_at=4.0, stall_s=1.5), (lambda t: t)
    listener, chosen = simulate_disturbed(arrivals, handle)
    ramp = simulate_ramp_disturbed(arrivals, handle)
    ramp_max = OPTS.new
    for now, size, buffer, dry in chosen:
        assert size <= ramp_max, (now, size, buffer)
        # a window larger than the smallest is decodable now, so it only waits for its
        # decode: never larger than the rebuffer size once dry, else covered by the buffer
        if size > 2:
            assert (dry and size <= _rebuffer_size()) or GPU_CALL_S <= buffer, \
                (now, size, buffer)
    assert listener.first == pytest.approx(ramp.first)
    assert listener.gaps <= ramp.gaps + 1e-9, (listener.gaps, ramp.gaps)


def test_unmeasured_sizes_are_tried_one_step_at_a_time():
    """One measurement says a 2-step window (6 steps with context) takes 0.4 s, longer than
    it plays (a loaded decoder, or a loop-delayed measurement): the planner tries the next
    size up, never a size nobody measured further up (a linear fit from 6 steps would have
    jumped to 16 new steps, 1.4 s of audio the listener waits for)."""
    measured = {6: 0.4}

    def cost(steps):
        if steps in measured:
            return measured[steps]
        larger = [k for k in measured if k > steps]
        return measured[min(larger)] if larger else None

    planner = AdaptivePlanner(OPTS, PacingOptions(), STEP_S, cost)
    for k in range(80):
        planner.add(1, k * STEP_S / 2)  # tokens at twice real time: plenty to choose from
    planner.kept = 40
    planner.delivered(Window(0, 2, 0, 2), 40 * STEP_S)
    assert planner.sustainable_size() == 4 and planner.choose_size(40 * STEP_S) == 4
    measured[8] = 0.4  # the 4-step size measured, still too slow: now the next one
    assert planner.choose_size(40 * STEP_S) == 8
    measured[12] = 0.1  # the 8-step size keeps up: it stays there
    assert planner.choose_size(40 * STEP_S) == 8


@pytest.mark.parametrize("rate_x", [0.9, 1.0, 2.0])
@pytest.mark.parametrize("all_at_once", [False, True])
def test_windows_take_only_the_shapes_captured_before_serving(rate_x, all_at_once):
    """CUDA graphs are captured at start for ``steady_window_steps`` (``Pipeline.
    window_steps``): every window but a stream's last has one of those shapes."""
    windows, _, _ = simulate(rate_x, 120, COST, all_at_once=all_at_once)
    shapes = steady_window_steps(OPTS, planner_sizes(OPTS, PacingOptions()))
    assert {w.steps for w in windows[:-1]} <= set(shapes)
    ramp, _, _ = simulate_ramp(rate_x, 120, COST)
    assert {w.steps for w in ramp[:-1]} <= set(steady_window_steps(OPTS, ramp_sizes(OPTS)))

