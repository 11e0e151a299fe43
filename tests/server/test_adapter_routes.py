"""LoRA adapters on a server (``VEENA_ADAPTERS_DIR``): served at start (a bad one skipped),
listed in ``/v1/voices``, added and removed by the admin route behind the API key, kept in
step with the folder another replica shares, counted per adapter in the metrics; a bad
adapter is a 4xx with the reason while a stream keeps speaking."""

import asyncio
import json
import os
import shutil

import aiohttp
import pytest
from livekit.agents import APIStatusError

from livekit.plugins import veena

from livekit.plugins.veena.models.adapters import CONFIG_FILE
from livekit.plugins.veena.models.loading import load_pipeline
from livekit.plugins.veena.models.tiny_model import make_random_adapter
from livekit.plugins.veena.pipeline.options import PipelineOptions
from livekit.plugins.veena.server.app import ServerOptions
from livekit.plugins.veena.server.served_adapters import REMOVED, load_folder
from livekit.plugins.veena.server.state import STATE_KEY

from ..helpers import tiny_engine_options
from ..servers import API_KEY, hear_context, metric, poll_until, serve_app

pytestmark = pytest.mark.engine  # starts a LoRA engine of its own

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _bad(good, to):
    """``good``'s files with a config that says rank 4 (its tensors are rank 8)."""
    shutil.copytree(good, to)
    config = json.loads((to / CONFIG_FILE).read_text())
    (to / CONFIG_FILE).write_text(json.dumps({**config, "r": 4}))
    return to


async def _speak(session, url, voice, max_tokens=56, text="Hello there, friend."):
    """One context to its end over a WebSocket: (final event, audio bytes heard)."""
    async with session.ws_connect(url.replace("http", "ws") + "/v1/stream",
                                  headers=AUTH) as ws:
        await ws.send_json({"type": "speak", "context_id": "c", "text": text,
                            "continue": False, "voice": voice,
                            "sampling": {"max_tokens": max_tokens}})
        return await hear_context(ws)


