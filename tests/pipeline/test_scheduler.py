"""Decode scheduler logic with a gated codec: batching and cancellation (no torch needed)."""

import asyncio
import threading

import numpy as np
import pytest

from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.pipeline.scheduler import DecodeScheduler, SchedulerOptions


class GatedCodec:
    """Records what it decodes; blocks the first batch until released."""

    name, sample_rate, samples_per_step = "gated", 100, 10

    def __init__(self):
        self.gate = threading.Event()
        self.seen: list[tuple[int, int]] = []  # (seed, start) of every decoded window
        self.batches: list[int] = []

    def decode(self, batch):
        self.gate.wait(5)
        self.batches.append(len(batch))
        self.seen += [(b.seed, b.start_step) for b in batch]
        return [np.full(b.codes.shape[0] * 10, b.seed, np.float32) for b in batch]

    def warmup(self):
        pass


def _win(seed, start, steps=4):
    return CodecInput(np.zeros((steps, 7), np.int64), start, seed)


async def test_same_shape_windows_batch_and_results_route_back():
    codec = GatedCodec()
    codec.gate.set()
    s = DecodeScheduler(codec, SchedulerOptions(max_batch=8, max_wait_ms=20, adaptive_batch=False))
    futs = [s.submit(f"r{i}", _win(i, 0)) for i in range(5)] + [s.submit("odd", _win(99, 0, 6))]
    out = await asyncio.gather(*futs)
    assert [o[0] for o in out] == [0, 1, 2, 3, 4, 99]
    assert sorted(codec.batches) == [1, 5]
    assert s.stats.batch_sizes[5] == 1
    await s.aclose()


async def test_cancelled_request_windows_never_run():
    codec = GatedCodec()
    s = DecodeScheduler(codec, SchedulerOptions(max_batch=1, max_wait_ms=0))
    blocker = s.submit("a", _win(1, 0))
    await asyncio.sleep(0.05)  # the first window is now inside the codec, blocked
    doomed = [s.submit("b", _win(2, k)) for k in range(3)]
    kept = s.submit("c", _win(3, 0))
    assert s.cancel_request("b") == 3
    assert s.pending_for("b") == 0
    codec.gate.set()
    await blocker
    await kept
    assert all(f.cancelled() for f in doomed)
    assert (2, 0) not in codec.seen and len(codec.seen) == 2
    assert s.stats.cancelled_windows == 3
    await s.aclose()


async def test_cancelling_the_awaiting_task_drops_its_window():
    codec = GatedCodec()
    s = DecodeScheduler(codec, SchedulerOptions(max_batch=1, max_wait_ms=0))
    first = s.submit("a", _win(1, 0))
    await asyncio.sleep(0.05)
    waiter = asyncio.ensure_future(s.submit("b", _win(2, 0)))
    await asyncio.sleep(0)
    waiter.cancel()
    codec.gate.set()
    await first
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await asyncio.sleep(0.05)
    assert (2, 0) not in codec.seen
    await s.aclose()


class _BlockingCodec(GatedCodec):
    """Says when a decode has started, and on which thread, then blocks until released."""

    def __init__(self):
        super().__init__()
        self.entered = threading.Event()
        self.thread: int | None = None

    def decode(self, batch):
        self.thread = threading.get_ident()
        self.entered.set()
        self.gate.wait(HANG_GUARD_S)
        return super().decode(batch)


HANG_GUARD_S = 120  # only against a hang: a test that fails leaves no thread blocked forever


async def _until(condition) -> bool:
    """Poll ``condition`` until it holds (a bound only against a hang, never a deadline)."""
    for _ in range(int(HANG_GUARD_S / 0.01)):
        if condition():
            return True
        await asyncio.sleep(0.01)
    return condition()


