"""The adapters folder and its admin routes without an engine: files replaced in place are
checked again and served under a new id, hostile files are one logged refusal (never a dead
refresh, a 500 or a failed start), a removed link really goes, and concurrent or repeated
removals and failed downloads leave the folder usable. The engine is never started here:
registration and the routes need none."""

import asyncio
import json
import os
import shutil

import aiohttp
import pytest

from livekit.plugins.veena.models.adapters import CONFIG_FILE
from livekit.plugins.veena.models.loading import load_pipeline
from livekit.plugins.veena.models.tiny_model import make_random_adapter
from livekit.plugins.veena.server.app import CONFIG_ERROR_EXIT_CODE, ServerOptions, run_server
from livekit.plugins.veena.server.served_adapters import REMOVED, ServedAdapters, load_folder
from livekit.plugins.veena.server.state import STATE_KEY

from ..servers import API_KEY, serve_app

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture()
def unstarted(tiny_model_dir):
    """A pipeline whose engine never starts; its adapters' copies are freed at once."""
    pipeline = load_pipeline(tiny_model_dir)
    pipeline.engine.adapters.free_after_s = 0
    return pipeline


def _config(folder, **changes):
    config = json.loads((folder / CONFIG_FILE).read_text())
    (folder / CONFIG_FILE).write_text(json.dumps({**config, **changes}))


async def test_files_replaced_in_place_are_checked_again_under_a_new_id(
        unstarted, tiny_model_dir, tmp_path):
    root = tmp_path / "adapters"
    make_random_adapter(root / "acme", tiny_model_dir, rank=8, seed=1)
    load_folder(unstarted, str(root))
    adapters = unstarted.engine.adapters
    old = adapters.get("acme")
    adapters.hold(old)  # a stream speaking with the first files
    make_random_adapter(root / "acme", tiny_model_dir, rank=8, seed=2)  # rewritten in place
    served = ServedAdapters(str(root), unstarted)
    await served.refresh()
    new = adapters.get("acme")
    assert new.int_id != old.int_id and new.path != old.path
    assert (root / "acme" / "adapter_model.safetensors").read_bytes() == (
        open(os.path.join(new.path, "adapter_model.safetensors"), "rb").read())
    assert adapters.usable(old) and os.path.isdir(old.path)  # the stream finishes with it
    adapters.release(old)
    assert not os.path.exists(old.path)
    # new files that fail their check are refused; the checked copy stays served
    _config(root / "acme", r=4)
    await served.refresh()
    await served.refresh()  # (not checked again until the files change)
    assert adapters.get("acme") == new and os.path.isdir(new.path)
    assert "acme" in served.failed


async def test_hostile_adapter_files_are_refused_not_raised(unstarted, tiny_model_dir,
                                                            tmp_path, caplog):
    """A huge lora_alpha (OverflowError), nested JSON (RecursionError), a value vLLM's own
    check chokes on: each a logged refusal at start and in the refresh task."""
    root = tmp_path / "adapters"
    good = make_random_adapter(root / "acme", tiny_model_dir, rank=8, seed=1)
    shutil.copytree(good, root / "huge")
    _config(root / "huge", lora_alpha=10**400)
    shutil.copytree(good, root / "deep")
    (root / "deep" / CONFIG_FILE).write_text("[" * 200_000 + "]" * 200_000)
    shutil.copytree(good, root / "pissa")
    _config(root / "pissa", init_lora_weights="pissa")
    load_folder(unstarted, str(root))
    assert unstarted.engine.adapters.names == ("acme",)
    unstarted.engine.adapters.remove("acme")
    await ServedAdapters(str(root), unstarted).refresh()
    assert unstarted.engine.adapters.names == ("acme",)
    refused = {r.adapter for r in caplog.records if r.getMessage().startswith(
        "adapter not served")}
    assert refused == {"huge", "deep", "pissa"}


def test_a_server_whose_adapters_folder_is_missing_exits_as_misconfigured(
        tiny_model_dir, tmp_path, monkeypatch):
    """Exit 2, as any bad setting: 3 tells the supervisor the engine died."""
    monkeypatch.setenv("VEENA_ADAPTERS_DIR", str(tmp_path / "nowhere"))
    assert run_server(tiny_model_dir, profile=None, host="127.0.0.1",
                      port=0) == CONFIG_ERROR_EXIT_CODE