async def test_adapters_from_the_folder_and_the_admin_route(tiny_model_dir, tmp_path):
    root = tmp_path / "adapters"
    good = make_random_adapter(root / "acme", tiny_model_dir, rank=8, seed=1)
    _bad(good, root / "broken")
    pipeline = load_pipeline(tiny_model_dir, options=PipelineOptions(),
                             engine_options=tiny_engine_options(tiny_model_dir, 8, max_loras=1))
    load_folder(pipeline, str(root))  # as run_server does, before the engine starts
    assert pipeline.engine.adapters.names == ("acme",)  # the broken one skipped, not fatal
    await pipeline.start()
    options = ServerOptions(api_key=API_KEY, adapters_dir=str(root), adapters_refresh_s=3600)
    try:
        async with serve_app(pipeline, options) as (url, app), aiohttp.ClientSession() as s:
            async with s.get(url + "/v1/voices", headers=AUTH) as r:
                assert (await r.json())["adapters"] == [{"name": "acme", "rank": 8}]
            event, heard = await _speak(s, url, "acme")
            assert event["type"] == "done" and heard > 0

            async def post(body, headers=AUTH):
                async with s.post(url + "/v1/adapters", json=body, headers=headers) as r:
                    return r.status, (await r.json())

            # a stream speaks while bad adapters are refused
            speaking = asyncio.create_task(_speak(s, url, "kavya", max_tokens=280))
            _bad(good, root / "bad")
            status, body = await post({"name": "bad"})
            assert status == 400 and body["error"]["code"] == "bad_adapter"
            assert "has shape" in body["error"]["message"]
            for bad, code, http in (({"name": "../etc"}, "bad_field", 400),
                                    ({"name": "acme", "hub_id": "../../x"}, "bad_field", 400),
                                    ({"name": "nothere"}, "not_found", 404),
                                    ({"name": "kavya"}, "voice_exists", 409),
                                    ({"name": "acme"}, "adapter_exists", 409),
                                    ([1, 2], "bad_json", 400)):
                status, body = await post(bad)
                assert (status, body["error"]["code"]) == (http, code), bad
            assert (await post({"name": "bad"}, headers={}))[0] == 401
            event, heard = await speaking
            assert event["type"] == "done" and heard > 0

            make_random_adapter(root / "bravo", tiny_model_dir, rank=4, alpha=8, seed=2)
            status, body = await post({"name": "bravo"})
            assert status == 201 and body["rank"] == 4 and body["lora_int_id"] >= 2
            # counted per adapter while it speaks, back to zero after
            bravo = asyncio.create_task(_speak(s, url, "bravo", max_tokens=700))
            await poll_until(lambda: metric(s, url, 'veena_adapter_streams{adapter="bravo"}'),
                             "a bravo stream counted")
            event, _ = await bravo
            assert event["type"] == "done"
            assert await metric(s, url, 'veena_adapter_streams{adapter="bravo"}') == 0

            # removed while a stream holds it, queued behind max_loras=1 (vLLM reads its files
            # when it schedules it) with later chunks to come: that stream finishes with it,
            # new ones are refused, and the engine lives on
            acme = asyncio.create_task(_speak(s, url, "acme", max_tokens=700))
            await poll_until(lambda: metric(s, url, 'veena_adapter_streams{adapter="acme"}'),
                             "an acme stream counted")
            held = asyncio.create_task(_speak(
                s, url, "bravo", max_tokens=56, text="Hello there, my friend. How are you? "
                "It is good to hear you again. Goodbye for now."))
            await poll_until(lambda: metric(s, url, 'veena_adapter_streams{adapter="bravo"}'),
                             "a bravo stream counted")
            adapters = pipeline.engine.adapters
            adapters.free_after_s = 0
            bravo_files = adapters.get("bravo")
            async with s.delete(url + "/v1/adapters/bravo", headers=AUTH) as r:
                assert r.status == 200
            assert adapters.held(bravo_files) and os.path.isdir(bravo_files.path)
            assert not (root / "bravo").exists()
            assert [p.name.split("-")[0] for p in (root / REMOVED).iterdir()] == ["bravo"]
            event, _ = await _speak(s, url, "bravo")
            assert event["type"] == "error" and "unknown voice 'bravo'" in event["message"]
            for stream in (held, acme):
                event, heard = await stream
                assert event["type"] == "done" and heard > 0, event
            assert pipeline.engine.health.state == "ready"
            assert not os.path.exists(bravo_files.path)  # freed after the last holder
            async with s.delete(url + "/v1/adapters/bravo", headers=AUTH) as r:
                assert r.status == 404

            # another replica added one and removed one in the shared folder
            make_random_adapter(root / "carol", tiny_model_dir, rank=8, seed=3)
            shutil.move(root / "acme", tmp_path / "acme-elsewhere")
            await app[STATE_KEY].adapters.refresh()
            assert pipeline.engine.adapters.names == ("carol",)
            event, heard = await _speak(s, url, "carol")
            assert event["type"] == "done" and heard > 0
            # the plugin through the server names it as its voice too (the server resolves it)
            remote = veena.TTS(base_url=url.replace("http", "ws"), api_key=API_KEY,
                               voice="carol", max_tokens_per_chunk=56)
            try:
                audio = await remote.synthesize("Hello there.").collect()
                assert audio.samples_per_channel > 0
                with pytest.raises(APIStatusError, match="unknown voice 'nobody'"):
                    remote.update_options(voice="nobody")
                    await remote.synthesize("Hello there.").collect()
            finally:
                await remote.aclose()
            # the OpenAI route names it as its voice too
            async with s.post(url + "/v1/audio/speech", headers=AUTH, json={
                    "input": "Hello there.", "voice": "carol", "response_format": "pcm",
                    "sampling": {"max_tokens": 56}}) as r:
                assert r.status == 200 and len(await r.read()) > 0
    finally:
        await pipeline.aclose()
