"""Benchmark 1: the classic Orpheus sliding window vs our windowed and streamed decodes,
same SNAC codes.

Classic: every new frame decodes the last 4 frames (28 tokens, stride 7) and keeps samples
2048:4096. Ours windowed: N new frames with L/R context (defaults N=8, L=R=2). Ours streamed
(``codecs/snac_streaming``): frames fed one at a time (as they arrive at exactly real time)
or 8 at a time, each decoded once. All against a one-pass decode of the same codes
(random-init SNAC 24 kHz, keyed noise).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from _common import report, setup

from livekit.plugins.veena.codecs.base import CodecInput, StreamPart
from livekit.plugins.veena.codecs.snac import SnacCodec
from livekit.plugins.veena.pipeline.stitching import Stitcher
from livekit.plugins.veena.pipeline.windowing import WindowOptions, WindowPlanner

SPF = 2048


def classic(codec, frames, seed):
    out, decoded = [], 0
    for k in range(3, len(frames)):
        (a,) = codec.decode([CodecInput(frames[k - 3:k + 1], k - 3, seed)])
        decoded += len(a)
        out.append(a[SPF:2 * SPF])
    return np.concatenate(out), decoded, (1 * SPF, (len(frames) - 2) * SPF)


def ours(codec, frames, seed, opts):
    planner, stitcher = WindowPlanner(opts), Stitcher(SPF, 240)
    windows = []
    for _ in range(len(frames)):
        windows += planner.add(1)
    windows += planner.finish()
    out, decoded = [], 0
    for w in windows:
        (a,) = codec.decode([CodecInput(frames[w.start:w.end], w.start, seed)])
        decoded += len(a)
        out.append(stitcher.push(w, a))
    return np.concatenate(out), decoded, (0, len(frames) * SPF)


def streamed(codec, frames, seed, per_call):
    """Feed ``per_call`` frames per call, each window's codes from its first kept frame and
    the decoder's reach as right context, as a request run does."""
    stream, out, decoded, fed, kept = codec.new_stream(seed), [], 0, 0, 0
    for start in range(0, len(frames), per_call):
        end = min(start + per_call, len(frames))
        last = end == len(frames)
        keep_end = end if last else max(kept, end - codec.lookahead_steps)
        part = StreamPart(stream, fed - kept, keep_end, last, last)
        (a,) = codec.decode([CodecInput(frames[kept:end], kept, seed, stream=part)])
        decoded += (end - fed) * SPF
        out.append(a)
        fed, kept = end, keep_end
    return np.concatenate(out), decoded, (0, len(frames) * SPF)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=120)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    setup()
    torch.set_num_threads(args.threads)
    codec = SnacCodec.random()
    streaming = SnacCodec.random(streaming=True)  # the same seed: the same weights
    frames = np.random.default_rng(0).integers(0, 4096, (args.frames, 7))
    t = time.perf_counter()
    (one,) = codec.decode([CodecInput(frames, 0, 1)])
    one_s = time.perf_counter() - t
    rows = []
    for name, fn in (("classic 28/7 keep 2048:4096", lambda: classic(codec, frames, 1)),
                     ("ours N=8 L=2 R=2", lambda: ours(codec, frames, 1, WindowOptions())),
                     ("ours streamed, 1 frame per call",
                      lambda: streamed(streaming, frames, 1, 1)),
                     ("ours streamed, 8 frames per call",
                      lambda: streamed(streaming, frames, 1, 8))):
        t = time.perf_counter()
        audio, decoded, (lo, hi) = fn()
        wall = time.perf_counter() - t
        ref = one[lo:hi]
        err = audio - ref
        rows.append({"scheme": name, "decoded_per_kept": decoded / len(audio),
                     "wall_s": wall, "wall_vs_one_pass": wall / one_s,
                     "rtf": wall / (len(audio) / 24000),
                     "max_err": float(np.abs(err).max()),
                     "rel_rms_err": float(np.sqrt(np.mean(err**2)) / np.sqrt(np.mean(ref**2)))})
    rows.append({"scheme": "one pass (reference)", "decoded_per_kept": 1.0, "wall_s": one_s,
                 "wall_vs_one_pass": 1.0, "rtf": one_s / (len(one) / 24000), "max_err": 0.0,
                 "rel_rms_err": 0.0})
    for row in rows:  # wall time of the classic window over this scheme's
        row["speedup_vs_classic"] = rows[0]["wall_s"] / row["wall_s"]
    report("snac_decode", rows, {"frames": args.frames, "threads": args.threads})


if __name__ == "__main__":
    main()
