"""Test servers shared by every folder: in-process apps on a free port, ``veena-tts serve`` as
its own process, and polling / metric helpers."""

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys

import aiohttp
from aiohttp import web

from livekit.plugins.veena.server.app import ServerOptions, create_app

API_KEY = "test-key"
POLLS = 6000
"""Most polls of one ``poll_until``: a guard against a hang, never a claim about speed."""


async def poll_until(check, what: str, every_s: float = 0.05, polls: int = POLLS):
    """Poll ``check`` (sync or async) until it returns a true value, which is returned;
    fails after ``polls`` polls (a hang guard), saying ``what`` it waited for (a string, or
    a callable that describes the state then)."""
    for _ in range(polls):
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(every_s)
    raise AssertionError(f"never happened: {what() if callable(what) else what}")


async def hear_context(ws) -> tuple[dict, int]:
    """Read a WebSocket until its context ends: (the final event, audio bytes heard)."""
    import aiohttp

    heard = 0
    async for msg in ws:
        if msg.type == aiohttp.WSMsgType.BINARY:
            heard += len(msg.data) - 1 - msg.data[0]
        elif msg.type == aiohttp.WSMsgType.TEXT:
            event = msg.json()
            if event["type"] in ("done", "error", "cancelled"):
                return event, heard
    raise AssertionError("the socket closed before the context ended")


async def metric(session, url: str, name: str) -> float:
    """The sum of a Prometheus metric's samples (all label sets) on the server at ``url``."""
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


@contextlib.asynccontextmanager
async def serve_app(pipeline, options: ServerOptions, own_pipeline: bool = False):
    """An in-process server on a free loopback port over ``pipeline``; yields (URL, app).
    ``own_pipeline``: the app starts the pipeline itself, as ``veena-tts serve`` does."""
    app = create_app(pipeline, options, own_pipeline=own_pipeline)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def serve(pipeline, options: ServerOptions):
    """An in-process server on a free loopback port over ``pipeline``; yields its URL."""
    async with serve_app(pipeline, options) as (url, _):
        yield url


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def spawn_server(model_dir: str, wait_for: str = "/ready", **env: str):
    """``veena-tts serve`` as its own process (own engine); yields (process, http URL) once
    ``wait_for`` answers 200 (``/health``: the server is up, its engine still starting).
    Killed with its whole process group at the end."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "livekit.plugins.veena.cli", "serve", "--model", model_dir,
         "--port", str(port)],
        env=dict(os.environ, VEENA_MAX_MODEL_LEN="2048", VEENA_MAX_NUM_SEQS="4", **env),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as s:
            async def up() -> bool:
                assert proc.poll() is None, "server exited during start-up"
                try:
                    async with s.get(url + wait_for) as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            # engine start: a minute or more here; the guard (10 min of polls) only stops a hang
            await poll_until(up, f"{wait_for} answers 200", every_s=0.5, polls=1200)
        yield proc, url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)
