"""Proof that an adapter voice is applied: the product speaking with LoRA adapter A equals,
token for token, the base model with A merged into its weights as PEFT defines the merge
(``W + lora_alpha / r * B @ A``, written in ``tests.helpers.merge_lora``); without the
adapter it differs; three streams in one engine batch (adapter A, adapter B, a base voice)
each equal their own model alone.

The merged models speak through a ZERO adapter (A's shapes, B all zeros: it adds nothing)
registered under the same name, so both sides build the same prompt (``<spk_acme> ...``) on
the same code path. Every engine here runs float32, so merged and unmerged weights round
alike. Two adapters of different ranks (8 and 4) on all seven projections."""

import asyncio
import json
import shutil
from dataclasses import replace
from pathlib import Path

import aiohttp
import numpy as np
import psutil
import pytest

from livekit.plugins.veena import cli
from livekit.plugins.veena.models.loading import load_pipeline
from livekit.plugins.veena.models.tiny_model import make_random_adapter
from livekit.plugins.veena.pipeline.options import PipelineOptions
from livekit.plugins.veena.server.app import ServerOptions
from livekit.plugins.veena.voices.call_voice import resolve_voice

from ..helpers import merge_lora, same_audio, tiny_engine_options
from ..servers import API_KEY, poll_until, serve_app

pytestmark = pytest.mark.engine

AUTH = {"Authorization": f"Bearer {API_KEY}"}
TEXT = "A voice of its own."
SEED = 7
MAX_TOKENS = 140  # 20 frames: enough to tell models apart, little CPU


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora")
    return {
        "A": make_random_adapter(root / "A", tiny_model_dir, rank=8, alpha=16, seed=1),
        "B": make_random_adapter(root / "B", tiny_model_dir, rank=4, alpha=8, seed=2),
        "zero8": make_random_adapter(root / "zero8", tiny_model_dir, rank=8, alpha=16, seed=3,
                                     zero=True),
        "zero4": make_random_adapter(root / "zero4", tiny_model_dir, rank=4, alpha=8, seed=3,
                                     zero=True),
    }


def _f32_pipeline(model: str, lora: dict[str, Path]):
    # the fixed ramp and windowed decodes: a server's audio depends on the tokens alone
    return load_pipeline(model, engine_options=tiny_engine_options(model, 8, dtype="float32"),
                         options=PipelineOptions(adaptive_windows=False, snac_streaming=False),
                         lora={name: str(p) for name, p in lora.items()})


@pytest.fixture(scope="module")
async def with_adapters(tiny_model_dir, adapters):
    """The base model serving adapters A (as ``acme``) and B (as ``bravo``)."""
    p = _f32_pipeline(tiny_model_dir, {"acme": adapters["A"], "bravo": adapters["B"]})
    await p.start()
    yield p
    await p.aclose()


@pytest.fixture(scope="module")
async def solo(tiny_model_dir, adapters, tmp_path_factory):
    """Each merged model alone, speaking its voice through a ZERO adapter of its name:
    {voice: codes}, and {voice + " audio": PCM} as a server speaks it over a WebSocket."""
    root = tmp_path_factory.mktemp("merged")
    out = {}
    for voice, adapter, zero in (("acme", "A", "zero8"), ("bravo", "B", "zero4")):
        merged = merge_lora(tiny_model_dir, adapters[adapter], root / adapter)
        p = _f32_pipeline(str(merged), {voice: adapters[zero]})
        await p.start()
        try:
            out[voice] = await _codes(p, voice)
            async with serve_app(p, ServerOptions(api_key=API_KEY)) as (url, _), \
                    aiohttp.ClientSession() as s:
                async with s.ws_connect(url.replace("http", "ws") + "/v1/stream",
                                        headers=AUTH) as ws:
                    out[f"{voice} audio"] = await _speak_audio(ws, voice)
        finally:
            await p.aclose()
    return out


async def _speak_audio(ws, voice: str) -> bytes:
    """``TEXT`` in ``voice`` over a WebSocket, with the module's seed and length: its PCM."""
    await ws.send_json({"type": "speak", "context_id": "c", "text": TEXT, "continue": False,
                        "voice": voice, "seed": SEED, "sampling": {"max_tokens": MAX_TOKENS}})
    audio = bytearray()
    async for msg in ws:
        if msg.type == aiohttp.WSMsgType.BINARY:
            audio += msg.data[1 + msg.data[0]:]
        elif msg.type == aiohttp.WSMsgType.TEXT and msg.json()["type"] in (
                "done", "error", "cancelled"):
            assert msg.json()["type"] == "done", msg.json()
            return bytes(audio)
    raise AssertionError("the socket closed before the context ended")


