"""A WebSocket context's life on the server (fake engine, no vLLM): exactly one terminal
event whatever the order and timing of its messages, a context that ends frees its slots at
once, a context waiting for text holds no stream slot, and an idle one ends."""

import asyncio
import json

import pytest

from livekit.plugins.veena.protocol import decode_audio
from livekit.plugins.veena.server.app import ServerOptions

from ..fakes import fake_server
from ..helpers import tasks_left_since
from ..servers import poll_until
from .rawws import RawWebSocket

TERMINAL = ("done", "cancelled", "error")
GUARD_POLLS = 400  # a hang guard for the fake engine's tests, never a claim about speed
HANG_GUARD_S = 60


def speak(cid: str, text: str, more: bool, **extra) -> dict:
    return {"type": "speak", "context_id": cid, "text": text, "continue": more,
            "sampling": {"max_tokens": 28}, **extra}


class Reader:
    """Every event a raw socket receives, in order, read by a background task."""

    def __init__(self, ws: RawWebSocket) -> None:
        self.ws = ws
        self.events: list[dict] = []
        self.audio: dict[str, int] = {}
        self.closed = False
        self.close_code: int | None = None
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                op, data = await self.ws.receive()
                if op == 0x2:
                    cid, pcm = decode_audio(data)
                    self.audio[cid] = self.audio.get(cid, 0) + len(pcm)
                elif op == 0x1:
                    self.events.append(json.loads(data))
                elif op == 0x8:
                    self.closed = True
                    self.close_code = int.from_bytes(data[:2], "big") if data else None
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed = True

    def terminal(self, cid: str | None = None) -> list[dict]:
        return [e for e in self.events if e["type"] in TERMINAL
                and (cid is None or e.get("context_id") == cid)]

    def of(self, cid: str, kind: str) -> list[dict]:
        return [e for e in self.events if e["type"] == kind and e.get("context_id") == cid]

    async def stop(self) -> None:
        self._task.cancel()
        with __import__("contextlib").suppress(asyncio.CancelledError):
            await self._task
        await self.ws.close()


async def _open(server) -> Reader:
    return Reader(await RawWebSocket.connect(server.port))


async def test_speak_and_cancel_in_one_read_end_once_each_and_leave_nothing():
    """The leak of issue 18: a cancel in the same socket read as its context's first speak.
    100 pairs on one socket (16 contexts at most): each gets exactly one ``cancelled``."""
    async with fake_server(ServerOptions()) as server:
        r = await _open(server)
        cids = [f"c{i}" for i in range(100)]
        await r.ws.send_together([m for c in cids for m in (
            speak(c, "Hello there, how are you?", False), {"type": "cancel", "context_id": c})])
        await poll_until(lambda: len(r.terminal()) >= 100, "100 terminal events",
                         polls=GUARD_POLLS)
        await poll_until(server.idle, "contexts and slots freed", polls=GUARD_POLLS)
        assert sorted(e["context_id"] for e in r.terminal()) == sorted(cids)
        assert {e["type"] for e in r.terminal()} == {"cancelled"}
        # the socket still takes new contexts
        await r.ws.send_together([speak("after", "One more sentence.", False)])
        await poll_until(lambda: r.terminal("after"), "the next context ends", polls=GUARD_POLLS)
        assert [e["type"] for e in r.terminal("after")] == ["done"]
        await r.stop()
        await poll_until(server.settled, "nothing left after the socket closed", polls=GUARD_POLLS)


