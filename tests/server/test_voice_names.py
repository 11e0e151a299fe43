"""Saved voice names are unique and an upload cannot take a profile voice's name: concurrent
uploads for one name give one voice and 409s (in the server and on disk), and
``?name=kavya`` is refused. The clone
itself is faked here (held at a gate, so the uploads really overlap); the real one is
tests/server/test_voice_upload.py's."""

import asyncio
import json
import threading

import aiohttp
import pytest

from livekit.plugins.veena.models.profiles import CLONED_VOICE
from livekit.plugins.veena.server import voice_routes
from livekit.plugins.veena.server.app import ServerOptions
from livekit.plugins.veena.voices.files import VoiceFile

from ..fakes import fake_server
from ..servers import poll_until


def _voice(n: int) -> VoiceFile:
    return VoiceFile("veena", "fake", CLONED_VOICE, tuple([n] * 32))


@pytest.fixture
def gated_clone(monkeypatch):
    """``clone_voice`` held until the gate opens; each call's voice carries its number."""
    gate = asyncio.Event()
    calls = []

    async def clone(pipeline, data, text=None):
        calls.append(data)
        await gate.wait()
        return _voice(int(data))

    monkeypatch.setattr(voice_routes, "clone_voice", clone)
    return gate, calls


async def _post(s, url, data, name):
    async with s.post(f"{url}/v1/voices", data=data, params={"name": name}) as r:
        return r.status, await r.json()


async def test_concurrent_uploads_for_one_name_give_one_voice(tmp_path, gated_clone):
    gate, calls = gated_clone
    async with fake_server(ServerOptions(voices_dir=str(tmp_path))) as server, \
            aiohttp.ClientSession() as s:
        posts = [asyncio.create_task(_post(s, server.url, str(i).encode(), "guest"))
                 for i in range(8)]
        await poll_until(lambda: calls or all(p.done() for p in posts), "an upload in the clone",
                         polls=400)
        gate.set()
        results = await asyncio.gather(*posts)
        assert sorted(status for status, _ in results) == [200] + [409] * 7
        ((_, won),) = [(st, body) for st, body in results if st == 200]
        assert {b["error"]["code"] for st, b in results if st == 409} == {"voice_exists"}
        saved = json.loads((tmp_path / "guest.json").read_text())
        assert saved["speaker_globals"] == won["speaker_globals"]
        assert [p.name for p in tmp_path.iterdir()] == ["guest.json"]  # no temporary left
        status, body = await _post(s, server.url, b"9", "guest")
        assert status == 409 and body["error"]["code"] == "voice_exists"


@pytest.mark.parametrize("name", ["kavya", "KAVYA", "Kavya"])
async def test_a_profile_voice_name_is_refused(tmp_path, gated_clone, name):
    gate, calls = gated_clone
    gate.set()
    async with fake_server(ServerOptions(voices_dir=str(tmp_path))) as server, \
            aiohttp.ClientSession() as s:
        status, body = await _post(s, server.url, b"1", name)
        assert status == 409 and body["error"]["code"] == "voice_exists"
        assert not calls and not list(tmp_path.iterdir())


def test_exclusive_save_never_replaces_a_file_even_when_writers_race(tmp_path):
    path = tmp_path / "v.json"
    start, won, lost = threading.Barrier(8), [], []

    def save(n: int) -> None:
        start.wait()
        try:
            _voice(n).save(path, exclusive=True)
            won.append(n)
        except FileExistsError:
            lost.append(n)

    threads = [threading.Thread(target=save, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 7
    assert json.loads(path.read_text())["speaker_globals"] == [won[0]] * 32
    assert [p.name for p in tmp_path.iterdir()] == ["v.json"]


async def test_a_voice_saved_on_one_replica_is_usable_on_another(tmp_path, monkeypatch):
    """Two servers share VEENA_VOICES_DIR behind one load balancer: a voice uploaded to A is
    listed and spoken by B (B knew only the folder as it was at its start: "unknown voice",
    and the name listed nowhere while B refused it as taken)."""
    async def clone(pipeline, data, text=None):
        return VoiceFile("veena", "fake", "kavya", None, seed=7)

    monkeypatch.setattr(voice_routes, "clone_voice", clone)
    options = ServerOptions(voices_dir=str(tmp_path))
    async with fake_server(options) as a, fake_server(options) as b, \
            aiohttp.ClientSession() as s:
        # a bad file written after the start fails no request (at start-up it stops the
        # server with its reason, by design)
        (tmp_path / "broken.json").write_text("{half a file")
        assert (await _post(s, a.url, b"clip", "guest"))[0] == 200
        async with s.get(f"{b.url}/v1/voices") as r:
            assert [v["name"] for v in (await r.json())["saved"]] == ["guest"]
        async with s.post(f"{b.url}/v1/audio/speech",
                          json={"input": "Hello.", "voice": "guest"}) as r:
            assert r.status == 200, await r.text()
        async with s.post(f"{b.url}/v1/audio/speech",
                          json={"input": "Hello.", "voice": "broken"}) as r:
            assert r.status == 400 and (await r.json())["error"]["code"] == "bad_request"
        status, body = await _post(s, b.url, b"clip", "guest")
        assert status == 409 and body["error"]["code"] == "voice_exists"
