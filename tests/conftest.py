"""Session fixtures: one tiny random model, one vLLM engine and one SNAC codec per session."""

from __future__ import annotations

import contextlib
import logging
import os
import sys

# Before torch loads (libgomp reads it once): an OpenMP thread that finishes its share of an
# op sleeps instead of spinning for the next one. The suite runs two pytest processes on two
# cores, and the codec's second thread spun while the main thread ran Python between ops:
# beside a busy core, two BiCodec tests took 72 s of CPU and 61 s instead of 40 s and 39 s;
# alone, the same wall time. Inherited by every process started from here.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

from livekit.plugins.veena.codecs.snac import SnacCodec
from livekit.plugins.veena.models import profiles
from livekit.plugins.veena.models.loading import load_pipeline
from livekit.plugins.veena.models.tiny_model import make_tiny_model
from livekit.plugins.veena.pipeline import family
from livekit.plugins.veena.pipeline.guards import guard_counts
from livekit.plugins.veena.pipeline.options import PipelineOptions
from livekit.plugins.veena.server.app import ServerOptions

from .helpers import TINY_KV_CACHE_GIB, tiny_engine_options
from .servers import API_KEY, serve

logging.getLogger("vllm").setLevel(logging.WARNING)

os.environ.setdefault("VEENA_CPU_KVCACHE_GIB", str(TINY_KV_CACHE_GIB))
# On a GPU, a one-device engine runs its model inside vLLM's engine-core process (the "uni"
# executor). vLLM-CPU adds a worker process under the core unless V1 multiprocessing is off;
# off, the test engines (in this process, in launched servers and benchmarks alike) take the
# GPU's process layout and each start saves a process's imports (~12 s of CPU) and ~1 GB.
# AsyncLLM still runs its core in a process of its own.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# vLLM-CPU gives its engine core one OpenMP thread per core. On this 2-core machine the test
# process needs one of them: the core's second thread mostly spun (a tiny model's step is
# its sampler's sort over the vocabulary), ~40 % of the core's CPU per token with no gain in
# tokens per second for one stream. Processes started from here (engine cores, launched
# servers, benchmark scripts) take one thread; this process already loaded torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The text-normalisation grammars are read from the product's own cache (a user's
# ~/.cache/veena-tts/grammars): compiled once per machine (about 100 s), not per checkout.

SESSION_ENGINES = {"pipeline", "spark_pipeline", "maya1_pipeline", "server_url"}
"""The session fixtures that start a vLLM engine."""


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by these markers
def pytest_collection_modifyitems(config, items):
    """A test on a session engine is a ``session_engine`` and an ``engine`` test; one with an
    engine of its own runs in the ``second_lane`` of ``scripts/test.sh``; every ``engine``
    test is ``slow``: the fast lane (``-m "not slow"``, on xdist workers) skips both. (Not
    xdist groups: under pytest 9, pytest-xdist 3.8's ``--dist loadgroup`` spreads a group
    over every worker.)"""
    for item in items:
        if SESSION_ENGINES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.session_engine)
            item.add_marker(pytest.mark.engine)
        if item.get_closest_marker("engine") is not None:
            item.add_marker(pytest.mark.slow)
            if item.get_closest_marker("session_engine") is None:
                item.add_marker(pytest.mark.second_lane)


@pytest.fixture(autouse=True)
def _no_guard_fires(request):
    """A guard that fires in a test not written to make it fire (marker ``guards``) fails
    it: the guards never cut a normal stream, the tiny models' included."""
    before = guard_counts()
    yield
    if request.node.get_closest_marker("guards") is None:
        after = guard_counts()
        fired = {g: after[g] - before[g] for g in after if after[g] != before[g]}
        assert not fired, f"guards fired in this test: {fired}"


@pytest.fixture(autouse=True)
def _restore_registries():
    """What one test registers (families, profiles) or puts on ``sys.path`` ends with it."""
    saved = dict(family.FAMILIES), dict(profiles.PROFILES), list(sys.path)
    yield
    for registry, before in zip((family.FAMILIES, profiles.PROFILES), saved):
        registry.clear()
        registry.update(before)
    sys.path[:] = saved[2]


@contextlib.asynccontextmanager
async def _tiny_pipeline(model_dir: str, max_num_seqs: int):
    """A started pipeline on a tiny model, with the engine settings vLLM-CPU needs here."""
    p = load_pipeline(
        model_dir,
        engine_options=tiny_engine_options(model_dir, max_num_seqs),
        options=PipelineOptions(),
    )
    await p.start()
    try:
        yield p
    finally:
        await p.aclose()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-veena"), "veena", seed=0))


@pytest.fixture(scope="session")
def snac_codec(tiny_model_dir) -> SnacCodec:
    """The real loading path (``SNAC.from_pretrained`` on a local folder), random weights."""
    import torch

    torch.set_num_threads(2)
    return SnacCodec.load(f"{tiny_model_dir}/snac")


@pytest.fixture(scope="session")
async def pipeline(tiny_model_dir):
    async with _tiny_pipeline(tiny_model_dir, max_num_seqs=16) as p:
        yield p


@pytest.fixture(scope="session")
def tiny_spark_dir(tmp_path_factory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-veena3"), "veena3", seed=0))


@pytest.fixture(scope="session")
async def spark_pipeline(tiny_spark_dir):
    """A second engine: a tiny random Spark/Veena3-layout model with a random BiCodec."""
    async with _tiny_pipeline(tiny_spark_dir, max_num_seqs=8) as p:
        yield p


@pytest.fixture(scope="session")
def tiny_maya1_dir(tmp_path_factory) -> str:
    """Maya1's layout: its special ids, its 20 tags as single tokens, EOS <|eot_id|>."""
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-maya1"), "maya1", seed=0))


@pytest.fixture(scope="session")
async def maya1_pipeline(tiny_maya1_dir):
    """A third engine, started once: the tiny Maya1-layout model read with its profile."""
    async with _tiny_pipeline(tiny_maya1_dir, max_num_seqs=4) as p:
        yield p


@pytest.fixture(scope="session")
def tiny_neutts_dir(tmp_path_factory) -> str:
    """NeuTTS's layout: its prompt tokens, 65,536 speech tokens in order, a tiny NeuCodec."""
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-neutts"), "neutts", seed=0))


@pytest.fixture(scope="session")
def neutts_tokenizer(tiny_neutts_dir):
    """Its tokenizer, loaded once (65,536 added tokens take seconds to load)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_neutts_dir)


@pytest.fixture(scope="session")
async def server_url(pipeline):
    # room for the 32-stream test: every stream is admitted and vLLM queues past its
    # max_num_seqs, so no stream's fate depends on how fast this machine is
    options = ServerOptions(api_key=API_KEY, max_text_chars=20000, max_contexts_per_connection=4,
                            max_active_streams=32, max_queued_streams=32, max_queue_wait_s=3600)
    async with serve(pipeline, options) as url:
        yield url
