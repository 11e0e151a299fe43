"""Benchmark: the control plane at scale (#21). ``veena-tts serve``'s app in this process over
the product's ``VllmEngine`` on a fake ``AsyncLLM`` with vLLM's delivery pattern (one step for
every request together, 82 steps/s (real time; ``--speed`` for faster), one token per
request per step, outputs merged when the consumer lags) and a GPU-like codec (a fixed sleep
per batch); a client process drives N real-time streams through the WebSocket protocol and
hears them as a listener does. Its sockets are open before the measured run, as the plugin's
connection pool holds a call's socket across its turns (``--connections per-stream``: each
stream connects and closes its own, handshake and close measured too).

Per run: the server process's CPU time per second of audio delivered (process CPU, not
wall; the fake engine's own share measured alone in the same run, with plain consumers),
event-loop lag p99, gap seconds per stream after first audio, first audio p50/p95. Cases:
``normal``; ``stall`` (the engine generates nothing for 1.5 s mid-stream); ``half_blocked``
(the server's event loop blocked 50 ms of every 100 ms for 2 s); each with adaptive windows
and with the fixed ramp. ``pipeline_alone``: the same N streams through ``Turn.speak`` in one
process with no server or WebSocket (what the app adds is the difference). ``--workers``
splits the server over K processes on one port, as ``veena-tts serve --workers K`` does
(each its own fake engine; CPU summed over them, loop lags pooled). ``--codec snac`` puts
the real SNAC decoder (random weights) in place of the GPU-like sleep, on CUDA where there is
one: the host CPU of its kernel launches is then counted in the server's CPU.

Every guard is on, as in production; a row counts the guards that fired in it
(``guards_fired``: none, where the fake's ``--frames`` fit the text's bound) and how busy the
whole machine was meanwhile (``machine_busy``: the share of all cores, others' work
included). ``--baseline DIR`` compares two trees alternately in one run: each of ``--pairs``
pairs runs the plan once on the package in ``DIR/plugin`` (e.g. ``git archive REV plugin |
tar -x -C DIR``) and once on this tree, each in a process of its own, and writes one table
of both (``control_plane{label}_pairs``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import multiprocessing as mp
import socket
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from _baseline import compare_trees, without
from _common import RESULTS, Listener, fresh_processes, report, setup
from _fake_async_llm import FakeAsyncLLM, fake_vllm_engine
from aiohttp import web

from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.pipeline.guards import guard_counts
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions
from livekit.plugins.veena.pipeline.scheduler import SchedulerOptions
from livekit.plugins.veena.pipeline.turn import Turn, TurnOptions
from livekit.plugins.veena.server.app import ServerOptions, create_app

STEP_S = 2048 / 24000
STEPS_PER_S = 82.0
"""The fake engine's steps per second at real time (one token per step, 7 per frame)."""
SENTENCES = ("Hello there and welcome to the help line of our shop.",
             "And this is a second sentence, spoken right after the first one.")
"""A stream's text: its first ``--chunks`` sentences, each one text chunk (the server's
chunker splits them so). A second chunk starts while the first generates, so it takes its
tokens from the engine once per frame (``queued_output_steps``). Each is long enough that
the fake's 60 frames (5.1 s) lie within its runaway bound (1.5 s + 0.1 s a character: 6.8
and 7.9 s): a stream of "Hello there." was cut by the guard at 2.8 s, and its fixed cost
then spread over half the audio."""
CHUNKS = 1
POOLED = True
"""``--connections pooled``: each listener's socket is open before the measured run and
closes after it, as the plugin's pool holds a call's socket across its turns."""
QUEUED_OUTPUT_STEPS = PipelineOptions.queued_output_steps
"""``--chunks`` and ``--queued-output-steps`` (this process and its pipelines)."""
NO_GAP_S = 0.05
"""A stream 'holds' when it hears at most this much gap after first audio."""
DISTURB_AT_S = 2.5
"""Seconds after the first stream starts (every stream has first audio by then)."""


