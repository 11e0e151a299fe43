"""One connection's outgoing messages: audio frames of one context that wait behind a slow
write leave as one frame (fewer writes), a frame with nothing before it goes straight into
the socket (no task wake), nothing is lost, reordered or counted twice."""

import asyncio
import collections
import json

import aiohttp
import pytest

from livekit.plugins.veena.protocol import decode_audio, encode_audio
from livekit.plugins.veena.server import contexts
from livekit.plugins.veena.server import websocket as ws_module
from livekit.plugins.veena.server.app import ServerOptions

from ..fakes import fake_server
from ..servers import metric, poll_until
from .rawws import RawWebSocket

GUARD_POLLS = 2000  # a hang guard for the fake engine, never a claim about speed


def test_consecutive_audio_of_one_context_merges_in_order():
    a1, a2, a3 = (encode_audio("a", bytes([i]) * 4) for i in (1, 2, 3))
    b1 = encode_audio("b", b"\x09" * 2)
    event = {"type": "done", "context_id": "a"}
    merged = ws_module._merged([a1, a2, b1, a3, event, a1, a2])
    assert [decode_audio(m) if isinstance(m, bytes) else m for m in merged] == [
        ("a", b"\x01" * 4 + b"\x02" * 4), ("b", b"\x09" * 2), ("a", b"\x03" * 4), event,
        ("a", b"\x01" * 4 + b"\x02" * 4)]
    # an id that is a prefix of another is another context
    ab = encode_audio("ab", b"\x05" * 2)
    assert len(ws_module._merged([a1, ab])) == 2


def test_merged_frames_stay_under_the_bound(monkeypatch):
    monkeypatch.setattr(ws_module, "_MERGED_FRAME_BYTES", 10)
    frames = [encode_audio("a", bytes([i]) * 4) for i in range(5)]
    big = encode_audio("a", b"\x07" * 30)
    merged = ws_module._merged([*frames, big])
    pcm = [decode_audio(m)[1] for m in merged]
    assert b"".join(pcm) == b"".join(decode_audio(f)[1] for f in [*frames, big])
    assert [len(p) for p in pcm] == [8, 8, 4, 30]  # a frame larger than the bound goes alone


def test_outbox_counts_bytes_until_sent():
    counted = []
    box = ws_module._Outbox(1 << 20, lambda: None, counted.append)
    frames = [encode_audio("a", b"\x00" * 100) for _ in range(3)]
    for f in frames:
        box.put(f)
    (merged,) = box.take_now()
    assert len(merged) == 3 * 100 + 2  # one header ("\x01a") for the three
    assert box.bytes == len(merged)  # taken, not yet sent: still held
    box.sent(merged)
    assert box.bytes == 0
    box.put(frames[0])
    box.put(frames[1])
    box.discard(box.take_now())  # taken and never sent, then the connection is gone
    box.put(frames[2])
    box.discard()
    assert box.bytes == 0 and sum(counted) == 0


class _Transport:
    def __init__(self) -> None:
        self.written = bytearray()

    def write(self, data) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return False


class _Protocol:
    _paused = False


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 200_000])
async def test_a_frame_sent_directly_is_the_frame_aiohttp_writes(size):
    """The direct path frames audio itself: byte for byte what aiohttp's own server-side
    writer sends for the same payload, at every length encoding (7, 16 and 64 bits)."""
    from aiohttp._websocket.writer import WebSocketWriter

    payload = bytes(i % 251 for i in range(size))
    transport = _Transport()
    writer = WebSocketWriter(_Protocol(), transport, use_mask=False)
    await writer.send_frame(payload, aiohttp.WSMsgType.BINARY)
    assert ws_module._binary_frame(payload) == bytes(transport.written)


async def test_audio_with_nothing_before_it_skips_the_writer_and_keeps_the_order():
    sent, counted = [], []
    box = ws_module._Outbox(1 << 20, lambda: None, counted.append)
    box.send_now = lambda frame: sent.append(frame) or True
    a1, a2, a3 = (encode_audio("a", bytes([i]) * 4) for i in (1, 2, 3))
    box.put(a1)  # the writer has not started waiting: queued
    assert sent == [] and box.take_now() == [a1]
    box.sent(a1)
    taking = asyncio.create_task(box.take())
    await asyncio.sleep(0)  # the writer now waits with nothing queued
    box.put(a2)
    assert sent == [a2] and box.bytes == 0  # straight out, never held
    event = {"type": "words", "context_id": "a"}
    box.put(event)  # events always go through the writer
    box.put(a3)  # something waits before it: queued behind it
    assert sent == [a2] and await taking == [event, a3]
    box.sent(a3)
    taking = asyncio.create_task(box.take())
    await asyncio.sleep(0)
    box.send_now = lambda frame: False  # the socket's buffer is not empty
    box.put(a1)
    assert await taking == [a1] and box.bytes == len(a1)
    box.sent(a1)
    assert box.bytes == 0 and sum(counted) == 0


