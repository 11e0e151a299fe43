"""A minimal WebSocket client over a raw socket: it can put several messages into ONE socket
write (so the server reads them in one read, as a client on a real network may make it do)
and send headers or frames no polite client library would."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct


def frame(payload: bytes, opcode: int = 0x1) -> bytes:
    """One masked client frame (RFC 6455)."""
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = bytes([0x80 | opcode, 0x80 | n])
    elif n < 1 << 16:
        head = bytes([0x80 | opcode, 0x80 | 126]) + struct.pack(">H", n)
    else:
        head = bytes([0x80 | opcode, 0x80 | 127]) + struct.pack(">Q", n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def text_frame(message: dict | str) -> bytes:
    return frame((message if isinstance(message, str) else json.dumps(message)).encode())


class RawWebSocket:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def connect(cls, port: int, headers: dict[str, str] | None = None,
                      path: str = "/v1/stream",
                      receive_buffer: int | None = None) -> "RawWebSocket":
        """``receive_buffer``: a small kernel receive window and stream buffer, so that a
        client that does not read soon makes the server's writes wait."""
        if receive_buffer is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        else:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            reader, writer = await asyncio.open_connection(sock=sock, limit=receive_buffer)
        key = base64.b64encode(os.urandom(16)).decode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        writer.write((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                      f"Sec-WebSocket-Version: 13\r\n{extra}\r\n").encode())
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        return cls(reader, writer)

    async def send_together(self, messages: list[dict | str]) -> None:
        """Every message in one socket write."""
        self._writer.write(b"".join(text_frame(m) for m in messages))
        await self._writer.drain()

    async def receive(self) -> tuple[int, bytes]:
        """The next (opcode, payload) from the server (server frames are not masked)."""
        b0, b1 = await self._reader.readexactly(2)
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack(">H", await self._reader.readexactly(2))
        elif n == 127:
            (n,) = struct.unpack(">Q", await self._reader.readexactly(8))
        return b0 & 0x0F, await self._reader.readexactly(n)

    async def close(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def raw_http(port: int, head: bytes, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """Send ``head`` (request line and headers, without the blank line; ``Connection:
    close`` is added) and ``body`` as they are; the answer's status, headers and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.rstrip(b"\r\n") + b"\r\nConnection: close\r\n\r\n" + body)
        await writer.drain()
        data = await reader.read()
    finally:
        writer.close()
    status_line, _, rest = data.partition(b"\r\n")
    raw_headers, _, payload = rest.partition(b"\r\n\r\n")
    headers = {}
    for line in raw_headers.split(b"\r\n"):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        payload = _unchunk(payload)
    return int(status_line.split()[1]), headers, payload


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2:]
    return out
