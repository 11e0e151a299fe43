"""The server process killed mid-stream: the plugin fails fast and leaves nothing behind."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import aiohttp
import pytest
from livekit.agents import APIConnectionError, APIConnectOptions

from livekit.plugins import veena

pytestmark = pytest.mark.engine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def server_process(tiny_model_dir):
    port = _free_port()
    env = dict(os.environ, VEENA_MAX_MODEL_LEN="2048", VEENA_MAX_NUM_SEQS="4")
    proc = subprocess.Popen(
        [sys.executable, "-m", "livekit.plugins.veena.cli", "serve", "--model", tiny_model_dir,
         "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as s:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                assert proc.poll() is None, "server exited during start-up"
                try:
                    async with s.get(url + "/ready") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(1)
            else:
                pytest.fail("server did not become ready")
        yield proc, url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


async def test_server_killed_mid_stream(server_process):
    proc, url = server_process
    before = set(asyncio.all_tasks())
    tts_ = veena.TTS(base_url=url.replace("http", "ws"), max_tokens_per_chunk=1400)
    stream = tts_.stream(conn_options=APIConnectOptions(max_retry=0, timeout=10))
    stream.push_text("This reply will be cut off when the server dies. It goes on and on.")
    stream.end_input()
    it = stream.__aiter__()
    await asyncio.wait_for(it.__anext__(), 120)
    os.killpg(proc.pid, signal.SIGKILL)
    t0 = time.perf_counter()
    with pytest.raises(APIConnectionError):
        while True:
            await asyncio.wait_for(it.__anext__(), 5)
    assert time.perf_counter() - t0 < 3
    await stream.aclose()
    await tts_.aclose()
    await asyncio.sleep(0.05)
    leaked = [t for t in asyncio.all_tasks() - before
              if t is not asyncio.current_task() and not t.done()]
    assert not leaked, leaked