async def test_a_reading_client_gets_its_windows_without_the_writer_waking(monkeypatch):
    """With a client that keeps up, each window goes into the socket as it is pushed: the
    connection's writer task wakes for the events (words, done), not once per window."""
    steps: collections.Counter = collections.Counter()
    run = asyncio.events.Handle._run

    def counted(handle):
        owner = getattr(handle._callback, "__self__", None)
        if isinstance(owner, asyncio.Task):
            steps[owner.get_name()] += 1
        return run(handle)

    async with fake_server(ServerOptions(slow_client_s=3600.0)) as server:
        ws = await RawWebSocket.connect(server.port)
        try:
            monkeypatch.setattr(asyncio.events.Handle, "_run", counted)
            await ws.send_together([{
                "type": "speak", "context_id": "a", "continue": False, "seed": 3,
                "text": "One sentence to speak. And another one after it.",
                "sampling": {"max_tokens": 7 * 60}}])
            frames, size, events = await _read_until_done(ws, "a")
            monkeypatch.undo()
        finally:
            await ws.close()
    assert events[-1]["type"] == "done" and frames >= 8
    # the whole utterance (about 90 KB) fits the socket's kernel buffer (256 KiB): nothing
    # waits in the transport however late the client reads, so every frame goes directly
    assert steps["veena-ws-writer"] <= len(events) + 2


async def _read_until_done(ws: RawWebSocket, cid: str) -> tuple[int, int, list[dict]]:
    """Audio frames and PCM bytes received for ``cid`` up to its ``done``, and the events."""
    frames = size = 0
    events: list[dict] = []
    while True:
        op, data = await asyncio.wait_for(ws.receive(), 60)  # a hang guard only
        if op == 0x2:
            got, pcm = decode_audio(data)
            assert got == cid
            frames += 1
            size += len(pcm)
        elif op == 0x1:
            events.append(json.loads(data))
            if events[-1]["type"] in ("done", "error", "cancelled"):
                return frames, size, events


@pytest.mark.parametrize("reads", [True, False])
async def test_windows_behind_a_slow_write_leave_as_fewer_frames(monkeypatch, reads):
    encoded: list[int] = []

    def counting(cid: str, pcm: bytes) -> bytes:
        encoded.append(len(pcm))
        return encode_audio(cid, pcm)

    monkeypatch.setattr(contexts, "encode_audio", counting)
    opts = ServerOptions(slow_client_s=3600.0, socket_send_buffer_bytes=8 << 10)
    async with fake_server(opts) as server:
        ws = await RawWebSocket.connect(server.port, receive_buffer=4096)
        try:
            await ws.send_together([{
                "type": "speak", "context_id": "a", "continue": False, "seed": 3,
                "text": "One sentence to speak. And another one after it.",
                "sampling": {"max_tokens": 7 * 60}}])
            if not reads:  # every window is queued before the client reads a byte
                await poll_until(server.idle, server.leftovers, polls=GUARD_POLLS)
            frames, size, events = await _read_until_done(ws, "a")
        finally:
            await ws.close()
        assert events[-1]["type"] == "done"
        assert size == sum(encoded) == round(events[-1]["audio_seconds"] * 24000) * 2
        if reads:
            assert frames <= len(encoded)
        else:
            assert frames < len(encoded)
        async with aiohttp.ClientSession() as s:
            await poll_until(server.settled, "the connection closed")
            assert await metric(s, server.url, "veena_buffered_bytes") == 0


async def test_audio_is_never_deflated_even_when_the_client_offers_it():
    """permessage-deflate would cost ~1 ms of CPU per audio second for ~5 % fewer bytes."""
    async with fake_server(ServerOptions()) as server, aiohttp.ClientSession() as s:
        async with s.ws_connect(server.ws_url, compress=15) as ws:
            assert ws.compress == 0  # the server declined the extension
            await ws.send_json({"type": "speak", "context_id": "a", "continue": False,
                                "text": "Hello there.", "sampling": {"max_tokens": 7 * 8}})
            audio = 0
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    audio += len(decode_audio(msg.data)[1])
                elif msg.json()["type"] == "done":
                    break
            assert audio > 0
