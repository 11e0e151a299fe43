"""The server process killed mid-stream: the plugin fails fast and leaves nothing behind."""

import asyncio
import os
import signal

import pytest
from livekit.agents import APIConnectionError, APIConnectOptions, APITimeoutError
from livekit.plugins import veena

from ..helpers import tasks_left_since
from ..servers import spawn_server

pytestmark = pytest.mark.engine
HANG_GUARD_S = 120  # only against a hang; the stream's own timeout is far shorter


@pytest.fixture
async def server_process(tiny_model_dir):
    async with spawn_server(tiny_model_dir) as (proc, url):
        yield proc, url


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
    with pytest.raises(APIConnectionError) as info:
        for _ in range(100_000):  # the audio still in flight, then the failure (a hang guard)
            await asyncio.wait_for(it.__anext__(), HANG_GUARD_S)
    # it noticed the closed socket: not its own read timeout (APITimeoutError, a subclass)
    assert not isinstance(info.value, APITimeoutError), info.value
    await stream.aclose()
    await tts_.aclose()
    leaked = await tasks_left_since(before)
    assert not leaked, leaked
