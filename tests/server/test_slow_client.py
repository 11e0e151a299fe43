"""A client that stops reading: the server's buffered audio stays within its bound, the
client's contexts are cancelled (vLLM request aborted, windows dropped) and its socket is
closed. No clock decides when; only the bytes the client leaves unread."""

import asyncio
import base64
import json
import os
import socket
import struct

import aiohttp
import pytest

from livekit.plugins.veena.server.app import ServerOptions

from ..helpers import engine_settled
from ..servers import metric, poll_until, serve

pytestmark = pytest.mark.engine
BUFFER_LIMIT = 128 << 10


def _frame(text: str) -> bytes:
    """One masked client text frame (RFC 6455)."""
    payload = text.encode()
    mask = os.urandom(4)
    n = len(payload)
    head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def _open_non_reader(port: int) -> socket.socket:
    """A WebSocket client with a tiny receive window that will never read after the
    handshake (the server runs on this same event loop: every socket call is async)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    await loop.sock_sendall(sock, (
        f"GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    for _ in range(65536):  # a response head is far shorter: only a guard against a hang
        if b"\r\n\r\n" in head:
            break
        head += await loop.sock_recv(sock, 1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


async def test_non_reading_client_is_cut_off_with_bounded_buffers(pipeline):
    # the heartbeat would also drop this client (it answers no ping), after 45 s: on a slow
    # machine before the audio fills the buffers, so here only the unread bytes decide
    opts = ServerOptions(slow_client_s=1.0, max_connection_buffer_bytes=BUFFER_LIMIT,
                         socket_send_buffer_bytes=16 << 10, heartbeat_s=3600.0)
    async with serve(pipeline, opts) as url, aiohttp.ClientSession() as s:
        port = int(url.rsplit(":", 1)[1])
        sock = await _open_non_reader(port)
        loop = asyncio.get_running_loop()
        # 1400 tokens = 200 SNAC frames = 800 KB of audio per chunk, far more than every
        # buffer holds; min_tokens keeps the random model from stopping early (a run that
        # happened to stop after a few frames left nothing to overflow and was never cut off)
        for cid in ("a", "b"):
            await loop.sock_sendall(sock, _frame(json.dumps({
                "type": "speak", "context_id": cid, "continue": False,
                "text": "A long answer nobody is listening to. " * 4,
                "sampling": {"max_tokens": 1400, "min_tokens": 1400}})))
        peak = 0
        seen: dict[str, float] = {}

        async def cut_off() -> bool:
            nonlocal peak
            buffered = await metric(s, url, "veena_buffered_bytes")
            peak = max(peak, buffered)
            seen.update(buffered=buffered, done=await metric(
                s, url, 'veena_requests_total{outcome="done"}'),
                live=len(pipeline.engine.live_request_ids))
            return await metric(s, url, "veena_slow_clients_total") >= 1

        async def both_ended() -> bool:
            return await metric(s, url, 'veena_requests_total{outcome="slow_client"}') >= 2

        await poll_until(cut_off, lambda: f"the client cut off (last seen: {seen})")
        assert peak <= BUFFER_LIMIT
        await poll_until(both_ended, "both contexts ended as slow_client")
        assert await metric(s, url, 'veena_requests_total{outcome="done"}') == 0
        assert await engine_settled(pipeline) and pipeline.scheduler.pending == 0
        assert await metric(s, url, "veena_buffered_bytes") == 0
        assert await metric(s, url, "veena_connections") == 0
        # the server closed the socket: reading what was in flight ends in EOF or a reset
        try:
            for _ in range(100_000):  # what was in flight, then EOF (bounded: a hang guard)
                if not await asyncio.wait_for(loop.sock_recv(sock, 65536), 60):
                    break
            else:
                raise AssertionError("the server never closed the socket")
        except ConnectionResetError:
            pass
        sock.close()
