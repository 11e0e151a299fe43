"""Benchmark: NeuCodec streaming decode, Neuphonic's scheme against ours, side by side on the
same random full-size NeuCodec weights and the same codes, in one run.

NeuCodec has no exact streaming (bidirectional attention and GroupNorm over the window), so
both schemes decode bounded windows and are measured against a one-pass decode of the same
codes (the reference clip's codes, then the generated ones, as both streams see them).

- Neuphonic (``neutts`` 1.4.1, ``_infer_stream_ggml``, rewritten here; its chunks equal the
  official generator's, ``tests/test_neucodec_stream_bench.py``):
  its token cache starts with the reference's codes; once 30 new codes exist it decodes up
  to 81 frames (50 behind, 25 new, 5 ahead, 1 overlapped each side), keeps 27 frames and
  joins them by a triangular overlap-add at a stride of 25; the rest in one last window.
- Ours: the project's listener-paced planner (``pipeline.pacing.AdaptivePlanner``) with the
  family's window options (``NeuCodecFamily.decode_defaults`` unless given), the reference's
  last codes as the left context of the first windows (as the family's track gives them),
  and the project's stitcher (crossfaded seams).

Two parts. Offline: each scheme's whole schedule, decoded and joined; its decode work per
kept sample and its error against one pass (all the audio, and all but the final chunk).
Real time: codes arrive at ``--rate`` x real time (50 per second at 1x); decodes run on this
CPU as they come due; a listener plays what it has and pauses when dry; first audio (in
codes received) and seconds of gap heard after first audio.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from _common import Listener, report, setup

from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.codecs.neucodec import NeuCodecCodec
from livekit.plugins.veena.codecs.neucodec_model import NeuCodecConfig
from livekit.plugins.veena.models.families.neucodec import NeuCodecFamily
from livekit.plugins.veena.pipeline.options import PipelineOptions
from livekit.plugins.veena.pipeline.pacing import AdaptivePlanner, PacingOptions
from livekit.plugins.veena.pipeline.stitching import Stitcher
from livekit.plugins.veena.pipeline.windowing import Window, WindowOptions, WindowPlanner

NEW, AHEAD, BEHIND, OVERLAP = 25, 5, 50, 1  # Neuphonic's streaming settings


class NeuphonicStream:
    """Neuphonic's streaming schedule and triangular overlap-add over a token cache that
    starts with the reference's ``ref`` codes; ``codes`` are all of them (reference first)."""

    def __init__(self, codes: np.ndarray, ref: int, hop: int) -> None:
        self.codes, self.ref, self.hop = codes, ref, hop
        self.done = ref  # codes whose audio has been emitted
        self.segments: list[np.ndarray] = []
        self.emitted = 0
        self.total = np.zeros(0, np.float64)
        self.weight = np.zeros(0, np.float64)

    def next_window(self, available: int, final: bool) -> tuple[int, int, int, int] | None:
        """(codes start, end, kept samples start, end) to decode now, or None."""
        have = self.ref + available
        if have - self.done >= NEW + AHEAD:
            start = max(self.done - BEHIND - OVERLAP, 0)
            # Neuphonic checks after every token, so the window fires with exactly
            # NEW + AHEAD new codes and its "+ overlap" end is clipped to them
            end = self.done + NEW + AHEAD
            lo = (self.done - start) * self.hop
            return start, end, lo, lo + (NEW + 2 * OVERLAP) * self.hop
        if final and have > self.done:
            rest = have - self.done
            start = max(have - (BEHIND + OVERLAP + rest), 0)
            return start, have, (have - start - rest - OVERLAP) * self.hop, None
        return None

    def push(self, audio: np.ndarray, kept: tuple[int, int | None], final: bool) -> np.ndarray:
        """One window's audio -> the samples now final (as Neuphonic yields them)."""
        seg = audio[kept[0]:kept[1]].astype(np.float64)
        offset = len(self.segments) * NEW * self.hop
        self.segments.append(seg)
        w = np.linspace(0, 1, len(seg) + 2)[1:-1]
        w = 0.5 - np.abs(w - 0.5)
        end = offset + len(seg)
        if end > len(self.total):
            self.total = np.pad(self.total, (0, end - len(self.total)))
            self.weight = np.pad(self.weight, (0, end - len(self.weight)))
        self.total[offset:end] += w * seg
        self.weight[offset:end] += w
        upto = len(self.total) if final else len(self.segments) * NEW * self.hop
        out = self.total[self.emitted:upto] / self.weight[self.emitted:upto]
        self.emitted = upto
        if not final:
            self.done += NEW
        return out.astype(np.float32)


