"""Adapter ids and copies: vLLM caches an adapter by its int id alone, so an id must be the
same in every process that shares an engine core and never name other weights; vLLM reads
the checked copy, never the user's folder. No engine starts here."""

import subprocess
import sys
from pathlib import Path

from livekit.plugins.veena.models.adapter_files import (CONFIG_FILE, WEIGHTS_FILE, adapter_id,
                                                       copy_files, discard)
from livekit.plugins.veena.models.adapters import register_adapter
from livekit.plugins.veena.models.tiny_model import make_random_adapter
from livekit.plugins.veena.pipeline.adapters import MAX_ADAPTER_ID
from livekit.plugins.veena.pipeline.engine import EngineOptions, VllmEngine


def test_two_front_ends_give_two_adapters_two_ids_and_one_adapter_one(tiny_model_dir,
                                                                      tmp_path):
    """Two front ends of one core (``serve --workers 2 --shared-engine``) each register an
    adapter of their own: counted per process, both were id 1, and the core served the first
    one loaded for both."""
    acme = make_random_adapter(tmp_path / "acme", tiny_model_dir, rank=8, seed=1)
    bravo = make_random_adapter(tmp_path / "bravo", tiny_model_dir, rank=8, seed=2)
    first, second = (VllmEngine(EngineOptions(model=tiny_model_dir)) for _ in range(2))
    a = register_adapter(first, "acme", str(acme), tiny_model_dir)
    b = register_adapter(second, "bravo", str(bravo), tiny_model_dir)
    assert a.int_id != b.int_id
    again = register_adapter(second, "acme", str(acme), tiny_model_dir)
    assert again.int_id == a.int_id and again.path != str(acme)  # vLLM reads our copy
    assert (Path(again.path) / WEIGHTS_FILE).read_bytes() == (acme / WEIGHTS_FILE).read_bytes()
    # the same files under another name, or other files under the same name: other ids
    twin = register_adapter(first, "twin", str(acme), tiny_model_dir)
    assert len({a.int_id, b.int_id, twin.int_id}) == 3
    second.adapters.remove("acme")
    assert Path(a.path).is_dir()  # the first front end's copy is its own
    make_random_adapter(acme, tiny_model_dir, rank=8, seed=3)  # new weights, same folder
    assert register_adapter(second, "acme", str(acme), tiny_model_dir).int_id != a.int_id
    assert all(1 <= x.int_id <= MAX_ADAPTER_ID for x in (a, b, twin))


def test_an_id_is_the_same_in_another_process(tiny_model_dir, tmp_path):
    acme = make_random_adapter(tmp_path / "acme", tiny_model_dir, rank=8, seed=1)
    copy, digest = copy_files(acme)
    try:
        here = adapter_id("acme", digest)
        assert sorted(p.name for p in copy.iterdir()) == sorted([CONFIG_FILE, WEIGHTS_FILE])
    finally:
        discard(copy)
    there = subprocess.run(
        [sys.executable, "-c", "import sys\n"
         "from livekit.plugins.veena.models.adapter_files import adapter_id, copy_files\n"
         "copy, digest = copy_files(__import__('pathlib').Path(sys.argv[1]))\n"
         "print(adapter_id('acme', digest))", str(acme)],
        capture_output=True, text=True, timeout=600, check=True)
    assert int(there.stdout.split()[-1]) == here
