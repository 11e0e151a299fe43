"""Benchmark 2: BiCodec streaming, re-decode-everything-every-24-tokens vs bounded windows.

The reference (the Veena3 seed pipeline) re-decodes ALL semantic tokens each time 24 new
ones arrive: quadratic work, and its last chunks wait for a whole-utterance decode. Ours:
windows of 50 new tokens with 40 left / 20 right context. Work is counted exactly from
each schedule. Wall time: at 5 s both schemes are run for real; for every duration the
totals are also computed from decode times measured here at each window length the schedule
uses (decode cost is linear in length), and the 5 s run checks that model.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from _common import report, setup

from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.codecs.bicodec import BiCodecCodec
from livekit.plugins.veena.pipeline.windowing import WindowOptions, WindowPlanner

TOKENS_PER_S = 50


def reference_schedule(n: int, every: int = 24) -> list[int]:
    """Lengths decoded by the reference: all tokens so far, every ``every`` tokens, then the rest."""
    lengths = list(range(every, n + 1, every))
    if not lengths or lengths[-1] != n:
        lengths.append(n)
    return lengths


def our_schedule(n: int, opts: WindowOptions) -> list[int]:
    planner = WindowPlanner(opts)
    windows = []
    for _ in range(n):
        windows += planner.add(1)
    return [w.steps for w in windows + planner.finish()]


class Timer:
    """Decode time per window length, measured once per length (lengths are reused)."""

    def __init__(self, codec: BiCodecCodec) -> None:
        self.codec, self.cache = codec, {}
        self.glob = np.random.default_rng(0).integers(0, 4096, 32)

    def __call__(self, length: int) -> float:
        if length not in self.cache:
            sem = np.random.default_rng(length).integers(0, 8192, length)
            t = time.perf_counter()
            self.codec.decode([CodecInput(sem, 0, 0, self.glob)])
            self.cache[length] = time.perf_counter() - t
        return self.cache[length]

    def fitted(self, length: int) -> float:
        """Linear fit over the measured lengths, for lengths too long to run here."""
        xs = np.array(sorted(self.cache))
        ys = np.array([self.cache[x] for x in xs])
        slope, intercept = np.polyfit(xs, ys, 1)
        return float(slope * length + intercept)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", default="5,15,30,60")
    ap.add_argument("--measure-up-to", type=int, default=750, help="longest decode run for real")
    ap.add_argument("--check-seconds", type=int, default=5, help="run both schemes for real")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    setup()
    torch.set_num_threads(args.threads)
    codec = BiCodecCodec.random()
    codec.warmup()
    timer = Timer(codec)
    opts = WindowOptions(first=10, new=50, left=40, right=20)
    for length in [L for L in (24, 120, 240, 480) if L < args.measure_up_to] + [args.measure_up_to]:
        timer(length)
    rows = []
    for secs in (float(s) for s in args.seconds.split(",")):
        n = int(secs * TOKENS_PER_S)
        ref, ours = reference_schedule(n), our_schedule(n, opts)
        cost = lambda L: timer(L) if L <= args.measure_up_to else timer.fitted(L)  # noqa: E731
        ref_times, our_times = [cost(L) for L in ref], [cost(L) for L in ours]
        rows.append({"audio_s": secs, "ref_decoded_tokens": sum(ref), "our_decoded_tokens": sum(ours),
                     "work_ratio": sum(ref) / sum(ours),
                     "ref_wall_s": sum(ref_times), "our_wall_s": sum(our_times),
                     "ref_worst_chunk_ms": max(ref_times) * 1000,
                     "our_worst_chunk_ms": max(our_times) * 1000})
    # check the model by running both schemes for real
    n = args.check_seconds * TOKENS_PER_S
    sem = np.random.default_rng(1).integers(0, 8192, n)
    t = time.perf_counter()
    for L in reference_schedule(n):
        codec.decode([CodecInput(sem[:L], 0, 0, timer.glob)])
    ref_real = time.perf_counter() - t
    t = time.perf_counter()
    for L in our_schedule(n, opts):
        codec.decode([CodecInput(sem[:L], 0, 0, timer.glob)])
    our_real = time.perf_counter() - t
    report("bicodec_stream", rows, {"run_for_real": {"audio_s": args.check_seconds, "ref_wall_s": ref_real, "our_wall_s": our_real},
                                    "window": vars(opts),
                                    "measured_lengths_s": timer.cache})


if __name__ == "__main__":
    main()
