"""What the guards (``pipeline/guards.py``) cost: CPU per second of audio.

Two measurements, both as CPU time of this process (``time.process_time``), so a busy
machine slows them without changing what they say much:
- each guard alone, fed what one stream makes in a second (SNAC: 11.7 frames; BiCodec: 50
  semantic tokens; 24 000 decoded samples in windows of 8 frames);
- the product's own pipeline with 64 streams at once on a fake engine (random SNAC frames
  as fast as the event loop takes them) and a codec that costs nothing, guards on and off,
  alternated: what the guards add to the per-stream work around the model and the codec.

    python bench/guards.py [--streams 64] [--seconds 10] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
from _common import report, setup
from _paced_engine import PacedEngine

from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.pipeline.engine import SamplingOptions
from livekit.plugins.veena.pipeline.guards import GuardOptions, RunGuards
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions

OFF = GuardOptions(empty_tokens=0, loop_repeats=0, runaway_s_per_char=0, silence_s=0)
TEXT = "Your order of three blue notebooks ships on Monday, and arrives by Thursday."


class _FreeCodec:
    """SNAC's shape, decoding each frame to one fixed quiet tone (never silent)."""

    name, sample_rate, samples_per_step = "free", 24000, 2048
    _tone = (0.1 * np.sin(np.arange(2048) * 2 * np.pi * 375 / 24000)).astype(np.float32)

    def decode(self, batch):
        return [np.tile(self._tone, b.codes.shape[0]) for b in batch]

    def warmup(self) -> None:
        pass


def _cpu_per_audio_s(work, audio_s: float) -> float:
    t = time.process_time()
    work()
    return (time.process_time() - t) / audio_s * 1000


def each_guard(seconds: float) -> list[dict]:
    """One stream's worth of input per guard, ms of CPU per second of audio."""
    rows = []
    rng = np.random.default_rng(0)
    for name, rate, steps in (
        ("loop+runaway (SNAC frames)", 24000 / 2048,
         list(rng.integers(0, 4096, (int(seconds * 24000 / 2048), 7)))),
        ("loop+runaway (BiCodec tokens)", 50.0,
         rng.integers(0, 8192, int(seconds * 50)).tolist()),
    ):
        guards = RunGuards(GuardOptions(), rate, 24000, 1.5 + 0.1 * len(TEXT) * 20)
        seen: list = []

        def feed(steps=steps, guards=guards, seen=seen) -> None:
            for s in steps:
                seen.append(s)
                assert guards.steps(seen, 1) is None
        rows.append({"guard": name, "cpu_ms_per_audio_s": _cpu_per_audio_s(feed, seconds)})
    audio = (0.3 * np.sin(np.arange(int(seconds * 24000)) * 0.05)).astype(np.float32)
    windows = np.array_split(audio, max(1, len(audio) // (8 * 2048)))
    guards = RunGuards(GuardOptions(), 24000 / 2048, 24000, None)

    def listen() -> None:
        for w in windows:
            assert guards.trim_silence(w)[1] == 0
    rows.append({"guard": "silence (decoded audio)",
                 "cpu_ms_per_audio_s": _cpu_per_audio_s(listen, seconds)})
    return rows


async def _streams(options: GuardOptions, streams: int, seconds: float) -> tuple[float, float]:
    """(CPU seconds, audio seconds) of ``streams`` syntheses at once."""
    p = Pipeline(PacedEngine(frame_period_s=0.0), _FreeCodec(), VEENA,
                 PipelineOptions(guards=options))
    await p.start()
    frames = int(seconds * 24000 / 2048)
    try:
        cpu = time.process_time()
        pcm = await asyncio.gather(*(
            p.synthesize(TEXT, sampling=SamplingOptions(max_tokens=7 * frames), seed=i).collect()
            for i in range(streams)))
        return time.process_time() - cpu, sum(len(x) for x in pcm) / 24000
    finally:
        await p.aclose()


def pipeline_rows(streams: int, seconds: float, rounds: int) -> list[dict]:
    cost = {"on": [], "off": []}
    for _ in range(rounds):  # alternated, so a change in the machine's load hits both
        for label, options in (("on", GuardOptions()), ("off", OFF)):
            cpu, audio = asyncio.run(_streams(options, streams, seconds))
            cost[label].append(cpu / audio * 1000)
    on, off = float(np.median(cost["on"])), float(np.median(cost["off"]))
    return [{"streams": streams, "guards": label, "cpu_ms_per_audio_s": value,
             "added_ms_per_audio_s": value - off if label == "on" else 0.0}
            for label, value in (("on", on), ("off", off))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    setup()
    report("guards_each", each_guard(max(args.seconds, 10.0) * 10),
           {"what": "CPU of each guard fed one stream's input, per second of audio"})
    report("guards_pipeline", pipeline_rows(args.streams, args.seconds, args.rounds),
           {"what": "the pipeline's CPU per second of audio, all guards on and off, "
                    "fake engine and free codec, median of the rounds"})


if __name__ == "__main__":
    main()