async def _codes(p, voice: str) -> np.ndarray:
    """The audio codes ``voice`` speaks ``TEXT`` with, resolved as every surface does."""
    v = resolve_voice(p.profile, voice, adapters=p.engine.adapters.names)
    sampling = replace(p.sampling.defaults(), max_tokens=MAX_TOKENS)
    syn = p.synthesize(TEXT, voice=v.voice, adapter=v.adapter, sampling=sampling, seed=SEED)
    await syn.collect()
    return np.stack(syn.tracks[0].steps)


async def test_an_adapter_voice_speaks_as_its_merged_model(with_adapters, solo):
    acme = await _codes(with_adapters, "acme")
    assert len(acme) >= 10
    assert np.array_equal(acme, solo["acme"])
    # the same prompt, the same seed, without the adapter: the base model's own tokens
    p = with_adapters
    prompt = p.family.prompt(p.engine.tokenizer, TEXT, "acme", None, ("acme",))
    sampling = p.family.constrain(replace(p.sampling.defaults(), max_tokens=MAX_TOKENS,
                                          seed=SEED), p.table)
    with_a, without = [], []
    async for ids in p.engine.generate(prompt, sampling, adapter=p.engine.adapters.get("acme")):
        with_a += ids
    async for ids in p.engine.generate(prompt, sampling):
        without += ids
    assert with_a != without


async def test_three_streams_in_one_batch_each_equal_their_own_model_alone(with_adapters, solo):
    p = with_adapters
    base_alone = await _codes(p, "kavya")
    in_flight: list[int] = []

    async def watch():
        while True:
            in_flight.append(len(p.engine.live_request_ids))
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    try:
        acme, bravo, base = await asyncio.gather(*(_codes(p, v)
                                                   for v in ("acme", "bravo", "kavya")))
    finally:
        watcher.cancel()
    assert max(in_flight) == 3  # all three ran in the engine's steps together
    assert np.array_equal(acme, solo["acme"])
    assert np.array_equal(bravo, solo["bravo"])
    assert np.array_equal(base, base_alone)
    assert not np.array_equal(acme[:10], bravo[:10]) and not np.array_equal(acme[:10],
                                                                           base[:10])


def test_say_with_an_adapter_writes_the_merged_models_samples(tiny_model_dir, adapters,
                                                             tmp_path, monkeypatch):
    """The issue's own check: ``say --lora acme=ADAPTER`` on M equals ``say --lora
    acme=ZERO`` on MERGED. (That it differs from ``--lora acme=ZERO`` on M follows: the
    merged model speaks other tokens than M, shown by the first test of this module; a
    third ``say`` would be a third engine start for it.)"""
    monkeypatch.setenv("VEENA_DTYPE", "float32")
    # the fixed ramp and windowed decodes: the audio depends on the tokens alone, not on
    # when they arrived, so equal tokens write equal samples
    monkeypatch.setenv("VEENA_ADAPTIVE_WINDOWS", "0")
    monkeypatch.setenv("VEENA_SNAC_STREAMING", "0")
    merged = merge_lora(tiny_model_dir, adapters["A"], tmp_path / "merged")

    def say(model, adapter, out):
        code = cli.main(["say", TEXT, "--model", str(model), "--lora", f"acme={adapter}",
                         "--voice", "acme", "--seed", str(SEED), "--max-tokens",
                         str(MAX_TOKENS), "-o", str(tmp_path / out)])
        assert code == 0
        return (tmp_path / out).read_bytes()

    assert say(tiny_model_dir, adapters["A"], "a.wav") == say(merged, adapters["zero8"],
                                                             "merged.wav")


def _owner(workers: list[psutil.Process], local_port: int) -> int | None:
    """The pid of the worker holding the server side of our connection from ``local_port``."""
    for w in workers:
        try:
            if any(c.raddr and c.raddr.port == local_port for c in w.net_connections("tcp")):
                return w.pid
        except psutil.NoSuchProcess:
            pass
    return None


def _our_ports(port: int) -> set[int]:
    """The local ports of this process's connections to ``port``."""
    return {c.laddr.port for c in psutil.Process().net_connections("tcp")
            if c.raddr and c.raddr.port == port}