async def test_removing_a_linked_folder_really_removes_it(unstarted, tiny_model_dir,
                                                         tmp_path):
    root = tmp_path / "adapters"
    root.mkdir()
    target = make_random_adapter(tmp_path / "elsewhere" / "acme", tiny_model_dir, seed=1)
    (root / "acme").symlink_to(target, target_is_directory=True)
    load_folder(unstarted, str(root))
    options = ServerOptions(api_key=API_KEY, adapters_dir=str(root), adapters_refresh_s=3600)
    async with serve_app(unstarted, options) as (url, app), aiohttp.ClientSession() as s:
        async with s.delete(url + "/v1/adapters/acme", headers=AUTH) as r:
            assert r.status == 200 and (await r.json())["removed"] is True
        await app[STATE_KEY].adapters.refresh()
    assert "acme" not in unstarted.engine.adapters  # not served again by the refresh
    assert not os.path.lexists(root / "acme") and (target / CONFIG_FILE).is_file()
    (moved,) = (root / REMOVED).iterdir()
    assert moved.is_symlink()  # the link moved; what it points at is the owner's


async def test_removals_and_downloads_never_trip_over_each_other(unstarted, tiny_model_dir,
                                                                 tmp_path, monkeypatch):
    """Two DELETEs at once (was KeyError: 500), two removals of one name in one second (was
    one ``.removed`` name: 500), a failed hub download (was a partial folder: 409 ever
    after)."""
    import huggingface_hub.constants

    root = tmp_path / "adapters"
    good = make_random_adapter(tmp_path / "good", tiny_model_dir, rank=8, seed=1)
    root.mkdir()
    options = ServerOptions(api_key=API_KEY, adapters_dir=str(root), adapters_refresh_s=3600)
    async with serve_app(unstarted, options) as (url, _), aiohttp.ClientSession() as s:
        async def call(method, path, body=None):
            async with s.request(method, url + path, json=body, headers=AUTH) as r:
                return r.status, await r.json()

        for _ in range(2):  # removed twice within a second
            shutil.copytree(good, root / "acme")
            status, body = await call("POST", "/v1/adapters", {"name": "acme"})
            assert status == 201, body
            both = await asyncio.gather(call("DELETE", "/v1/adapters/acme"),
                                        call("DELETE", "/v1/adapters/acme"))
            assert sorted(status for status, _ in both) == [200, 404]
        assert len(list((root / REMOVED).iterdir())) == 2
        # a download that fails leaves nothing behind: the next try is not "already exists"
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        for _ in range(2):
            status, body = await call("POST", "/v1/adapters",
                                      {"name": "bravo", "hub_id": "test/bravo"})
            assert status == 502 and body["error"]["code"] == "download_failed", body
        assert sorted(p.name for p in root.iterdir()) == [REMOVED]
        # a body nested too deep for the JSON parser is a 400, not a 500
        async with s.post(url + "/v1/adapters", data="[" * 20_000 + "]" * 20_000,
                          headers={**AUTH, "Content-Type": "application/json"}) as r:
            assert r.status == 400 and (await r.json())["error"]["code"] == "bad_json"


async def test_a_refresh_never_drops_what_a_post_registers_meanwhile(unstarted, tiny_model_dir,
                                                                     tmp_path, monkeypatch):
    """A refresh that listed the folder before a POST's adapter arrived must not drop it when
    it goes on: the POST waits for the folder lock (it registered beside the refresh, which
    then dropped the adapter as 'folder gone')."""
    import threading

    from livekit.plugins.veena.server import served_adapters

    root = tmp_path / "adapters"
    root.mkdir()
    listed, go_on = threading.Event(), threading.Event()
    real_folders = served_adapters.adapter_folders

    def stale_listing(path):  # the refresh's listing, taken before the adapter arrives
        found = real_folders(path)
        listed.set()
        assert go_on.wait(60), "hang guard"
        return found

    options = ServerOptions(api_key=API_KEY, adapters_dir=str(root), adapters_refresh_s=3600)
    async with serve_app(unstarted, options) as (url, app), aiohttp.ClientSession() as s:
        folder = app[STATE_KEY].adapters
        monkeypatch.setattr(served_adapters, "adapter_folders", stale_listing)
        refresh = asyncio.ensure_future(folder.refresh())
        await asyncio.get_running_loop().run_in_executor(None, listed.wait, 60)
        monkeypatch.setattr(served_adapters, "adapter_folders", real_folders)
        make_random_adapter(root / "acme", tiny_model_dir, rank=8, seed=1)

        async def post():
            async with s.post(url + "/v1/adapters", json={"name": "acme"}, headers=AUTH) as r:
                return r.status, await r.json()

        posted = asyncio.ensure_future(post())
        # let the refresh go on once the POST has either registered or queued on the lock
        while not posted.done() and not getattr(folder.lock, "_waiters", None):
            await asyncio.sleep(0.01)
        go_on.set()
        await refresh
        status, body = await posted
        assert status == 201, body
        assert "acme" in unstarted.engine.adapters
        await folder.refresh()  # and the next refresh keeps it
        assert "acme" in unstarted.engine.adapters
