"""One engine request's run: tokens in, crossfaded float audio out, all its state in one place.

A producer task reads the engine's tokens, parses them through the family's track and asks
the guards about each step; the planner says which window to decode next and the run
submits it to the decode scheduler. Each decoded window is stitched and pushed to the run's
sink from the decode's completion, in submission order: no task wakes to hand a window on.
Listener-paced (``pacing.AdaptivePlanner``), a run keeps one window in the decoder; with the
fixed ramp every window goes out when decodable. ``aclose()`` is the one place where a run
ends: the producer stops (the vLLM request is aborted), every pending window is dropped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import time
from dataclasses import replace
from typing import Callable

import numpy as np

from ..codecs.base import StreamPart
from .engine import EngineClosedError, EngineError, SamplingOptions
from .guards import RunGuards, fade_out, retry_seed
from .pacing import AdaptivePlanner
from .run_host import RunHost, RunOwner
from .stitching import Stitcher
from .tasks import settle
from .windowing import Window, WindowPlanner

logger = logging.getLogger(__name__)


def piece_seed(seed: int, index: int) -> int:
    """Codec noise seed of one piece: a piece decodes the same in any batch."""
    return (seed * 1000003 + index) & 0x7FFFFFFF


class RequestRun:
    """Piece ``index`` of ``synthesis``: its engine requests, track, planner, stitcher,
    pending windows and progress."""

    def __init__(self, pipeline: RunHost, synthesis: RunOwner, text: str,
                 index: int) -> None:
        self._p = pipeline
        self._syn = synthesis
        self._text = text
        self.request_id = synthesis.request_id if index == 0 else f"{synthesis.request_id}.{index}"
        self.track = pipeline.family.new_track(pipeline.table, self.request_id,
                                               synthesis.speaker_globals)
        if pipeline.options.adaptive_windows:
            self.planner: AdaptivePlanner | None = AdaptivePlanner(
                pipeline.window, pipeline.pacing,
                pipeline.codec.samples_per_step / pipeline.codec.sample_rate,
                pipeline.scheduler.decode_cost)
            # the trimmed start is never heard, and what the watermark holds back not yet
            self.planner.unheard_steps = pipeline.family.trim_start_steps + -(
                -synthesis.held_back_samples // pipeline.codec.samples_per_step)
            self._ramp: WindowPlanner | None = None
        else:
            self.planner, self._ramp = None, WindowPlanner(pipeline.window)
        self._in_flight = 0
        self._ended = False
        self._recheck: asyncio.TimerHandle | None = None
        self.seed = piece_seed(synthesis.seed, index)
        new_stream = getattr(pipeline.codec, "new_stream", None)
        self._stream = new_stream(self.seed) if new_stream is not None else None
        """A streaming codec's decoder state for this run (dropped with it)."""
        self._unheard = pipeline.family.trim_start_steps * pipeline.codec.samples_per_step
        """Samples still to drop from the start, as the model's reference does."""
        self._stream_sent = 0
        """Steps sent to that stream in windows so far (the next window skips them)."""
        self._windowed_end = 0
        """The steps a submitted window has reached (a guard's cut never goes below it)."""
        self.guards = RunGuards.for_run(pipeline.options.guards, text, pipeline.codec,
                                        pipeline.family, synthesis.sampling.max_tokens is None)
        self.guard_cut: str | None = None
        """The guard that ended this run early (``guards.GUARDS``), if one did."""
        self.stitcher = Stitcher(pipeline.codec.samples_per_step,
                                 int(pipeline.options.crossfade_ms * pipeline.codec.sample_rate / 1000),
                                 exact=self._stream is not None)
        self.engine_request_ids: list[str] = []
        self._submitted: collections.deque[tuple[Window, asyncio.Future]] = collections.deque()
        """Windows handed to the decoder, in order, until their turn to be delivered."""
        self._sink: Callable[[np.ndarray, bool], None] | None = None
        self._finished: asyncio.Future | None = None
        """Done once every window went to the sink, or failed with what ended the run."""
        self._no_more_windows = False
        self._steps_done = False
        """The engine has sent its last step."""
        self._done_sent = False
        """The sink has had its ``done`` call (with the last window's audio)."""
        self._producer: asyncio.Task | None = None
        self.pending_windows = 0
        self.awaiting_tokens = True
        self.last_progress = time.monotonic()

    def progress_at(self) -> float:
        """When this run last moved forward (monotonic): its tokens and decoded windows, and
        the engine or the decoder serving others while this run waits its turn there (a
        stall is "nothing moves", never "busy elsewhere")."""
        t = self.last_progress
        if self.awaiting_tokens:  # (one with an adapter vLLM may starve: for a while only)
            others = self._p.engine.last_output
            if self._syn.adapter is not None:
                others = min(others, t + self._p.engine.options.adapter_wait_s)
            t = max(t, others)
        if self.pending_windows:
            t = max(t, self._p.scheduler.last_done)
        return t

    def _moved(self) -> None:
        self.last_progress = time.monotonic()

    async def play(self, sink: Callable[[np.ndarray, bool], None]) -> None:
        """Run to the end: ``sink(samples, done)`` gets each window's stitched audio from its
        decode's completion, in order, ``done`` with the last (or once at the end, empty).
        Raises what ended the run, in order; cancelled, the run ends (``aclose``)."""
        await self._p.start()
        self._sink = sink
        self._finished = asyncio.get_running_loop().create_future()
        self._producer = asyncio.create_task(self._produce(),
                                             name=f"veena-produce-{self.request_id}")
        try:
            await self._finished
            await self._producer  # re-raise an engine failure
            tail = self.stitcher.finish()
            if not self._done_sent:
                sink(tail, True)
        finally:
            await self.aclose()

    def _hand_over(self) -> None:
        """Push the windows decoded at the front of the order to the sink; finish once
        every submitted window has gone (or at the first failure, which ends the run)."""
        submitted, finished = self._submitted, self._finished
        if self._sink is None or finished is None or finished.done():
            return
        try:
            while submitted and submitted[0][1].done():
                window, fut = submitted.popleft()
                if fut.cancelled():  # the scheduler closed under the run: a failure, in order
                    raise EngineClosedError(f"the pipeline closed under request "
                                            f"{self.request_id}")
                audio = fut.result()  # a decode failure is raised here, in order
                self.pending_windows -= 1
                self._moved()
                timings = self._syn.timings
                if timings.first_decode_done is None:
                    timings.first_decode_done = time.perf_counter()
                # the last window: nothing is submitted after it and no window will follow
                last = not submitted and (self._no_more_windows or (
                    self.planner is not None and self.planner.exhausted))
                pcm = self.stitcher.push(window, audio)
                if self._unheard:
                    cut = min(self._unheard, len(pcm))
                    pcm, self._unheard = pcm[cut:], self._unheard - cut
                pcm, shortened = self.guards.trim_silence(pcm)
                for _ in range(shortened):  # the chunk goes on: it ends where the model stops
                    self._syn.guard_log.fire("silence", self.request_id,
                                             s=self.guards.options.silence_s)
                if last and self.guard_cut is not None:
                    pcm = fade_out(pcm, self.guards.fade_samples)
                self._done_sent = last
                self._sink(pcm, last)
        except Exception as e:  # the run ends with it, where the listener has reached
            finished.set_exception(e)
            return
        if self._no_more_windows and not submitted:
            finished.set_result(None)

    async def aclose(self) -> None:
        """Stop generating (vLLM request aborted) and drop every window not yet decoded."""
        self.pending_windows = 0
        self._ended = True
        self._sink = None  # nothing more reaches the listener
        self._cancel_recheck()
        # windows first: no codec call is wasted on them while vLLM's abort is awaited
        dropped = self._drop_windows()
        try:
            if self._producer is not None:  # (a failed one's error is taken here too)
                self._producer.cancel()
                await settle([self._producer])
        finally:  # even when this close is itself cancelled
            dropped += self._drop_windows()
            if dropped:
                logger.info("dropped pending decode windows",
                            extra={"request_id": self.request_id, "windows": dropped})

    def _drop_windows(self) -> int:
        dropped = self._p.scheduler.cancel_request(self.request_id)
        for _, fut in self._submitted:
            dropped += fut.cancel()
        self._submitted.clear()
        return dropped

    def _cut_steps(self, guard: str, keep: int, new: int) -> int:
        """A loop or a runaway found in the ``new`` steps just parsed: keep ``keep`` steps,
        or where decoding has already reached (and one more, to carry the fade), and
        nothing after; return how many of the new steps are announced."""
        steps, planner = self.track.steps, self.planner or self._ramp
        announced = len(steps) - new
        keep = min(len(steps), max(keep, self._windowed_end + 1))
        self._syn.guard_log.fire(guard, self.request_id, steps=len(steps), kept_steps=keep)
        del steps[keep:]
        self.guard_cut = guard
        if keep < announced:  # the planner is told of fewer steps than it had
            planner.cut(keep)
        return max(0, keep - announced)

    def _steps_arrived(self, count: int, stale: bool) -> None:
        """``stale``: taken on waking from a park, later than they arrived."""
        if self.planner is not None:
            self.planner.add(count, time.monotonic(), stale)
            self._pump()
        else:
            self._submit(self._ramp.add(count))

    def _no_more_steps(self) -> None:
        self._steps_done = True
        if self.planner is not None:
            self.planner.finish()
            self._pump()
        else:
            self._submit(self._ramp.finish())
            self._end()

    def _pump(self) -> None:
        """Listener-paced: with no window in flight, submit the one the planner picks now;
        if it holds one back for a larger size, ask it again when its answer can change
        without a new step (one timer, moved only to an earlier time; no polling)."""
        if self.planner is None or self._ended or self._in_flight:
            return
        now = time.monotonic()
        window = self.planner.next_window(now)
        if window is not None:
            self._cancel_recheck()
            self._submit([window])
        elif self.planner.exhausted:
            self._cancel_recheck()
            self._end()
        elif (at := self.planner.recheck_at()) is not None:
            loop = asyncio.get_running_loop()
            when = loop.time() + max(at - now, 0.001)
            if self._recheck is None or self._recheck.when() > when:
                self._cancel_recheck()  # an earlier one stays: it asks, then re-arms
                self._recheck = loop.call_at(when, self._rechecked)
        else:
            self._cancel_recheck()

    def _rechecked(self) -> None:
        self._recheck = None
        self._pump()

    def _cancel_recheck(self) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None

    def _end(self) -> None:
        """No window follows: the run finishes after the ones submitted so far."""
        if not self._ended:
            self._ended = True
            self._no_more_windows = True
            self._hand_over()

    def _submit(self, windows: list[Window]) -> None:
        if self._ended:
            return
        timings = self._syn.timings
        for w in windows:
            if timings.first_window_ready is None:
                timings.first_window_ready = time.perf_counter()
            self.pending_windows += 1
            self._in_flight += 1
            self._windowed_end = max(self._windowed_end, w.end)
            item = self.track.window_input(w, self.seed)
            if self._stream is not None:
                item.stream = self._stream_part(w)
            fut = self._p.scheduler.submit(self.request_id, item,
                                           functools.partial(self._decoded, w))
            self._submitted.append((w, fut))

    def _stream_part(self, w: Window) -> StreamPart:
        """What ``w`` does to this run's codec stream: its steps not yet sent, a flush once
        no step can follow its end, and its kept steps' audio."""
        skip = max(0, self._stream_sent - w.start)
        self._stream_sent = max(self._stream_sent, w.end)
        planner = self.planner if self.planner is not None else self._ramp
        flush = w.is_last or (self._steps_done and w.end >= planner.available)
        return StreamPart(self._stream, skip, w.keep_end, flush, w.is_last)

    def _decoded(self, window: Window, fut: asyncio.Future) -> None:
        """A window's decode ended: hand it over in order; listener-paced, choose the next
        (its audio counts as heard from now on: the planner may underestimate the
        listener's buffer, never overestimate it)."""
        self._in_flight -= 1
        self._hand_over()
        if self.planner is None or fut.cancelled() or fut.exception() is not None:
            return
        self.planner.delivered(window, time.monotonic())
        self._pump()

    async def _produce(self) -> None:
        p, syn = self._p, self._syn
        try:
            capture = (p.family.capture_sampling(syn.sampling, p.table)
                       if syn.speaker_globals is None else None)
            # an adapter's name is a speaker name too (asked of a family only then)
            speakers = {} if syn.adapter is None else {"speakers": (syn.adapter.name,)}
            if capture is not None:  # capture the speaker tokens, then continue with them
                prompt = p.family.prompt(p.engine.tokenizer, self._text, syn.voice, None,
                                         **speakers)
                await self._generate(prompt, capture, f"{self.request_id}.globals")
                if syn.speaker_globals is None:
                    raise EngineError(f"request {self.request_id} produced no complete set of "
                                      "speaker tokens")
            prompt = p.family.prompt(p.engine.tokenizer, self._text, syn.voice,
                                     syn.speaker_globals, **speakers)
            main = p.sampling.main(syn.sampling, self._text, len(prompt), p.table,
                                   self.guards.max_steps)
            await self._generate(prompt, main, self.request_id, main=True)
            if not self.track.steps and self.guards.options.empty_tokens:
                await self._retry_empty(prompt, main)
            self._no_more_steps()
        except BaseException:
            self._end()  # the windows submitted go out, then the run re-raises the failure
            raise
        finally:
            syn.timings.invalid_frames += self.track.stats.invalid_frames

    async def _retry_empty(self, prompt: list[int], main: SamplingOptions) -> None:
        """The empty guard: no audio at all (so none heard). Ask once more on a new track
        with a derived seed and the same prompt: the voice (speaker, description, adapter,
        BiCodec globals) stays."""
        p, syn, log = self._p, self._syn, self._syn.guard_log
        log.fire("empty", self.request_id, tokens=self.track.stats.tokens, retry=True)
        syn.timings.invalid_frames += self.track.stats.invalid_frames
        self.track = p.family.new_track(p.table, self.request_id, syn.speaker_globals)
        seed = retry_seed(self.seed if main.seed is None else main.seed)
        await self._generate(prompt, replace(main, seed=seed), f"{self.request_id}.retry", True)
        if not self.track.steps:  # the chunk ends without audio
            log.fire("empty", self.request_id, tokens=self.track.stats.tokens, retry=False)

    async def _generate(self, prompt: list[int], sampling: SamplingOptions,
                        request_id: str, main: bool = False) -> None:
        """``main``: the request that speaks (its steps are guarded), not a capture."""
        syn, timings = self._syn, self._syn.timings
        self.engine_request_ids.append(request_id)
        syn.vllm_request_ids.append(request_id)
        self.awaiting_tokens = True
        track, stats = self.track, self.track.stats
        planner, alarm, woke = self.planner, self._p.alarm, False
        capturing = syn.speaker_globals is None and self._p.family.captures_speaker_globals
        lora = {} if syn.adapter is None else {"adapter": syn.adapter}
        guards, watch_empty = self.guards, main and not track.steps
        silent_from = stats.tokens - stats.global_tokens
        gen = self._p.engine.generate(prompt, sampling, request_id, **lora)
        async with contextlib.aclosing(gen):
            async for ids in gen:  # once per token per request: keep this loop lean
                self.awaiting_tokens = False
                self._moved()
                now = time.perf_counter()
                if timings.first_token is None:
                    timings.first_token = now
                timings.tokens += len(ids)
                timings.last_token = now
                new = track.feed(ids)
                if capturing and track.speaker_globals is not None:
                    capturing = False
                    syn.captured(track.speaker_globals)
                if new:
                    watch_empty = False
                    cut = guards.steps(track.steps, new) if main else None
                    if cut is not None:
                        self._steps_arrived(self._cut_steps(*cut, new), woke)
                        break
                    self._steps_arrived(new, woke)
                elif watch_empty and guards.empty(stats.tokens - stats.global_tokens
                                                  - silent_from):
                    break  # no audio within the guard's tokens: asked again, once
                if stats.stopped:
                    break
                if woke:  # what waited is stamped with the wake's time, not its arrival's:
                    woke = False  # park again only after a token seen as it arrived
                elif planner is not None and alarm is not None:
                    # park until tokens matter again: vLLM merges what arrives meanwhile
                    at = planner.pull_at(time.monotonic(), alarm.tick_s)
                    if at is not None:
                        await alarm.sleep_until(at)
                        woke = True