async def _post_on(port: int, workers: list[psutil.Process], pid: int, body: dict) -> int:
    """POST ``body`` to /v1/adapters through a connection worker ``pid`` accepted (the
    kernel spreads connections over the workers: tried until one lands there); its status."""
    for _ in range(200):  # a hang guard: 1 in 2 lands on each
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        local = writer.get_extra_info("sockname")[1]
        try:
            if await poll_until(lambda: _owner(workers, local), "accepted") == pid:
                data = json.dumps(body).encode()
                writer.write(b"POST /v1/adapters HTTP/1.1\r\nHost: localhost\r\n"
                             b"Authorization: Bearer " + API_KEY.encode() + b"\r\n"
                             b"Content-Type: application/json\r\nConnection: close\r\n"
                             b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
                await writer.drain()
                answer = await reader.read()
                assert b" 201 " in answer.split(b"\r\n", 1)[0], answer
                return 201
        finally:
            writer.close()
    raise AssertionError(f"no connection landed on worker {pid}")


async def _socket_on(port: int, workers: list[psutil.Process], pid: int):
    """A session and a WebSocket that worker ``pid`` serves."""
    for _ in range(200):  # a hang guard: 1 in 2 lands on each
        before = _our_ports(port)
        s = aiohttp.ClientSession()
        ws = await s.ws_connect(f"ws://127.0.0.1:{port}/v1/stream", headers=AUTH)
        (local,) = _our_ports(port) - before
        if await poll_until(lambda: _owner(workers, local), "accepted") == pid:
            return s, ws
        await ws.close()
        await s.close()
    raise AssertionError(f"no socket landed on worker {pid}")


@pytest.mark.timeout(2700)
async def test_two_front_ends_of_one_core_each_speak_their_own_adapter(
        tiny_model_dir, adapters, solo, tmp_path):
    """``serve --workers 2 --shared-engine``: adapter A registered through one front end and
    B through the other (each front end knows only its own: no refresh meanwhile), spoken at
    once: each stream equals its own merged model. (Ids counted per process were 1 in both
    front ends, and the core served whichever it loaded first for both.) The launcher
    starts the only engine core, and the core ending ends the server (exit 3) and its
    workers: the shared-core test of ``test_workers``, on this test's one start."""
    from ..server.test_workers import _both_listen, _engine_cores, _exit_code, _launch, _reap
    from ..servers import free_port

    root = tmp_path / "adapters"
    root.mkdir()
    port = free_port()
    proc = _launch(tiny_model_dir, port, tmp_path / "serve.log", "--workers", "2",
                   "--shared-engine", VEENA_DTYPE="float32", VEENA_ADAPTIVE_WINDOWS="0",
                   VEENA_SNAC_STREAMING="0", VEENA_ADAPTERS_DIR=str(root),
                   VEENA_ADAPTERS_REFRESH_S="3600", VEENA_API_KEY=API_KEY)
    launcher = psutil.Process(proc.pid)
    workers: list[psutil.Process] = []
    sessions = []
    try:
        await _both_listen(proc, launcher, workers, port, tmp_path / "serve.log")
        (core,) = _engine_cores(launcher)
        assert not any(_engine_cores(w) for w in workers)  # no engine of their own
        for voice, adapter, worker in (("acme", "A", workers[0]), ("bravo", "B", workers[1])):
            shutil.copytree(adapters[adapter], root / voice)
            await _post_on(port, workers, worker.pid, {"name": voice})
        sockets = []
        for worker in workers:  # one after the other: each socket told apart by its port
            s, ws = await _socket_on(port, workers, worker.pid)
            sessions.append(s)
            sockets.append(ws)
        acme, bravo = await asyncio.gather(_speak_audio(sockets[0], "acme"),
                                           _speak_audio(sockets[1], "bravo"))
        assert same_audio(np.frombuffer(acme, np.int16),
                          np.frombuffer(solo["acme audio"], np.int16))
        assert same_audio(np.frombuffer(bravo, np.int16),
                          np.frombuffer(solo["bravo audio"], np.int16))
        core.kill()
        assert await _exit_code(proc) == 3
        gone, alive = psutil.wait_procs(workers, timeout=60)
        assert not alive, "a worker outlived the server"
        assert "the shared vLLM engine core ended" in (tmp_path / "serve.log").read_text()
    finally:
        for s in sessions:
            await s.close()
        _reap(proc, workers)
