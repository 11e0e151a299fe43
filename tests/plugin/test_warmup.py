"""A cold ``veena.TTS(model=...)``: a stream issued at once waits for the engine to start
(bounded by ``VEENA_STARTUP_TIMEOUT_S``, not by the stream's timeout), and however many
timeouts and retries happen, the process ends up with exactly one engine."""

import asyncio
import os

import psutil
import pytest
from livekit.agents import APIConnectOptions, APITimeoutError
from livekit.plugins import veena

from livekit.plugins.veena.plugin import tts as veena_tts

pytestmark = pytest.mark.engine


def _engine_cores() -> int:
    n = 0
    for child in psutil.Process(os.getpid()).children(recursive=True):
        try:
            n += "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            pass
    return n


async def test_cold_start_waits_for_one_engine(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("VEENA_MAX_MODEL_LEN", "2048")
    monkeypatch.setenv("VEENA_MAX_NUM_SEQS", "4")
    before = _engine_cores()
    try:
        # prewarm() starts the engine in the background: the start is under way before any
        # stream exists, and prewarm() itself returned at once
        warm = veena.TTS(model=tiny_model_dir, max_tokens_per_chunk=35)
        assert warm.pipeline.engine._start_task is None
        warm.prewarm()
        await asyncio.sleep(0)
        assert warm.pipeline.engine._start_task is not None and not warm.pipeline.engine.started

        # past the start-up bound: a clear error; every retry waits on the same start
        monkeypatch.setenv("VEENA_STARTUP_TIMEOUT_S", "0.5")
        cold = veena.TTS(model=tiny_model_dir, max_tokens_per_chunk=35)
        assert cold.pipeline is warm.pipeline
        conn = APIConnectOptions(max_retry=3, timeout=0.2, retry_interval=0.05)
        with pytest.raises(APITimeoutError, match="still starting"):
            await cold.synthesize("Hello there.", conn_options=conn).collect()
        monkeypatch.delenv("VEENA_STARTUP_TIMEOUT_S")

        # the prewarmed TTS, a stream with a timeout far shorter than an engine start: it
        # waits for the start (bounded by VEENA_STARTUP_TIMEOUT_S), then speaks
        assert not warm.pipeline.engine.started
        stream = warm.stream(conn_options=APIConnectOptions(max_retry=0, timeout=5))
        stream.push_text("Warm and ready.")
        stream.end_input()
        assert sum([ev.frame.samples_per_channel async for ev in stream]) > 0
        await stream.aclose()

        # a TTS made later shares the started engine
        fresh = veena.TTS(model=tiny_model_dir, max_tokens_per_chunk=35)
        assert fresh.pipeline is warm.pipeline
        frame = await fresh.synthesize("Hello there.").collect()
        assert frame.samples_per_channel > 0
        assert _engine_cores() == before + 1
    finally:
        pipeline = veena_tts._PIPELINES.pop((tiny_model_dir, None), None)
        if pipeline is not None:
            await pipeline.aclose()