class OurStream:
    """The project's planner and stitcher over the generated codes, the reference's last
    codes as the left context a window lacks."""

    def __init__(self, codes: np.ndarray, ref: int, hop: int, window: WindowOptions,
                 pacing: PacingOptions, costs: dict[int, float], crossfade: int) -> None:
        self.codes, self.ref, self.hop = codes, ref, hop
        self.window = window
        self.planner = AdaptivePlanner(window, pacing, hop / 24000, costs.get)
        self.stitcher = Stitcher(hop, crossfade)

    def decode_input(self, w: Window) -> CodecInput:
        context = min(self.ref, max(0, self.window.left - (w.keep_start - w.start)))
        start = self.ref + w.start - context
        return CodecInput(codes=self.codes[start:self.ref + w.end], start_step=w.start, seed=0,
                          context_steps=context)


def timed_decode(codec: NeuCodecCodec, codes: np.ndarray, costs: dict[int, float] | None = None,
                 context: int = 0) -> tuple[np.ndarray, float]:
    t = time.perf_counter()
    (audio,) = codec.decode([CodecInput(codes=codes, start_step=0, seed=0,
                                        context_steps=context)])
    spent = time.perf_counter() - t
    if costs is not None:  # the planner's measured cost per window length (last seen)
        costs[len(codes)] = spent
    return audio, spent


def run_neuphonic(codec, codes, ref, n, rate: float | None) -> dict:
    """``rate``: codes per second as a multiple of real time, or None (offline: all codes
    at once, no clock)."""
    hop = codec.samples_per_step
    s = NeuphonicStream(codes, ref, hop)
    ear, out, decoded, first_codes = Listener(24000), [], 0, None
    t0 = time.perf_counter()
    available = 0
    while True:
        available = n if rate is None else min(n, int((time.perf_counter() - t0) * 50 * rate))
        final = available == n
        w = s.next_window(available, final)
        if w is None:
            if final:
                break
            time.sleep(max(0.0, t0 + (available + 1) / (50 * rate) - time.perf_counter()))
            continue
        start, end, lo, hi = w
        audio, _ = timed_decode(codec, codes[start:end])
        decoded += end - start
        if first_codes is None:  # offline: when its rule would have fired
            first_codes = available if rate else end - ref
        last = hi is None
        chunk = s.push(audio, (lo, hi), last)
        out.append(chunk)
        ear.hear(len(chunk))
        if last:
            break
    return {"audio": np.concatenate(out), "decoded": decoded, "first_codes": first_codes,
            "gap_s": ear.gap_s, "final_chunk_at": s.emitted - len(out[-1]),
            "chunk_samples": [len(c) for c in out]}


def run_ours(codec, codes, ref, n, rate: float | None, window, pacing, costs) -> dict:
    """Offline (``rate`` None): the fixed ramp (``WindowPlanner``), whose windows do not
    depend on timing; in real time: the listener-paced planner, the product's default."""
    hop = codec.samples_per_step
    crossfade = int(PipelineOptions().crossfade_ms * 24000 / 1000)
    s = OurStream(codes, ref, hop, window, pacing, costs, crossfade)
    if rate is None:
        ramp = WindowPlanner(window)
        out, decoded, sizes = [], 0, []
        for w in ramp.add(n) + ramp.finish():
            inp = s.decode_input(w)
            audio, _ = timed_decode(codec, inp.codes, costs, inp.context_steps)
            decoded += len(inp.codes)
            out.append(s.stitcher.push(w, audio))
            sizes.append(w.keep_end - w.keep_start)
        return {"audio": np.concatenate(out), "decoded": decoded, "gap_s": None,
                "first_codes": window.first + window.right, "sizes": sizes}
    p = s.planner
    ear, out, decoded, first_codes = Listener(24000), [], 0, None
    t0 = time.perf_counter()
    windows = []
    while True:
        now = time.perf_counter()
        available = n if rate is None else min(n, int((now - t0) * 50 * rate))
        if available > p.available:
            p.add(available - p.available, now)
        if available == n and not p.final:
            p.finish()
        w = p.next_window(now)
        if w is None:
            if p.exhausted:
                break
            wake = t0 + (available + 1) / (50 * rate) if rate else now
            recheck = p.recheck_at()
            if recheck is not None:
                wake = min(wake, recheck)
            time.sleep(max(0.0, wake - time.perf_counter()))
            continue
        inp = s.decode_input(w)
        audio, _ = timed_decode(codec, inp.codes, costs, inp.context_steps)
        decoded += len(inp.codes)
        first_codes = available if first_codes is None else first_codes
        chunk = s.stitcher.push(w, audio)
        p.delivered(w, time.perf_counter())
        out.append(chunk)
        ear.hear(len(chunk))
        windows.append(w.keep_end - w.keep_start)
    return {"audio": np.concatenate(out), "decoded": decoded, "first_codes": first_codes,
            "gap_s": ear.gap_s, "sizes": windows}