class GpuLikeCodec:
    """SNAC's shape; every batch costs ``call_s`` of sleep whatever its size (a GPU call).
    Its audio is speech-like in its bytes (a tone under noise, not silence), so that what
    the server does with the bytes (e.g. deflate) costs what it costs on real speech."""

    name, sample_rate, samples_per_step = "gpu-like", 24000, 2048

    def __init__(self, call_s: float = 0.003) -> None:
        self.call_s = call_s
        t = np.arange(10 * 24000) / 24000
        rng = np.random.default_rng(0)
        self._audio = (0.3 * np.sin(2 * np.pi * 180 * t)
                       + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
        self._at = 0

    def decode(self, batch):
        time.sleep(self.call_s)
        out = []
        for b in batch:
            n = b.codes.shape[0] * 2048
            self._at = (self._at + n) % (self._audio.size - n)
            out.append(self._audio[self._at:self._at + n].copy())
        return out

    def warmup(self) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class CodecSpec:
    """Which codec the server decodes with: ``gpu-like`` (the sleep above), ``snac`` (the
    product's ``SnacCodec``, random weights, windowed, CUDA graphs or not) or
    ``snac-streamed`` (the same, decoded incrementally), and the scheduler's batch."""

    name: str = "gpu-like"
    cuda_graphs: bool = True
    max_batch: int = SchedulerOptions.max_batch


@functools.cache
def make_codec(spec: CodecSpec):
    """One codec per process, shared by every run in it, so that CUDA graphs are captured
    once, by the first pipeline to start (before the warm-up run)."""
    if spec.name == "gpu-like":
        return GpuLikeCodec()
    import torch

    from livekit.plugins.veena.codecs.snac import SnacCodec

    device = "cuda" if torch.cuda.is_available() else "cpu"
    # its graphs are captured when a pipeline starts (``Pipeline.window_steps``)
    return SnacCodec.random(seed=1, device=device, cuda_graphs=spec.cuda_graphs,
                            streaming=spec.name == "snac-streamed")


def graph_counts(spec: CodecSpec) -> dict:
    """The codec's CUDA graph captures, replays and eager calls so far (none: graphs off)."""
    graphs = getattr(make_codec(spec), "graphs", None)
    return dataclasses.asdict(graphs.stats) if graphs is not None else {}


# -- the client process ---------------------------------------------------------------------

async def _stream(session, url: str, index: int, delay: float, compress: int,
                  text: str, ws=None) -> dict:
    """One turn: on ``ws`` (a pooled socket, left open) or on a socket of its own."""
    import aiohttp

    from livekit.plugins.veena.protocol import decode_audio

    await asyncio.sleep(delay)
    own = ws is None
    if own:
        ws = await session.ws_connect(url, compress=compress)
    ear = Listener(24000)
    await ws.send_json({"type": "speak", "context_id": f"c{index}", "continue": False,
                        "text": text, "seed": index})
    end = "none"
    async for msg in ws:
        if msg.type == aiohttp.WSMsgType.BINARY:
            ear.hear(len(decode_audio(msg.data)[1]) // 2)
        elif msg.type == aiohttp.WSMsgType.TEXT:
            end = json.loads(msg.data)["type"]
            if end in ("done", "error", "cancelled"):
                break
        else:
            break
    if own:
        await ws.close()
    return {"first_s": ear.first_s, "gap_s": ear.gap_s, "audio_s": ear.audio_s, "end": end}


async def _client(url: str, n: int, stagger_s: float, compress: int, text: str,
                  pooled: bool, pipe) -> None:
    """Sends "start", then the streams' results. ``pooled``: every listener's socket is
    open before the start and closes after the results (as the plugin's connection pool
    holds a call's socket across its turns); else each stream connects and closes its own."""
    import aiohttp

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        sockets = (await asyncio.gather(*(session.ws_connect(url, compress=compress)
                                          for _ in range(n))) if pooled else [None] * n)
        lags: list[float] = []
        monitor = asyncio.create_task(_lag_monitor(lags))
        pipe.send("start")
        streams = await asyncio.gather(*(_stream(session, url, i, stagger_s * i / n, compress,
                                                 text, sockets[i]) for i in range(n)))
        monitor.cancel()
        pipe.send({"streams": streams, "lag_max_ms": max(lags, default=0.0) * 1000})
        for ws in sockets:
            if ws is not None:
                await ws.close()


def client_main(url: str, n: int, stagger_s: float, compress: int, pipe,
                text: str = SENTENCES[0], pooled: bool = True) -> None:
    """The listeners: a gap they hear must be the server's, so this process's own pauses
    are kept out (everything imported and frozen first, no full collection while streaming)
    and its largest event-loop lag is reported beside the gaps."""
    import gc

    import aiohttp  # noqa: F401 (imported before the start signal, not while streams run)

    from livekit.plugins.veena.protocol import decode_audio  # noqa: F401

    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 1 << 30)
    asyncio.run(_client(url, n, stagger_s, compress, text, pooled, pipe))


# -- the server process ---------------------------------------------------------------------

async def _lag_monitor(lags: list[float], every_s: float = 0.005) -> None:
    while True:
        t = time.perf_counter()
        await asyncio.sleep(every_s)
        lags.append(time.perf_counter() - t - every_s)


async def _disturb(case: str, llm: FakeAsyncLLM) -> None:
    await asyncio.sleep(DISTURB_AT_S)
    if case == "stall":
        llm.stall(1.5)
    elif case == "half_blocked":
        for _ in range(20):
            time.sleep(0.05)  # the loop is blocked half of each 100 ms, for 2 s
            await asyncio.sleep(0.05)


def _busy_jiffies() -> tuple[int, int] | None:
    """(busy, all) CPU time of the whole machine so far (Linux /proc/stat), every process."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # less idle and iowait


def _busy_share(before, after) -> float | None:
    """The share of all cores busy between two ``_busy_jiffies`` readings."""
    if before is None or after is None or after[1] == before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def _pct(values, q):
    return float(np.percentile(values, q)) if len(values) else None


async def engine_alone(n: int, frames: int, stagger_s: float, speed: float = 1.0) -> float:
    """CPU ms per audio second of the fake AsyncLLM alone (plain ``async for`` consumers)."""
    llm = FakeAsyncLLM(frames, STEPS_PER_S * speed)

    async def consume(i: int) -> None:
        await asyncio.sleep(stagger_s * i / n)
        async for _ in llm.generate(None, None, f"alone-{i}"):
            pass

    cpu = time.process_time()
    await asyncio.gather(*(consume(i) for i in range(n)))
    return (time.process_time() - cpu) * 1000 / (n * frames * STEP_S)


async def _pipeline(n: int, mode: str, frames: int, codec: CodecSpec,
                    speed: float = 1.0) -> tuple[FakeAsyncLLM, Pipeline]:
    """A started pipeline over a fake engine for ``n`` streams of ``frames`` frames each,
    generating at ``speed`` times real time."""
    llm = FakeAsyncLLM(frames, STEPS_PER_S * speed)
    pipeline = Pipeline(fake_vllm_engine(llm, max_num_seqs=2 * n), make_codec(codec), VEENA,
                        PipelineOptions(adaptive_windows=mode == "adaptive",
                                        queued_output_steps=QUEUED_OUTPUT_STEPS,
                                        scheduler=SchedulerOptions(max_batch=codec.max_batch)))
    await pipeline.start()
    return llm, pipeline


async def _listen(pipeline: Pipeline, n: int, port: int = 0,
                  reuse_port: bool = False) -> tuple[web.AppRunner, str]:
    """The server app over ``pipeline``, admitting all ``n`` streams, listening; its
    WebSocket URL."""
    runner = web.AppRunner(create_app(pipeline, ServerOptions(
        max_active_streams=n, max_queued_streams=n), own_pipeline=False), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, reuse_port=reuse_port or None)
    await site.start()
    return runner, f"ws://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1/stream"


COUNT_CALLBACKS = False
"""``--count-callbacks``: count every callback the event loop runs while measuring (it
slows each one a little, so the CPU figures of such a run read slightly high)."""


@contextlib.contextmanager
def _callback_counter():
    """How many callbacks (task steps and wakes, timers, I/O, ``call_soon``) asyncio's
    event loop ran in the block: ``[count]``, or ``[None]`` off or under another loop."""
    counted = [None]
    if not COUNT_CALLBACKS or not isinstance(asyncio.get_running_loop(),
                                             asyncio.BaseEventLoop):
        yield counted
        return
    counted[0] = 0
    run = asyncio.events.Handle._run

    def counting(handle):
        counted[0] += 1
        return run(handle)

    asyncio.events.Handle._run = counting
    try:
        yield counted
    finally:
        asyncio.events.Handle._run = run


@contextlib.asynccontextmanager
async def _measured(case: str, llm: FakeAsyncLLM, codec: CodecSpec, pipeline: Pipeline):
    """This process's CPU time, event-loop lags and codec graph calls over the block, with
    ``case``'s disturbance running meanwhile: a dict, filled with ``cpu``, ``callbacks``
    (None unless counted), ``deltas`` and ``requests`` (the engine's), ``windows`` and
    ``batches`` (decoded) and ``graphs`` (``graph_captures``, ...) once the block ends."""
    out: dict = {"lags": []}
    graphs = graph_counts(codec)
    fired, busy = sum(guard_counts().values()), _busy_jiffies()
    deltas, requests = llm.deltas, llm.requests_started
    stats = pipeline.scheduler.stats
    windows, batches = stats.windows, stats.batches
    cpu = time.process_time()
    monitor = asyncio.create_task(_lag_monitor(out["lags"]))
    disturb = asyncio.create_task(_disturb(case, llm))
    try:
        with _callback_counter() as callbacks:
            yield out
    finally:
        out["cpu"] = time.process_time() - cpu
        out["callbacks"] = callbacks[0]
        out["deltas"] = llm.deltas - deltas
        out["requests"] = llm.requests_started - requests
        out["windows"] = stats.windows - windows
        out["batches"] = stats.batches - batches
        out["guards_fired"] = sum(guard_counts().values()) - fired
        out["machine_busy"] = _busy_share(busy, _busy_jiffies())
        monitor.cancel()
        disturb.cancel()
        out["graphs"] = {f"graph_{k}": v - graphs[k] for k, v in graph_counts(codec).items()}


async def run(n: int, mode: str, case: str, frames: int, stagger_s: float,
              compress: int = 0, codec: CodecSpec = CodecSpec(), speed: float = 1.0) -> dict:
    """``compress``: the permessage-deflate window the clients offer (0: none)."""
    llm, pipeline = await _pipeline(n, mode, frames, codec, speed)
    runner, url = await _listen(pipeline, n)
    loop = asyncio.get_running_loop()
    ours, theirs = mp.Pipe()
    client = fresh_processes().Process(target=client_main,
                                       args=(url, n, stagger_s, compress, theirs,
                                             " ".join(SENTENCES[:CHUNKS]), POOLED),
                                       daemon=True)
    client.start()
    try:
        assert await loop.run_in_executor(None, ours.recv) == "start"
        async with _measured(case, llm, codec, pipeline) as measured:
            client_out = await loop.run_in_executor(None, ours.recv)
    finally:
        # joined off the loop: the client's sockets close after its results, and this loop
        # must answer their close handshakes (a blocking join held each for its 10 s timeout)
        await loop.run_in_executor(None, client.join, 30)
        await runner.cleanup()
        await pipeline.aclose()
    row = _row(case, mode, n, client_out["streams"], measured["cpu"], measured["lags"],
               llm.step_cpu_s)
    row["deltas_per_stream"] = measured["deltas"] / n
    row["requests_per_stream"] = measured["requests"] / n
    row["windows_per_stream"] = measured["windows"] / n
    row["batches_per_stream"] = measured["batches"] / n
    row["loop_callbacks_per_stream"] = _per_stream(measured["callbacks"], n)
    row["client_lag_max_ms"] = client_out["lag_max_ms"]
    row["guards_fired"] = measured["guards_fired"]
    row["machine_busy"] = measured["machine_busy"]
    row.update(measured["graphs"])
    return row


def server_main(n: int, mode: str, case: str, frames: int, port: int, conn,
                codec: CodecSpec = CodecSpec(), speed: float = 1.0) -> None:
    """One of ``--workers`` server processes (as ``veena-tts serve --workers``: its own
    engine, listening on the shared port with SO_REUSEPORT): reports its own CPU time,
    loop lags and fake-engine steps between the parent's "start" and "stop"."""
    setup()
    asyncio.run(_serve(n, mode, case, frames, port, conn, codec, speed))


async def _serve(n: int, mode: str, case: str, frames: int, port: int, conn,
                 codec: CodecSpec, speed: float) -> None:
    llm, pipeline = await _pipeline(n, mode, frames, codec, speed)
    await _warm_up(pipeline, n)
    runner, _ = await _listen(pipeline, n, port, reuse_port=True)
    loop = asyncio.get_running_loop()
    try:
        conn.send("listening")
        assert await loop.run_in_executor(None, conn.recv) == "start"
        async with _measured(case, llm, codec, pipeline) as measured:
            assert await loop.run_in_executor(None, conn.recv) == "stop"
        conn.send({"cpu": measured["cpu"], "lags": measured["lags"], "deltas": measured["deltas"],
                   "windows": measured["windows"], "batches": measured["batches"],
                   "requests": measured["requests"], "guards_fired": measured["guards_fired"],
                   "machine_busy": measured["machine_busy"],
                   "step_cpu": llm.step_cpu_s, "graphs": measured["graphs"]})
    finally:
        await runner.cleanup()
        await pipeline.aclose()


async def _warm_up(pipeline: Pipeline, n: int) -> None:
    """One stream through a private app on this process's own port, so the measured run
    pays no first-use imports (the in-process runs get the same from their warm-up run)."""
    import aiohttp

    runner, url = await _listen(pipeline, n)
    try:
        async with aiohttp.ClientSession() as session:
            await _stream(session, url, 0, 0.0, 0, SENTENCES[0])
    finally:
        await runner.cleanup()


def run_workers(n: int, mode: str, case: str, frames: int, stagger_s: float, workers: int,
                compress: int = 0, codec: CodecSpec = CodecSpec(), speed: float = 1.0) -> dict:
    """``run`` with the server split over ``workers`` processes on one port; their CPU is
    summed and their loop lags pooled."""
    ctx = fresh_processes()
    guard = socket.socket()  # fixes the port for every worker (never listens)
    guard.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    guard.bind(("127.0.0.1", 0))
    port = guard.getsockname()[1]
    servers = []
    for _ in range(workers):
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(target=server_main, daemon=True,
                           args=(n, mode, case, frames, port, theirs, codec, speed))
        proc.start()
        servers.append((proc, ours))
    try:
        for _, conn in servers:
            assert conn.recv() == "listening"
        ours, theirs = ctx.Pipe()
        client = ctx.Process(target=client_main, daemon=True, args=(
            f"ws://127.0.0.1:{port}/v1/stream", n, stagger_s, compress, theirs,
            SENTENCES[0], POOLED))
        client.start()
        assert ours.recv() == "start"
        for _, conn in servers:
            conn.send("start")
        client_out = ours.recv()
        for _, conn in servers:
            conn.send("stop")
        outs = [conn.recv() for _, conn in servers]
        client.join(30)
    finally:
        for proc, _ in servers:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        guard.close()
    row = _row(case, mode, n, client_out["streams"], sum(o["cpu"] for o in outs),
               [lag for o in outs for lag in o["lags"]], sum(o["step_cpu"] for o in outs))
    row["client_lag_max_ms"] = client_out["lag_max_ms"]
    row["deltas_per_stream"] = sum(o["deltas"] for o in outs) / n
    row["requests_per_stream"] = sum(o["requests"] for o in outs) / n
    row["windows_per_stream"] = sum(o["windows"] for o in outs) / n
    row["batches_per_stream"] = sum(o["batches"] for o in outs) / n
    row["loop_callbacks_per_stream"] = None  # not counted in spawned server processes
    row["guards_fired"] = sum(o["guards_fired"] for o in outs)
    row["machine_busy"] = outs[0]["machine_busy"]
    for key in outs[0]["graphs"]:
        row[key] = sum(o["graphs"][key] for o in outs)
    return row


async def run_pipeline_alone(n: int, mode: str, frames: int, stagger_s: float,
                             codec: CodecSpec = CodecSpec(), speed: float = 1.0) -> dict:
    """N turns straight through the pipeline, heard where ``push`` delivers."""
    llm, pipeline = await _pipeline(n, mode, frames, codec, speed)
    sampling = pipeline.sampling.defaults()

    async def one(i: int) -> dict:
        await asyncio.sleep(stagger_s * i / n)
        ear = Listener(24000)

        async def text():
            for sentence in SENTENCES[:CHUNKS]:
                yield sentence

        await Turn(pipeline, TurnOptions(voice=VEENA.default_voice, sampling=sampling,
                                         seed=i)).speak(text(), lambda pcm: ear.hear(len(pcm)))
        return {"first_s": ear.first_s, "gap_s": ear.gap_s, "audio_s": ear.audio_s,
                "end": "done"}

    try:
        async with _measured("pipeline_alone", llm, codec, pipeline) as measured:
            results = await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await pipeline.aclose()
    row = _row("pipeline_alone", mode, n, results, measured["cpu"], measured["lags"],
               llm.step_cpu_s)
    row["deltas_per_stream"] = measured["deltas"] / n
    row["requests_per_stream"] = measured["requests"] / n
    row["windows_per_stream"] = measured["windows"] / n
    row["batches_per_stream"] = measured["batches"] / n
    row["loop_callbacks_per_stream"] = _per_stream(measured["callbacks"], n)
    row["client_lag_max_ms"] = None  # the listeners are in this process
    row["guards_fired"] = measured["guards_fired"]
    row["machine_busy"] = measured["machine_busy"]
    row.update(measured["graphs"])
    return row


def _per_stream(count: int | None, n: int) -> float | None:
    return None if count is None else count / n


def _row(case: str, mode: str, n: int, results: list[dict], cpu: float,
         lags: list[float], engine_cpu: float) -> dict:
    """``engine_cpu``: the fake engine's step time inside this run (its consumers busy, so
    their collectors merge and wake differently than in the engine-alone run)."""
    done = [r for r in results if r["end"] == "done"]
    audio = sum(r["audio_s"] for r in results)
    gaps = [r["gap_s"] for r in done]
    firsts = [r["first_s"] * 1000 for r in done if r["first_s"] is not None]
    return {"case": case, "mode": mode, "streams": n, "done": len(done),
            "audio_s_per_stream": audio / n,
            "server_cpu_ms_per_audio_s": cpu * 1000 / audio if audio else None,
            "engine_in_run_ms_per_audio_s": engine_cpu * 1000 / audio if audio else None,
            "ours_in_run_ms_per_audio_s": (cpu - engine_cpu) * 1000 / audio if audio else None,
            "loop_lag_p99_ms": _pct(lags, 99) * 1000 if lags else None,
            "loop_lag_max_ms": max(lags) * 1000 if lags else None,
            "gap_s_mean": float(np.mean(gaps)) if gaps else None,
            "gap_s_max": max(gaps) if gaps else None,
            "first_audio_p50_ms": _pct(firsts, 50), "first_audio_p95_ms": _pct(firsts, 95),
            "held": len(done) == n and max(gaps, default=0.0) <= NO_GAP_S}


def _markdown(rows: list[dict], notes: dict) -> str:
    cols = ["case", "mode", "streams", "workers", "server_cpu_ms_per_audio_s", "engine_alone_ms_per_audio_s",
            "ours_ms_per_audio_s", "ours_in_run_ms_per_audio_s", "loop_lag_p99_ms",
            "loop_lag_max_ms", "client_lag_max_ms", "gap_s_mean", "gap_s_max",
            "first_audio_p50_ms", "first_audio_p95_ms", "requests_per_stream",
            "deltas_per_stream", "windows_per_stream", "batches_per_stream", "loop_callbacks_per_stream",
            "guards_fired", "machine_busy"]

    def fmt(v) -> str:
        return "" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    lines += ["", f"Largest N held (every stream at most {NO_GAP_S * 1000:.0f} ms of gap, "
              f"normal case): adaptive {notes['largest_held']['adaptive']}, "
              f"ramp {notes['largest_held']['ramp']}.", "", notes["setup"]]
    return "\n".join(lines) + "\n"


def _describe(spec: CodecSpec) -> tuple[str, str]:
    """A short label for the rows and a sentence for the setup note."""
    if spec.name == "gpu-like":
        return "gpu-like", "GPU-like, 3 ms per batch"
    codec = make_codec(spec)
    device = str(codec.device)
    if device.startswith("cuda"):
        import torch

        device = torch.cuda.get_device_name()
    graphs = "streamed" if codec.streams is not None else \
        "CUDA graphs" if codec.graphs is not None else "eager"
    return f"snac {graphs}", f"SNAC 24 kHz (random weights) on {device}, {graphs}"


async def amain(args) -> None:
    rows = []
    codec = CodecSpec(args.codec, args.cuda_graphs, args.max_batch)
    # warm-up: lazy imports (vLLM's types, ...), the real codec's first calls
    await run(2, "adaptive", "normal", 10, 0.0, codec=codec)
    sizes = set(args.streams) | {args.disturb_streams}
    sizes |= {n // w for n in sizes for w in args.workers if w and n // w}
    # the median of a few runs: one run of the fake engine alone varies by +-15 % here,
    # and "ours" is the server's CPU less this figure
    alone = {n: statistics.median([await engine_alone(n, args.frames, args.stagger_s,
                                                      args.speed)
                                   for _ in range(args.alone_runs)])
             for n in sorted(sizes)}
    plan = [("normal", n) for n in args.streams]
    plan += [(case, args.disturb_streams) for case in args.cases if case != "normal"]
    plan += [("pipeline_alone", n) for n in args.streams if args.pipeline_alone]
    compress = 15 if args.clients_offer_deflate else 0
    codec_label, codec_text = _describe(codec)
    for case, n in plan:
        for mode in args.modes:
            for workers in [None] if case == "pipeline_alone" else args.workers:
                if workers is None:
                    row = await run_pipeline_alone(n, mode, args.frames, args.stagger_s,
                                                   codec, args.speed)
                elif workers == 0:
                    row = await run(n, mode, case, args.frames, args.stagger_s, compress,
                                    codec, args.speed)
                else:
                    row = run_workers(n, mode, case, args.frames, args.stagger_s, workers,
                                      compress, codec, args.speed)
                row["workers"] = workers
                row["codec"] = codec_label
                # each worker's fake engine steps its share of the streams
                engine = alone[n // workers] if workers else alone[n]
                row["engine_alone_ms_per_audio_s"] = engine
                if row["server_cpu_ms_per_audio_s"] is not None:
                    row["ours_ms_per_audio_s"] = row["server_cpu_ms_per_audio_s"] - engine
                rows.append(row)
    largest = {m: max((r["streams"] for r in rows if r["case"] == "normal" and r["mode"] == m
                       and r["held"]), default=0) for m in ("adaptive", "ramp")}
    notes = {"frames_per_request": args.frames, "stagger_s": args.stagger_s,
             "codec": codec_label, "max_batch": args.max_batch,
             "steps_per_s": STEPS_PER_S * args.speed, "speed": args.speed,
             "text": " ".join(SENTENCES[:args.chunks]), "chunks": args.chunks,
             "queued_output_steps": args.queued_output_steps,
             "clients_offer_deflate": args.clients_offer_deflate,
             "connections": args.connections, "alone_runs": args.alone_runs,
             "largest_held": largest, "label": args.label,
             "setup": (f"Server app and fake engine in one process, client in another, on this "
                       f"{mp.cpu_count()}-core machine (N up to {max(args.streams)} here); "
                       f"each stream {args.frames} frames per engine request at "
                       f"{args.speed:g}x real time; codec: {codec_text}. CPU is the server "
                       f"process's (process_time); 'ours' = server minus the fake engine alone "
                       f"(median of {args.alone_runs} runs); "
                       f"'ours in run' = server minus the fake engine's own steps timed "
                       f"inside the same run.")}
    report(f"control_plane{args.label}", rows, notes)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"control_plane{args.label}.md").write_text(_markdown(rows, notes))


PAIR_COLUMNS = ("pair", "tree", "case", "mode", "streams", "server_cpu_ms_per_audio_s",
                "engine_alone_ms_per_audio_s", "ours_ms_per_audio_s",
                "ours_in_run_ms_per_audio_s", "audio_s_per_stream", "guards_fired",
                "machine_busy", "gap_s_max", "first_audio_p50_ms")
"""``--baseline``'s table."""


if __name__ == "__main__":
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=ints, default=[16, 64, 128])
    ap.add_argument("--disturb-streams", type=int, default=64)
    ap.add_argument("--cases", type=lambda s: s.split(","),
                    default=["normal", "stall", "half_blocked"])
    ap.add_argument("--modes", type=lambda s: s.split(","), default=["adaptive", "ramp"])
    ap.add_argument("--pipeline-alone", action=argparse.BooleanOptionalAction, default=True,
                    help="also run each N through the pipeline alone (no server)")
    ap.add_argument("--clients-offer-deflate", action="store_true",
                    help="clients offer permessage-deflate (as browsers and `websockets` do)")
    ap.add_argument("--frames", type=int, default=60, help="frames per engine request")
    ap.add_argument("--first-sentence", default=SENTENCES[0],
                    help="the streams' first sentence (a short one puts the fake's --frames "
                         "past its runaway bound: the guard then cuts every stream)")
    ap.add_argument("--chunks", type=int, choices=[1, 2], default=1,
                    help="text chunks (engine requests) per stream, one after the other")
    ap.add_argument("--queued-output-steps", type=int,
                    default=PipelineOptions.queued_output_steps,
                    help="PipelineOptions.queued_output_steps: a chunk behind a generating "
                         "one takes its tokens once per this many frames (0: every token)")
    ap.add_argument("--speed", type=float, default=1.0,
                    help="the fake engine generates at this many times real time (a GPU "
                         "with room to spare runs ahead of its listeners)")
    ap.add_argument("--stagger-s", type=float, default=1.0, help="streams start over this long")
    ap.add_argument("--workers", type=ints, default=[0],
                    help="server processes sharing the port, as `serve --workers` (0: the "
                         "server in this process; e.g. 1,2 compares one and two processes)")
    ap.add_argument("--connections", choices=["pooled", "per-stream"], default="pooled",
                    help="pooled: each listener's socket opens before the measured run and "
                         "stays open (the plugin's pool holds a call's socket across its "
                         "turns); per-stream: every stream connects and closes its own")
    ap.add_argument("--alone-runs", type=int, default=3,
                    help="runs of the fake engine alone per N (their median is subtracted)")
    ap.add_argument("--label", default="", help="suffix of the result files")
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="asyncio")
    ap.add_argument("--codec", choices=["gpu-like", "snac", "snac-streamed"],
                    default="gpu-like",
                    help="gpu-like: a 3 ms sleep per batch; snac: the real SNAC decoder "
                         "(random weights, windowed) on CUDA where present, else on CPU; "
                         "snac-streamed: the same decoded incrementally")
    ap.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                    help="snac on CUDA: replay the decoder from CUDA graphs")
    ap.add_argument("--max-batch", type=int, default=SchedulerOptions.max_batch,
                    help="windows per codec call at most (the scheduler's max_batch)")
    ap.add_argument("--count-callbacks", action="store_true",
                    help="also count the event loop's callbacks per stream (server in this "
                         "process and pipeline alone; asyncio's loop only)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a folder with the 'before' package in plugin/ (git archive REV "
                         "plugin | tar -x -C DIR): the plan runs alternately on it and on "
                         "this tree, --pairs times, and one table compares them")
    ap.add_argument("--pairs", type=int, default=3, help="--baseline: before/after pairs")
    setup()
    args = ap.parse_args()
    if args.baseline is not None:
        if args.pairs < 1:
            ap.error("--pairs must be at least 1")
        compare_trees(Path(__file__), "control_plane", args.baseline.resolve(), args.pairs,
                      args.label, without(sys.argv[1:], ("--baseline", "--pairs", "--label")),
                      PAIR_COLUMNS)
        sys.exit(0)
    COUNT_CALLBACKS = args.count_callbacks
    CHUNKS, QUEUED_OUTPUT_STEPS = args.chunks, args.queued_output_steps
    SENTENCES = (args.first_sentence, *SENTENCES[1:])
    POOLED = args.connections == "pooled"
    if args.alone_runs < 1:
        ap.error("--alone-runs must be at least 1")
    if any(args.workers) and (CHUNKS, QUEUED_OUTPUT_STEPS) != (
            1, PipelineOptions.queued_output_steps):
        ap.error("--chunks and --queued-output-steps apply to the server in this process only "
                 "(--workers 0)")
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(amain(args))
    else:
        asyncio.run(amain(args))