async def test_torch_decode_never_blocks_the_event_loop():
    """The codec's decode runs on the scheduler's worker thread: while a decode is provably
    inside the codec (blocked on a threading.Event), the event loop keeps running tasks.
    No clock: a decode on the loop's own thread would stop every tick below (and this test
    would fail at its thread check)."""
    codec = _BlockingCodec()
    s = DecodeScheduler(codec, SchedulerOptions(max_batch=1, max_wait_ms=0))
    decoding = asyncio.ensure_future(s.submit("big", _win(1, 0)))
    assert await _until(lambda: codec.entered.is_set())
    assert codec.entered.is_set() and codec.thread != threading.get_ident()
    ticks = 0

    async def ticker():
        nonlocal ticks
        for _ in range(200):
            await asyncio.sleep(0)
            ticks += 1

    await ticker()  # 200 loop turns while the decode is held inside the codec
    assert ticks == 200 and not decoding.done() and not codec.gate.is_set()
    codec.gate.set()
    audio = await decoding
    assert len(audio) == 4 * 10
    await s.aclose()


class TimedCodec:
    """Costs ``per_batch + per_window * n`` seconds of sleep (no CPU): a GPU-like codec
    (a batch costs about one window) or a CPU-like one (a batch costs the sum)."""

    name, sample_rate, samples_per_step = "timed", 100, 10

    def __init__(self, per_batch: float, per_window: float):
        self.per_batch, self.per_window = per_batch, per_window
        self.batches: list[int] = []

    def decode(self, batch):
        import time

        time.sleep(self.per_batch + self.per_window * len(batch))
        self.batches.append(len(batch))
        return [np.zeros(b.codes.shape[0] * 10, np.float32) for b in batch]

    def warmup(self):
        pass


async def _rounds(s, rounds: int, streams: int):
    for r in range(rounds):
        await asyncio.gather(*(s.submit(f"s{i}", _win(i, r)) for i in range(streams)))