def rel_rms(got: np.ndarray, want: np.ndarray) -> float:
    n = min(len(got), len(want))
    err = got[:n].astype(np.float64) - want[:n]
    return float(np.sqrt(np.mean(err**2)) / np.sqrt(np.mean(want[:n].astype(np.float64) ** 2)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref-frames", type=int, default=150, help="reference clip codes (3 s)")
    ap.add_argument("--frames", type=int, default=500, help="generated codes (10 s)")
    ap.add_argument("--rates", default="1.0", help="code rates as multiples of real time")
    shape = NeuCodecFamily.decode_defaults  # the product's windows, unless told otherwise
    ap.add_argument("--first", type=int, default=shape.window.first)
    ap.add_argument("--new", type=int, default=shape.window.new)
    ap.add_argument("--left", type=int, default=shape.window.left)
    ap.add_argument("--right", type=int, default=shape.window.right)
    ap.add_argument("--max-new", type=int, default=shape.pacing.max_new)
    ap.add_argument("--tiny", action="store_true", help="tiny decoder (the test's size)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    setup()
    load = os.getloadavg()  # a shared machine: the real-time rows depend on it
    torch.set_num_threads(args.threads)
    codec = NeuCodecCodec.random(seed=0, config=NeuCodecConfig.tiny() if args.tiny else None)
    codec.warmup()
    hop, ref, n = codec.samples_per_step, args.ref_frames, args.frames
    rng = np.random.default_rng(0)
    codes = rng.integers(0, codec.config.codebook_size, ref + n)
    one, one_s = timed_decode(codec, codes)
    one = one[ref * hop:]
    window = WindowOptions(args.first, args.new, args.left, args.right).validate()
    pacing = PacingOptions(max_new=args.max_new).validate()
    costs: dict[int, float] = {}
    rows = []
    for rate in [None, *(float(r) for r in args.rates.split(","))]:
        theirs = run_neuphonic(codec, codes, ref, n, rate)
        ours = run_ours(codec, codes, ref, n, rate, window, pacing, costs)
        body = theirs["final_chunk_at"]  # all but Neuphonic's last chunk, for both
        for name, r in (("neuphonic 50/25/5 +1 overlap", theirs),
                        (f"ours {'paced' if rate else 'ramp'} first {window.first} "
                         f"left {window.left} right {window.right} "
                         f"max {pacing.max_new if rate else window.new}", ours)):
            rows.append({"scheme": name, "rate_x_realtime": rate or "offline",
                         "decoded_per_kept": r["decoded"] / n,
                         "first_audio_codes": r["first_codes"],
                         "gap_s_after_first_audio": r["gap_s"] if rate else None,
                         "rel_rms_err": rel_rms(r["audio"], one),
                         "rel_rms_err_before_final_chunk": rel_rms(r["audio"][:body],
                                                                   one[:body]),
                         "audio_samples": len(r["audio"]), "one_pass_samples": len(one)})
        rows[-1]["window_sizes"] = ours["sizes"]
    report("neucodec_stream", rows, {
        "reference_frames": ref, "generated_frames": n, "threads": args.threads,
        "decoder": "tiny" if args.tiny else "full size (published NeuCodec sizes)",
        "one_pass_s": one_s, "window": vars(window), "max_new": pacing.max_new,
        "measured_cost_s": {str(k): v for k, v in sorted(costs.items())},
        "load_average_before_after": [load, os.getloadavg()]})


if __name__ == "__main__":
    main()