async def test_text_after_the_end_is_rejected_not_a_second_terminal_event():
    async with fake_server(ServerOptions()) as server:
        r = await _open(server)
        await r.ws.send_together([speak("a", "Hello there.", False), speak("a", "More.", False),
                                  {"type": "flush", "context_id": "a"}])
        await poll_until(lambda: r.terminal("a"), "a's end", polls=GUARD_POLLS)
        await poll_until(server.idle, "a freed", polls=GUARD_POLLS)
        # after its end: rejected again, and nothing starts under the old id
        await r.ws.send_together([speak("a", "Again.", False), {"type": "cancel", "context_id": "a"},
                                  {"type": "flush", "context_id": "never"}])
        await poll_until(lambda: r.of("never", "rejected"), "the unknown flush's answer",
                         polls=GUARD_POLLS)
        assert [e["type"] for e in r.terminal("a")] == ["done"]
        assert [e["code"] for e in r.of("a", "rejected")] == ["context_ended"] * 3
        assert [e["code"] for e in r.of("never", "rejected")] == ["unknown_context"]
        assert not r.terminal("never") and server.idle()
        await r.stop()


async def test_a_context_past_the_text_limit_ends_once_and_frees_its_slot():
    async with fake_server(ServerOptions(max_text_chars=100), hold_after=2) as server:
        r = await _open(server)
        await r.ws.send_together([speak("a", "Hello there, how are you today? ", True)])
        await poll_until(lambda: server.state.admission.active == 1 and server.engine.live,
                         "a speaking", polls=GUARD_POLLS)
        await r.ws.send_together([speak("a", "And more text that goes on. " * 3, True)])
        await poll_until(lambda: r.terminal("a"), "a's end", polls=GUARD_POLLS)
        await poll_until(server.idle, "a's slots and engine request freed", polls=GUARD_POLLS)
        await r.ws.send_together([speak("a", "", False)])
        await poll_until(lambda: r.of("a", "rejected"), "the late end's answer",
                         polls=GUARD_POLLS)
        assert [(e["type"], e["code"]) for e in r.terminal("a")] == [("error", "text_too_long")]
        assert server.engine.aborted
        await r.stop()


async def test_a_context_waiting_for_text_holds_no_stream_slot():
    """One stream slot, no queue: a context that spoke its sentence and waits for more
    must not keep the next client out."""
    opts = ServerOptions(max_active_streams=1, max_queued_streams=0, context_idle_s=3600)
    async with fake_server(opts) as server:
        a = await _open(server)
        await a.ws.send_together([speak("a", "Hello there, this is a sentence. ", True)])
        await poll_until(lambda: a.of("a", "words"), "a's first chunk spoken", polls=GUARD_POLLS)
        assert server.state.admission.active == 0
        b = await _open(server)
        await b.ws.send_together([speak("b", "Hello from another client.", False)])
        await poll_until(lambda: b.terminal("b"), "b's end", polls=GUARD_POLLS)
        assert [e["type"] for e in b.terminal("b")] == ["done"] and b.audio["b"] > 0
        # a is still open: more text takes a slot again, and it ends normally
        await a.ws.send_together([speak("a", "And a last one.", False)])
        await poll_until(lambda: a.terminal("a"), "a's end", polls=GUARD_POLLS)
        assert [e["type"] for e in a.terminal("a")] == ["done"]
        assert len(a.of("a", "words")) == 2
        await a.stop()
        await b.stop()
        await poll_until(server.settled, "nothing left", polls=GUARD_POLLS)


async def test_silent_contexts_hear_keepalives_from_one_timer_until_they_end():
    """Two connections' contexts wait for text: each hears ``waiting`` events (one timer
    serves every connection), none after its terminal event, and the timer stops with the
    last context."""
    opts = ServerOptions(keepalive_s=0.05, context_idle_s=3600)
    async with fake_server(opts) as server:
        readers = [await _open(server) for _ in range(2)]
        for i, r in enumerate(readers):
            await r.ws.send_together([speak(f"c{i}", "Hi", True)])
        await poll_until(lambda: all(len(r.of(f"c{i}", "waiting")) >= 3
                                     for i, r in enumerate(readers)),
                         "keepalives on both connections", polls=GUARD_POLLS)
        assert server.state.keepalive_running
        for i, r in enumerate(readers):
            await r.ws.send_together([{"type": "cancel", "context_id": f"c{i}"}])
        await poll_until(server.idle, "both contexts and the timer ended", polls=GUARD_POLLS)
        for i, r in enumerate(readers):
            await poll_until(lambda: r.terminal(f"c{i}"), "the terminal event",
                             polls=GUARD_POLLS)
            kinds = [e["type"] for e in r.events if e.get("context_id") == f"c{i}"]
            assert kinds[-1] == "cancelled" and "waiting" not in kinds[kinds.index("cancelled"):]
            assert not r.audio.get(f"c{i}")
            await r.stop()


