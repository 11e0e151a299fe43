"""Proof that an adapter voice is applied: the product speaking with LoRA adapter A equals,
token for token, the base model with A merged into its weights as PEFT defines the merge
(``W + lora_alpha / r * B @ A``, written here); without the adapter it differs; three streams
in one engine batch (adapter A, adapter B, a base voice) each equal their own model alone.

The merged models speak through a ZERO adapter (A's shapes, B all zeros: it adds nothing)
registered under the same name, so both sides build the same prompt (``<spk_acme> ...``) on
the same code path. Every engine here runs float32, so merged and unmerged weights round
alike. Two adapters of different ranks (8 and 4) on all seven projections."""

import asyncio
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from livekit.plugins.veena import cli
from livekit.plugins.veena.models.adapters import CONFIG_FILE, WEIGHTS_FILE
from livekit.plugins.veena.models.loading import load_pipeline
from livekit.plugins.veena.models.tiny_model import make_random_adapter
from livekit.plugins.veena.pipeline.options import PipelineOptions
from livekit.plugins.veena.voices.call_voice import resolve_voice

from ..helpers import tiny_engine_options

pytestmark = pytest.mark.engine

TEXT = "A voice of its own."
SEED = 7
MAX_TOKENS = 140  # 20 frames: enough to tell models apart, little CPU


def merge(base: str, adapter: Path, out: Path) -> Path:
    """PEFT's merge, by its definition: each target weight ``W`` becomes
    ``W + lora_alpha / r * B @ A``; everything else is copied."""
    shutil.copytree(base, out)
    config = json.loads((adapter / CONFIG_FILE).read_text())
    scale = config["lora_alpha"] / config["r"]
    weights = load_file(str(out / "model.safetensors"))
    lora = load_file(str(adapter / WEIGHTS_FILE))
    merged = 0
    for key, a in lora.items():
        if not key.endswith(".lora_A.weight"):
            continue
        target = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight") + ".weight"
        b = lora[key.replace("lora_A", "lora_B")]
        weights[target] = weights[target] + scale * (b @ a)
        merged += 1
    assert merged == 2 * 7  # two layers, seven projections
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora")
    return {
        "A": make_random_adapter(root / "A", tiny_model_dir, rank=8, alpha=16, seed=1),
        "B": make_random_adapter(root / "B", tiny_model_dir, rank=4, alpha=8, seed=2),
        "zero8": make_random_adapter(root / "zero8", tiny_model_dir, rank=8, alpha=16, seed=3,
                                     zero=True),
        "zero4": make_random_adapter(root / "zero4", tiny_model_dir, rank=4, alpha=8, seed=3,
                                     zero=True),
    }


def _f32_pipeline(model: str, lora: dict[str, Path]):
    return load_pipeline(model, engine_options=tiny_engine_options(model, 8, dtype="float32"),
                         options=PipelineOptions(),
                         lora={name: str(p) for name, p in lora.items()})


@pytest.fixture(scope="module")
async def with_adapters(tiny_model_dir, adapters):
    """The base model serving adapters A (as ``acme``) and B (as ``bravo``)."""
    p = _f32_pipeline(tiny_model_dir, {"acme": adapters["A"], "bravo": adapters["B"]})
    await p.start()
    yield p
    await p.aclose()


@pytest.fixture(scope="module")
async def solo(tiny_model_dir, adapters, tmp_path_factory):
    """Each merged model alone, speaking its voice through a ZERO adapter of its name:
    {voice: codes}."""
    root = tmp_path_factory.mktemp("merged")
    out = {}
    for voice, adapter, zero in (("acme", "A", "zero8"), ("bravo", "B", "zero4")):
        merged = merge(tiny_model_dir, adapters[adapter], root / adapter)
        p = _f32_pipeline(str(merged), {voice: adapters[zero]})
        await p.start()
        try:
            out[voice] = await _codes(p, voice)
        finally:
            await p.aclose()
    return out


async def _codes(p, voice: str) -> np.ndarray:
    """The audio codes ``voice`` speaks ``TEXT`` with, resolved as every surface does."""
    v = resolve_voice(p.profile, voice, adapters=p.engine.adapters.names)
    sampling = replace(p.sampling.defaults(), max_tokens=MAX_TOKENS)
    syn = p.synthesize(TEXT, voice=v.voice, adapter=v.adapter, sampling=sampling, seed=SEED)
    await syn.collect()
    return np.stack(syn.tracks[0].steps)


async def test_an_adapter_voice_speaks_as_its_merged_model(with_adapters, solo):
    acme = await _codes(with_adapters, "acme")
    assert len(acme) >= 10
    assert np.array_equal(acme, solo["acme"])
    # the same prompt, the same seed, without the adapter: the base model's own tokens
    p = with_adapters
    prompt = p.family.prompt(p.engine.tokenizer, TEXT, "acme", None, ("acme",))
    sampling = p.family.constrain(replace(p.sampling.defaults(), max_tokens=MAX_TOKENS,
                                          seed=SEED), p.table)
    with_a, without = [], []
    async for ids in p.engine.generate(prompt, sampling, adapter=p.engine.adapters.get("acme")):
        with_a += ids
    async for ids in p.engine.generate(prompt, sampling):
        without += ids
    assert with_a != without


async def test_three_streams_in_one_batch_each_equal_their_own_model_alone(with_adapters, solo):
    p = with_adapters
    base_alone = await _codes(p, "kavya")
    in_flight: list[int] = []

    async def watch():
        while True:
            in_flight.append(len(p.engine.live_request_ids))
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    try:
        acme, bravo, base = await asyncio.gather(*(_codes(p, v)
                                                   for v in ("acme", "bravo", "kavya")))
    finally:
        watcher.cancel()
    assert max(in_flight) == 3  # all three ran in the engine's steps together
    assert np.array_equal(acme, solo["acme"])
    assert np.array_equal(bravo, solo["bravo"])
    assert np.array_equal(base, base_alone)
    assert not np.array_equal(acme[:10], bravo[:10]) and not np.array_equal(acme[:10],
                                                                           base[:10])


def test_say_with_an_adapter_writes_the_merged_models_samples(tiny_model_dir, adapters,
                                                             tmp_path, monkeypatch):
    """The issue's own check: ``say --lora acme=ADAPTER`` on M equals ``say --lora
    acme=ZERO`` on MERGED. (That it differs from ``--lora acme=ZERO`` on M follows: the
    merged model speaks other tokens than M, shown by the first test of this module; a
    third ``say`` would be a third engine start for it.)"""
    monkeypatch.setenv("VEENA_DTYPE", "float32")
    # the fixed ramp and windowed decodes: the audio depends on the tokens alone, not on
    # when they arrived, so equal tokens write equal samples
    monkeypatch.setenv("VEENA_ADAPTIVE_WINDOWS", "0")
    monkeypatch.setenv("VEENA_SNAC_STREAMING", "0")
    merged = merge(tiny_model_dir, adapters["A"], tmp_path / "merged")

    def say(model, adapter, out):
        code = cli.main(["say", TEXT, "--model", str(model), "--lora", f"acme={adapter}",
                         "--voice", "acme", "--seed", str(SEED), "--max-tokens",
                         str(MAX_TOKENS), "-o", str(tmp_path / out)])
        assert code == 0
        return (tmp_path / out).read_bytes()

    assert say(tiny_model_dir, adapters["A"], "a.wav") == say(merged, adapters["zero8"],
                                                             "merged.wav")
