"""Benchmark 7: the production path under load: ``veena-tts serve``'s app in this process on
the tiny random model, driven by the plugin's own remote mode (pooled WebSocket), 1, 2, 4, 8
and 16 concurrent streams. Per level: first audio p50/p95, real-time factor p95 and how many
streams the server refused (``overloaded``) under its default admission limits.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
from _common import model_dir, report, setup
from aiohttp import web
from livekit.agents import APIConnectOptions, APIStatusError
from livekit.plugins import veena

from livekit.plugins.veena.models.loading import load_pipeline
from livekit.plugins.veena.pipeline.engine_options import EngineOptions
from livekit.plugins.veena.server.app import ServerOptions, create_app

TEXT = "Load test sentence for the server."


async def one_stream(client: veena.TTS, seed: int) -> dict:
    stream = client.stream(conn_options=APIConnectOptions(max_retry=0))
    stream.push_text(TEXT)
    stream.end_input()
    started = time.perf_counter()
    first, samples = None, 0
    try:
        async for ev in stream:
            if first is None:
                first = time.perf_counter() - started
            samples += ev.frame.samples_per_channel
    except APIStatusError as e:
        if e.status_code == 503:
            return {"refused": True}
        raise
    finally:
        await stream.aclose()
    wall = time.perf_counter() - started
    audio = samples / client.sample_rate
    return {"refused": False, "first_audio_s": first, "rtf": wall / audio if audio else None}


async def level(url: str, n: int, tokens: int) -> dict:
    clients = [veena.TTS(base_url=url, max_tokens_per_chunk=tokens, seed=i) for i in range(n)]
    try:
        results = await asyncio.gather(*(one_stream(c, i) for i, c in enumerate(clients)))
    finally:
        for c in clients:
            await c.aclose()
    served = [r for r in results if not r["refused"]]
    firsts = [r["first_audio_s"] * 1000 for r in served if r["first_audio_s"] is not None]
    rtfs = [r["rtf"] for r in served if r["rtf"] is not None]
    pct = lambda v, q: float(np.percentile(v, q)) if v else None  # noqa: E731
    return {"streams": n, "served": len(served), "refused": n - len(served),
            "first_audio_p50_ms": pct(firsts, 50), "first_audio_p95_ms": pct(firsts, 95),
            "rtf_p95": pct(rtfs, 95)}


async def amain(args) -> None:
    with model_dir(args.model) as model:
        await run(args, model)


async def run(args, model: str) -> None:
    pipeline = load_pipeline(model, engine_options=EngineOptions.from_env(
        model, max_model_len=2048, max_num_seqs=args.max_num_seqs))
    await pipeline.start()
    options = ServerOptions()  # the defaults a user gets, limits derived from max_num_seqs
    runner = web.AppRunner(create_app(pipeline, options, own_pipeline=False))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"ws://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    try:
        rows = [await level(url, n, args.tokens) for n in args.streams]
    finally:
        await runner.cleanup()
        await pipeline.aclose()
    admission = options.admission(args.max_num_seqs)
    report("server_load", rows, {"model": args.model or "tiny random", "tokens_per_chunk": args.tokens,
                                 "max_num_seqs": args.max_num_seqs,
                                 "max_active_streams": admission.max_active,
                                 "max_queued_streams": admission.max_queued,
                                 "max_queue_wait_s": admission.max_queue_wait_s})


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1, 2, 4, 8, 16])
    ap.add_argument("--tokens", type=int, default=70, help="max tokens per text chunk")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    setup()
    asyncio.run(amain(ap.parse_args()))