async def test_an_idle_context_ends_with_idle_timeout():
    async with fake_server(ServerOptions(context_idle_s=0.2)) as server:
        r = await _open(server)
        await r.ws.send_together([speak("quiet", "Hi", True),
                                  speak("spoke", "Hello there, one sentence. ", True)])
        await poll_until(lambda: len(r.terminal()) == 2, "both idle contexts end",
                         polls=GUARD_POLLS)
        for cid in ("quiet", "spoke"):
            (event,) = r.terminal(cid)
            assert (event["type"], event["code"], event["retryable"]) == (
                "error", "idle_timeout", False)
            assert "VEENA_CONTEXT_IDLE_S" in event["message"]
        assert r.audio.get("spoke", 0) > 0 and not r.audio.get("quiet")
        await poll_until(server.idle, "idle contexts freed", polls=GUARD_POLLS)
        await r.stop()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_speech_request_whose_client_left_stops_its_engine_work(stream):
    """The engine holds the request after 3 frames; the client then goes away. The work is
    aborted (engine request closed, counted aborted, not done) and, once the engine could
    go on, it produces no more tokens: causal checks only. No task of the request is left
    waiting (its read of the next audio was one)."""
    async with fake_server(ServerOptions(), hold_after=3) as server:
        engine = server.engine
        before = set(asyncio.all_tasks())
        body = json.dumps({"input": "A long answer nobody will hear. " * 4, "stream": stream,
                           "response_format": "pcm", "sampling": {"max_tokens": 700}}).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        await poll_until(lambda: engine.live and engine.tokens_out >= 21, "the request held",
                         polls=GUARD_POLLS)
        writer.close()
        metrics = server.state.metrics
        await poll_until(lambda: metrics.aborted._value.get() >= 1, "counted as aborted",
                         polls=GUARD_POLLS)
        await poll_until(server.settled, "slot and engine request freed", polls=GUARD_POLLS)
        produced = engine.tokens_out
        engine.gate.set()
        for _ in range(50):
            await asyncio.sleep(0)
        assert engine.tokens_out == produced and engine.aborted and not engine.live
        assert metrics.finished.labels("done")._value.get() == 0
        assert metrics.finished.labels("cancelled")._value.get() == 1
        leaked = await tasks_left_since(before)
        assert not leaked, leaked


async def test_a_speech_request_that_left_while_queued_frees_its_place():
    """A non-streamed request waiting for a slot (the only one is held) whose client left."""
    opts = ServerOptions(max_active_streams=1, max_queued_streams=1, max_queue_wait_s=3600)
    async with fake_server(opts, hold_after=3) as server:
        holder = await _open(server)
        await holder.ws.send_together([speak("h", "Hold the only slot, please. ", False)])
        await poll_until(lambda: server.engine.live, "the slot held", polls=GUARD_POLLS)
        body = json.dumps({"input": "Waiting in line."}).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        await writer.drain()
        await poll_until(lambda: server.state.admission.queued == 1, "queued", polls=GUARD_POLLS)
        writer.close()
        await poll_until(lambda: server.state.admission.queued == 0, "the queue freed",
                         polls=GUARD_POLLS)
        assert server.state.metrics.aborted._value.get() == 1
        await holder.stop()
        await poll_until(server.settled, "nothing left", polls=GUARD_POLLS)
