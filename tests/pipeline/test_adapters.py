"""The engine's adapter set: an adapter's files stay while any request or turn holds it, a
removed adapter serves only those already holding it, and its own copy is freed after the
last of them. No engine starts here."""

import asyncio

import pytest

from livekit.plugins.veena.pipeline.adapters import MAX_ADAPTER_ID, Adapter, AdapterSet


def _adapter(tmp_path, name="acme", int_id=7) -> Adapter:
    path = tmp_path / f"{name}-{int_id}"
    path.mkdir()
    (path / "adapter_config.json").write_text("{}")
    return Adapter(name, int_id, str(path), 8, 16.0, owned=True)


def test_a_removed_adapter_serves_its_holders_until_the_last_lets_go(tmp_path):
    adapters = AdapterSet()
    acme = adapters.add(_adapter(tmp_path))
    adapters.hold(acme)  # a turn speaking with it
    adapters.hold(acme)  # one of its requests
    adapters.remove("acme")
    assert "acme" not in adapters and adapters.get("acme") is None  # new streams: refused
    assert adapters.usable(acme)  # the turn's later chunks: still served
    adapters.hold(acme)  # its next chunk
    adapters.release(acme)
    adapters.release(acme)
    assert adapters.usable(acme) and (tmp_path / "acme-7").is_dir()
    adapters.release(acme)  # the last holder: the copy goes
    assert not adapters.usable(acme) and not (tmp_path / "acme-7").exists()
    with pytest.raises(ValueError, match="not registered"):
        adapters.hold(acme)


def test_an_adapter_not_held_is_freed_when_removed_and_files_are_replaced(tmp_path):
    adapters = AdapterSet()
    old = adapters.add(_adapter(tmp_path, int_id=1))
    adapters.hold(old)
    new = _adapter(tmp_path, int_id=2)
    assert adapters.replace(new) == old
    assert adapters.get("acme") == new and adapters.usable(old)
    adapters.release(old)
    assert not (tmp_path / "acme-1").exists() and (tmp_path / "acme-2").is_dir()
    adapters.remove("acme")  # nothing holds it: freed at once
    assert not (tmp_path / "acme-2").exists()


def test_the_same_files_registered_again_are_never_freed_under_a_holder(tmp_path):
    """Removed and added again (the same name and bytes: the same id and copy) while a
    request still held it: its release must not free what is served again."""
    adapters = AdapterSet()
    acme = adapters.add(_adapter(tmp_path))
    adapters.hold(acme)
    adapters.remove("acme")
    adapters.add(acme)
    adapters.release(acme)
    assert adapters.usable(acme) and (tmp_path / "acme-7").is_dir()


async def test_on_a_running_loop_the_copy_is_freed_a_moment_later(tmp_path):
    """An abort reaches vLLM's core just after our request ends: the files stay a moment."""
    adapters = AdapterSet(free_after_s=0.05)
    acme = adapters.add(_adapter(tmp_path))
    adapters.remove("acme")
    assert (tmp_path / "acme-7").is_dir()
    for _ in range(200):  # a hang guard, not a timing assertion
        if not (tmp_path / "acme-7").exists():
            break
        await asyncio.sleep(0.05)
    assert not (tmp_path / "acme-7").exists()


def test_ids_are_vllm_ids():
    adapters = AdapterSet()
    for bad in (0, -1, MAX_ADAPTER_ID + 1, True, 1.0):
        with pytest.raises(ValueError, match="adapter id"):
            adapters.add(Adapter("acme", bad, "/a", 8, 16.0))
    adapters.add(Adapter("acme", MAX_ADAPTER_ID, "/a", 8, 16.0))