async def test_batches_grow_where_batching_pays():
    """GPU-like: a batch costs what one window costs, so the limit grows to the cap."""
    codec = TimedCodec(0.02, 0.0)
    s = DecodeScheduler(codec, SchedulerOptions(max_batch=8, max_wait_ms=5))
    await _rounds(s, 40, 8)
    assert max(codec.batches[len(codec.batches) // 2:]) == 8 and s.batch_limit() == 8
    # measured sizes only: a smaller one is bounded by a larger one, a larger one is unknown
    assert 0 < s.decode_cost(4) and s.decode_cost(2) == s.decode_cost(4)
    assert s.decode_cost(8) is None
    await s.aclose()


def test_batch_limit_from_measured_cost_per_window():
    s = DecodeScheduler(TimedCodec(0, 0), SchedulerOptions(max_batch=16))
    assert s.batch_limit() == 1  # nothing measured: one window alone first
    s._per_window.update({1: 0.020, 2: 0.021, 4: 0.019})  # CPU-like: batching saves < 10 %
    assert s.batch_limit() == 1
    s._per_window.update({2: 0.012, 4: 0.007})  # GPU-like
    assert s.batch_limit() == 4
    assert DecodeScheduler(TimedCodec(0, 0), SchedulerOptions(
        max_batch=16, adaptive_batch=False)).batch_limit() == 16


class _ClockCodec:
    """Advances a simulated clock by ``call_s`` per codec call (no real time)."""

    name, sample_rate, samples_per_step = "clock", 100, 10

    def __init__(self, clock: list, call_s: float):
        self.clock, self.call_s = clock, call_s

    def decode(self, batch):
        self.clock[0] += self.call_s
        return [np.zeros(b.codes.shape[0] * 10, np.float32) for b in batch]

    def warmup(self):
        pass


async def test_decode_cost_is_the_codec_call_alone_not_the_loop_delay():
    """The cost a planner reads is timed on the worker around the codec call: an event loop
    that lags between submit and result (here a simulated second, every window) adds
    nothing, and unmeasured sizes stay unknown instead of scaled from measured ones."""
    clock = [0.0]
    s = DecodeScheduler(_ClockCodec(clock, 0.003), SchedulerOptions(max_batch=1, max_wait_ms=0),
                        clock=lambda: clock[0])
    assert s.decode_cost(6) is None  # nothing measured yet: no guess
    for k in range(5):
        fut = s.submit("r", _win(1, k, steps=6))
        clock[0] += 1.0  # the loop is blocked for a (simulated) second after each submit
        await fut
        clock[0] += 1.0
    assert s.decode_cost(6) == pytest.approx(0.003)
    assert s.decode_cost(4) == pytest.approx(0.003) and s.decode_cost(8) is None
    assert s.stats.decode_s_total == pytest.approx(5 * 0.003)
    await s.aclose()


async def test_no_task_runs_the_scheduler_and_windows_queued_meanwhile_join_one_batch():
    """A batch starts from a submit's next loop turn or the previous batch's end: the
    scheduler creates no task, and what arrives while the codec is busy goes out together."""
    codec = _BlockingCodec()
    s = DecodeScheduler(codec, SchedulerOptions(max_batch=8, max_wait_ms=0, adaptive_batch=False))
    tasks = asyncio.all_tasks()
    first = s.submit("a", _win(1, 0))
    assert await _until(lambda: codec.entered.is_set())
    later = [s.submit(f"b{i}", _win(2 + i, 0)) for i in range(3)]
    assert asyncio.all_tasks() == tasks
    codec.gate.set()
    assert [len(a) for a in await asyncio.gather(first, *later)] == [40] * 4
    assert codec.batches == [1, 3]
    await s.aclose()


async def test_close_mid_decode_ends_each_window_once_and_ignores_the_late_result():
    codec = _BlockingCodec()
    s = DecodeScheduler(codec, SchedulerOptions(max_batch=8, max_wait_ms=0, adaptive_batch=False))
    loop = asyncio.get_running_loop()
    errors: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    ended: list[asyncio.Future] = []
    try:
        inside = s.submit("a", _win(1, 0), ended.append)
        assert await _until(lambda: codec.entered.is_set())
        queued = s.submit("b", _win(2, 0), ended.append)
        await s.aclose()
        assert inside.cancelled() and queued.cancelled()
        assert len(ended) == 2 and set(ended) == {inside, queued}
        codec.gate.set()  # the codec call finishes after the close: nothing more happens
        assert await _until(lambda: codec.batches)
        await asyncio.sleep(0.05)
        assert len(ended) == 2 and errors == []
        with pytest.raises(RuntimeError, match="closed"):
            s.submit("c", _win(3, 0))
    finally:
        loop.set_exception_handler(None)


class _FailingOnceCodec(GatedCodec):
    def __init__(self):
        super().__init__()
        self.gate.set()
        self.failed = False

    def decode(self, batch):
        if not self.failed:
            self.failed = True
            raise ValueError("bad window")
        return super().decode(batch)


async def test_codec_failure_fails_its_batch_and_the_next_batch_runs():
    s = DecodeScheduler(_FailingOnceCodec(), SchedulerOptions(max_batch=1, max_wait_ms=0))
    ended: list[asyncio.Future] = []
    bad = s.submit("a", _win(1, 0), ended.append)
    good = s.submit("b", _win(2, 0), ended.append)
    with pytest.raises(ValueError, match="bad window"):
        await bad
    assert (await good)[0] == 2 and ended == [bad, good]
    await s.aclose()


def test_a_scheduler_moves_to_the_next_event_loop():
    """One scheduler, two event loops in turn (``asyncio.run`` twice, as a script might):
    what the first loop left queued is dropped with it, and the second loop decodes."""
    codec = GatedCodec()
    codec.gate.set()
    s = DecodeScheduler(codec, SchedulerOptions(max_batch=1, max_wait_ms=0))

    async def first():
        s.submit("left", _win(1, 0))  # the loop ends before this window's turn

    async def second():
        return await s.submit("next", _win(2, 0))

    asyncio.run(first())
    assert asyncio.run(second())[0] == 2
    asyncio.run(s.aclose())


class _ShortCodec(GatedCodec):
    """Returns one result too few."""

    def decode(self, batch):
        return super().decode(batch)[:-1]


async def test_a_codec_that_returns_too_few_windows_fails_the_batch():
    codec = _ShortCodec()
    codec.gate.set()
    s = DecodeScheduler(codec, SchedulerOptions(max_batch=4, max_wait_ms=0, adaptive_batch=False))
    futs = [s.submit(f"r{i}", _win(i, 0)) for i in range(3)]
    for fut in futs:  # none is left waiting forever
        with pytest.raises(RuntimeError, match="returned 2 windows for a batch of 3"):
            await fut
    await s.aclose()
