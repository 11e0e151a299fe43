"""What the Perth output watermark (``watermark``) costs: CPU seconds per second of audio.

Perth's implicit watermark on 10 s of speech-like 24 kHz audio (the golden's generator,
seeded), as CPU time of this process (``time.process_time``) with one torch thread (the
watermark runs where a stream's audio is emitted, one core's worth): the whole clip at once,
then streamed (``WatermarkStream``, 0.2 s of context each side, blocks of at least 0.1 s) in
pushes of one NeuCodec step (20 ms), 0.1 s, 0.5 s (a typical window) and 2 s. ``cost_x`` is the
streamed work over the whole clip's (samples run through the watermarker per sample kept).

    python bench/watermark.py [--seconds 10] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from _common import report, setup

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "golden"))
from make_perth_golden import speech_like  # noqa: E402

from livekit.plugins.veena.watermark import PerthWatermarker, WatermarkStream  # noqa: E402
from livekit.plugins.veena.watermark.weights import installed_perth_weights  # noqa: E402

RATE = 24000


def _best_cpu(work, rounds: int) -> float:
    """The least CPU time of ``rounds`` runs (a busy machine only adds)."""
    best = float("inf")
    for _ in range(rounds):
        t = time.process_time()
        work()
        best = min(best, time.process_time() - t)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    setup()
    import torch

    torch.set_num_threads(1)
    weights = installed_perth_weights()
    if weights is None:
        raise SystemExit("resemble-perth is not installed (the [neutts] extra)")
    marker = PerthWatermarker(weights)
    clips = int(np.ceil(args.seconds / 1.2))
    audio = np.concatenate([speech_like(1.2, 0, seed) for seed in range(clips)])
    audio = audio[: int(args.seconds * RATE) // 240 * 240]
    seconds = len(audio) / RATE
    marker.apply(audio[:RATE], RATE)  # warm

    rows = [{"mode": "whole clip", "push_ms": None,
             "cpu_s_per_audio_s": _best_cpu(lambda: marker.apply(audio, RATE), args.rounds)
             / seconds, "cost_x": 1.0}]
    for push_ms in (20, 100, 500, 2000):
        n = RATE * push_ms // 1000
        work = {}

        def stream(n=n, work=work):
            s = WatermarkStream(marker, RATE)
            for i in range(0, len(audio), n):
                s.push(audio[i:i + n])
            s.finish()
            work["x"] = s.watermarked / len(audio)

        cpu = _best_cpu(stream, args.rounds)
        rows.append({"mode": "streamed", "push_ms": push_ms,
                     "cpu_s_per_audio_s": cpu / seconds, "cost_x": round(work["x"], 3)})
    report("watermark", rows, {"audio_s": seconds, "torch_threads": 1,
                               "context_s": 0.2, "min_block_s": 0.1})


if __name__ == "__main__":
    main()
