"""Benchmark 4: windows that follow the listener against the fixed ramp, on the product's
decode path.

Each stream is the product's own ``Pipeline.synthesize`` (request run, window planner,
decode scheduler, SNAC codec with random init, stitcher) fed by a paced token source at a
multiple of the real-time token rate (1.0 = 82 tokens/s, a frame every 85.3 ms; ``inf`` = all
tokens at once). Each row (a planner at a stream count and a rate) runs in its own process,
on a codec built and warmed up as ``load_pipeline`` and ``Pipeline.start`` do:
``ramp`` is the fixed 2, 2, 4, 8, 8... ramp with batches up to 16, ``adaptive`` the
listener-paced planner with the measured batch limit (the defaults). Reported per mode: first
audio, gaps the listener hears after first audio (it plays what it has and pauses when dry),
and decode work per kept step (``decoded_per_kept``: 1.0 is a one-pass decode). ``streaming``
and ``streaming_ramp`` decode SNAC incrementally (``VEENA_SNAC_STREAMING=1``).

``peer_orpheus`` runs the reference instead (one stream): orpheus-speech 0.1.0's own
``tokens_decoder`` (``orpheus_tts/decoder.py``, installed as published by the bootstrap),
which decodes the last 4 frames at every frame from the 4th on and keeps the second, on the
same random SNAC weights and the same paced frames, heard by the same listener.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import importlib.util
import math
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from _common import Listener, fresh_processes, listen, logger, report, setup
from _paced_engine import PacedEngine

from livekit.plugins.veena.codecs.snac import SNAC_24KHZ_CONFIG, SnacCodec
from livekit.plugins.veena.codecs.torch_threads import single_threaded_torch
from livekit.plugins.veena.models.families import DecodeShape, SnacFamily
from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.pipeline.engine_options import SamplingOptions
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions
from livekit.plugins.veena.pipeline.scheduler import SchedulerOptions
from livekit.plugins.veena.pipeline.windowing import WindowOptions

SPF, RATE = 2048, 24000
MODES = {
    "ramp": PipelineOptions(adaptive_windows=False, scheduler=SchedulerOptions(adaptive_batch=False)),
    "adaptive": PipelineOptions(),
    # the first window larger (VEENA_SNAC_WINDOW_FIRST): first audio later by the extra
    # frames, and every later window may be that large without a gap at exactly real time
    "adaptive_first4": PipelineOptions(decode={"snac": DecodeShape(
        WindowOptions(first=4, new=8, left=2, right=2), SnacFamily.decode_defaults.pacing)}),
    "adaptive_first8": PipelineOptions(decode={"snac": DecodeShape(
        WindowOptions(first=8, new=8, left=2, right=2), SnacFamily.decode_defaults.pacing)}),
    # VEENA_SNAC_STREAMING=1: each step decoded once (codecs/snac_streaming), adaptive sizes
    "streaming": PipelineOptions(snac_streaming=True),
    "streaming_ramp": PipelineOptions(snac_streaming=True, adaptive_windows=False,
                                      scheduler=SchedulerOptions(adaptive_batch=False)),
}

PEER = "peer_orpheus"


def peer_decoder(seed: int = 0):
    """orpheus-speech 0.1.0's ``decoder`` module as published, on the weights of
    ``SnacCodec.random(seed=seed)`` (the same init, the same seed) and the CPU: importing it
    loads its SNAC from the hub onto CUDA, so that one load answers with this model and the
    move to CUDA is skipped; nothing else of it changes. None where it is not installed."""
    spec = importlib.util.find_spec("orpheus_tts")  # the package's __init__ is not run
    if spec is None or not spec.submodule_search_locations:
        return None
    from snac import SNAC

    torch.manual_seed(seed)
    model = SNAC(**SNAC_24KHZ_CONFIG)
    model.to = lambda *_a, **_k: model  # its module-level `.to("cuda")`
    path = Path(spec.submodule_search_locations[0]) / "decoder.py"
    module = importlib.util.module_from_spec(
        importlib.util.spec_from_file_location("orpheus_tts_decoder", path))
    with mock.patch.object(SNAC, "from_pretrained", lambda *_a, **_k: model):
        module.__spec__.loader.exec_module(module)
    del model.to
    module.snac_device = "cpu"  # read by every decode
    module.convert_to_audio([1] * 28, 28)  # warmed up, as our codec is
    return module


async def run_peer(decoder, seconds: float, speed: float) -> dict:
    """One stream through the reference decoder: the frames ``PacedEngine`` makes for seed 0,
    at the same pace, as the token strings its ``tokens_decoder`` parses. Code 0 is sent as
    1: the reference reads an id of 0 as "no token" and would shift every later band."""
    period = 0.0 if math.isinf(speed) else SPF / RATE / speed
    frames = int(seconds * RATE / SPF)

    async def tokens():
        rng = np.random.default_rng(0)
        start = time.perf_counter()
        for k in range(frames):
            await asyncio.sleep(max(0.0, start + (k + 1) * period - time.perf_counter()))
            for p, c in enumerate(rng.integers(0, 4096, 7)):
                yield f"<custom_token_{max(1, int(c)) + 10 + p * 4096}>"

    ear, decodes = Listener(RATE), 0
    async for pcm in decoder.tokens_decoder(tokens()):
        decodes += 1
        ear.hear(len(pcm) // 2)  # int16 bytes: 2048 samples (one frame) per decode
    return {"mode": PEER, "streams": 1,
            "token_rate_x_realtime": None if math.isinf(speed) else speed,
            "first_audio_p50_ms": ear.first_s * 1000, "first_audio_p95_ms": ear.first_s * 1000,
            "gap_s_after_first_audio": ear.gap_s,
            "decoded_per_kept": 4 * decodes / max(1.0, ear.audio_s * RATE / SPF),
            "windows": decodes, "mean_batch": 1.0, "max_batch": 1}


async def run(codec, mode: str, streams: int, seconds: float, speed: float) -> dict:
    period = 0.0 if math.isinf(speed) else SPF / RATE / speed
    pipeline = Pipeline(PacedEngine(period), codec, VEENA, MODES[mode])
    await pipeline.start()  # started once, as a server's is: first audio is the request's
    frames = int(seconds * RATE / SPF)
    sampling = SamplingOptions(max_tokens=frames * 7)
    results = await asyncio.gather(*(
        listen(pipeline.synthesize("x" * (frames + 8), sampling=sampling, seed=i), RATE)
        for i in range(streams)))
    await pipeline.aclose()
    stats = pipeline.scheduler.stats
    fa = np.array([r[0] for r in results]) * 1000
    sizes = stats.batch_sizes
    return {"mode": mode, "streams": streams,
            "token_rate_x_realtime": None if math.isinf(speed) else speed,  # None: all at once
            "first_audio_p50_ms": float(np.percentile(fa, 50)),
            "first_audio_p95_ms": float(np.percentile(fa, 95)),
            "gap_s_after_first_audio": float(np.mean([r[1] for r in results])),
            "decoded_per_kept": stats.decoded_steps / (frames * streams),
            "windows": stats.windows,
            "mean_batch": stats.windows / max(1, stats.batches),
            "max_batch": max(sizes) if sizes else 0}


def _row(mode: str, streams: int, seconds: float, speed: float, threads: int,
         device: str) -> dict | None:
    """One row, in its own process: the product's codec built as ``load_pipeline``
    builds it (warmed up by the pipeline, on its decode thread), or the reference."""
    setup()
    torch.set_num_threads(threads)
    if mode == PEER:
        peer = peer_decoder()
        return None if peer is None else asyncio.run(run_peer(peer, seconds, speed))
    with single_threaded_torch(device):
        codec = SnacCodec.random(device=device, streaming=MODES[mode].snac_streaming)
    return asyncio.run(run(codec, mode, streams, seconds, speed))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", default="1,4")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--speeds", default="0.9,1.0,1.2,2.0,inf",
                    help="token rates as multiples of real time; inf: all tokens at once")
    ap.add_argument("--modes", default="ramp,adaptive",
                    help="planners to run, of: " + ", ".join([*MODES, PEER]) + f" ({PEER}: "
                         "the reference decoder, one stream; skipped where not installed)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    setup()
    plan = [(mode, int(n), float(speed)) for n in args.streams.split(",")
            for speed in args.speeds.split(",") for mode in args.modes.split(",")
            if mode != PEER or int(n) == 1]
    # each row in a fresh process: the reference decodes on its event loop's thread, and
    # a torch thread team left there by one row would slow every later row's decodes
    # (codecs/torch_threads)
    rows = []
    for mode, n, speed in plan:
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=fresh_processes()) as pool:
            row = pool.submit(_row, mode, n, args.seconds, speed, args.threads,
                              args.device).result()
        if row is None:
            logger.warning("%s skipped: orpheus-speech is not installed (scripts/bootstrap.sh "
                           "installs it)", PEER)
        else:
            rows.append(row)
    report("scheduler", rows, {"seconds_per_stream": args.seconds, "device": args.device,
                               "threads": args.threads})


if __name__ == "__main__":
    main()
