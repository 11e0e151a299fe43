"""LoRA adapters are checked against the base model before anything is registered: every way
an adapter can be wrong is one clear ``AdapterError`` (a ``ValueError`` in the plugin, exit 2
from the command line), and nothing of it reaches the engine. No engine starts here."""

import json
import math
import os
from pathlib import Path

import pytest
from livekit.plugins import veena
from safetensors.torch import load_file, save_file

from livekit.plugins.veena import cli
from livekit.plugins.veena.models.adapters import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    AdapterError,
    check_adapter,
    parse_lora_specs,
    register_adapter,
)
from livekit.plugins.veena.models.loading import load_pipeline, serve_adapters
from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.models.tiny_model import make_random_adapter
from livekit.plugins.veena.pipeline.adapters import Adapter, AdapterSet, lora_rank_for
from livekit.plugins.veena.pipeline.engine import EngineOptions, VllmEngine
from livekit.plugins.veena.pipeline.engine_args import with_adapters
from livekit.plugins.veena.voices.call_voice import resolve_voice
from livekit.plugins.veena.voices.files import VoiceFile, VoiceFileError, parse_voice


@pytest.fixture(scope="module")
def good(tiny_model_dir, tmp_path_factory) -> Path:
    return make_random_adapter(tmp_path_factory.mktemp("acme"), tiny_model_dir, rank=8, seed=1)


def _copy(good: Path, to: Path, config=None, tensors=None) -> Path:
    to.mkdir()
    cfg = json.loads((good / CONFIG_FILE).read_text())
    (to / CONFIG_FILE).write_text(json.dumps(config(cfg) if config else cfg))
    weights = load_file(str(good / WEIGHTS_FILE))
    save_file(tensors(weights) if tensors else weights, str(to / WEIGHTS_FILE))
    return to


def test_a_good_adapter_passes_with_its_rank_alpha_and_targets(good, tiny_model_dir):
    checked = check_adapter("acme", str(good), tiny_model_dir)
    assert (checked.rank, checked.alpha) == (8, 16.0)
    assert set(checked.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj",
                                           "gate_proj", "up_proj", "down_proj"}


def _first(weights, side="A"):
    return next(k for k in weights if k.endswith(f"lora_{side}.weight"))


BAD = {
    "a rank past vLLM's largest": (
        lambda c: {**c, "r": 1024}, None, "rank r must be an int in \\[1, 512\\]"),
    "a bool rank": (lambda c: {**c, "r": True}, None, "rank r must be an int"),
    "a NaN alpha": (lambda c: {**c, "lora_alpha": math.nan}, None, "lora_alpha must be a number"),
    "an unsupported target": (
        lambda c: {**c, "target_modules": ["q_proj", "embed_tokens"]}, None,
        "unsupported target modules \\['embed_tokens'\\]"),
    "DoRA": (lambda c: {**c, "use_dora": True}, None, "use_dora is not supported"),
    "trained embeddings": (lambda c: {**c, "modules_to_save": ["lm_head"]}, None,
                           "modules_to_save is not supported"),
    "another kind of PEFT": (lambda c: {**c, "peft_type": "IA3"}, None, "is not LORA"),
    "a wrong base (its shapes)": (
        None, lambda w: {k: (v[:, :64].contiguous() if k.endswith("q_proj.lora_A.weight") else v)
                         for k, v in w.items()},
        "has shape \\(8, 64\\), the base model needs \\(8, 128\\)"),
    "a layer the base lacks": (
        None, lambda w: {**w, "base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight":
                         w[_first(w)].clone()}, "the base model has 2 layers"),
    "an unpaired lora_A": (
        None, lambda w: {k: v for k, v in w.items() if k != _first(w, "B")},
        "must come in pairs"),
    "a NaN weight": (
        None, lambda w: {k: (v * math.nan if k == _first(w) else v) for k, v in w.items()},
        "NaN or infinite"),
    # what vLLM's own PEFTHelper refuses inside the engine core, where a refusal is fatal
    "no lora_alpha": (lambda c: {k: v for k, v in c.items() if k != "lora_alpha"}, None,
                      "lora_alpha is missing"),
    **{f"init {init}": (lambda c, init=init: {**c, "init_lora_weights": init}, None,
                        "vLLM refuses this adapter: vLLM does not support init_lora_weights")
       for init in ("pissa", "olora", "loftq", "corda")},
    "layer replication": (lambda c: {**c, "layer_replication": [[0, 2]]}, None,
                          "does not support layer_replication"),
    "QALoRA": (lambda c: {**c, "use_qalora": True}, None, "does not support QALoRA"),
    "aLoRA": (lambda c: {**c, "alora_invocation_tokens": [1, 2]}, None,
              "does not support Activated LoRA"),
    "a wrongly typed field": (lambda c: {**c, "use_rslora": "yes", "lora_bias": [1]}, None,
                              "vLLM refuses this adapter"),
    # values that made the parsers raise something other than AdapterError
    "a huge alpha": (lambda c: {**c, "lora_alpha": 10**400}, None, "lora_alpha must be a number"),
    "an infinite alpha": (lambda c: {**c, "lora_alpha": math.inf}, None,
                          "lora_alpha must be a number"),
    "a foreign tensor": (
        None, lambda w: {**w, "base_model.model.lm_head.weight": w[_first(w)].clone()},
        "unexpected tensor"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_every_bad_adapter_is_one_clear_error(case, good, tiny_model_dir, tmp_path):
    config, tensors, says = BAD[case]
    bad = _copy(good, tmp_path / "bad", config, tensors)
    with pytest.raises(AdapterError, match=says):
        check_adapter("acme", str(bad), tiny_model_dir)


def test_missing_or_corrupt_files_are_clear_errors(good, tiny_model_dir, tmp_path):
    with pytest.raises(AdapterError, match="no adapter folder"):
        check_adapter("acme", str(tmp_path / "nowhere"), tiny_model_dir)
    no_config = _copy(good, tmp_path / "no-config")
    (no_config / CONFIG_FILE).unlink()
    with pytest.raises(AdapterError, match="has no adapter_config.json"):
        check_adapter("acme", str(no_config), tiny_model_dir)
    bad_json = _copy(good, tmp_path / "bad-json")
    (bad_json / CONFIG_FILE).write_text("{not json")
    with pytest.raises(AdapterError, match="not readable JSON"):
        check_adapter("acme", str(bad_json), tiny_model_dir)
    truncated = _copy(good, tmp_path / "truncated")
    data = (truncated / WEIGHTS_FILE).read_bytes()
    (truncated / WEIGHTS_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(AdapterError, match="not a readable safetensors file"):
        check_adapter("acme", str(truncated), tiny_model_dir)
    nested = _copy(good, tmp_path / "nested")
    (nested / CONFIG_FILE).write_text("[" * 200_000 + "]" * 200_000)  # RecursionError
    with pytest.raises(AdapterError, match="not readable JSON"):
        check_adapter("acme", str(nested), tiny_model_dir)
    pickled = _copy(good, tmp_path / "pickled")
    (pickled / WEIGHTS_FILE).rename(pickled / "adapter_model.bin")
    with pytest.raises(AdapterError, match="convert it to safetensors"):
        check_adapter("acme", str(pickled), tiny_model_dir)


def test_a_rank_above_an_explicit_max_lora_rank_is_refused_before_the_start(
        good, tiny_model_dir):
    """``VEENA_MAX_LORA_RANK`` set: the engine starts with it, so an adapter above it is
    refused at registration, not by the core as it loads the adapter."""
    with pytest.raises(AdapterError, match="greater than max_lora_rank 1"):
        check_adapter("acme", str(good), tiny_model_dir, max_lora_rank=1)
    engine = VllmEngine(EngineOptions(model=tiny_model_dir, max_lora_rank=1))
    with pytest.raises(AdapterError, match="greater than max_lora_rank 1"):
        register_adapter(engine, "acme", str(good), tiny_model_dir)
    assert not engine.adapters
    assert register_adapter(VllmEngine(EngineOptions(model=tiny_model_dir)), "acme",
                            str(good), tiny_model_dir).rank == 8  # unset: sized to fit


def test_lora_specs_are_name_equals_location():
    assert parse_lora_specs(["acme=/a", "b-2=org/adapter"]) == {"acme": "/a", "b-2": "org/adapter"}
    assert parse_lora_specs("acme=/a, bravo=/b") == {"acme": "/a", "bravo": "/b"}
    for bad, says in (["acme"], "NAME=PATH"), (["acme="], "NAME=PATH"), \
            (["<spk>=/a"], "adapter name"), (["a=/x", "a=/y"], "named twice"):
        with pytest.raises(AdapterError, match=says):
            parse_lora_specs(bad)


def test_lora_is_sized_from_the_adapters_unless_set():
    opts = EngineOptions(model="m")
    assert with_adapters(opts, AdapterSet()).enable_lora is False
    adapters = AdapterSet()
    adapters.add(Adapter("acme", 1, "/a", 24, 24.0))
    sized = with_adapters(opts, adapters)
    assert (sized.enable_lora, sized.max_lora_rank) == (True, 32)
    assert lora_rank_for(4) == 8 and lora_rank_for(16) == 16


def test_an_engine_started_without_lora_refuses_an_adapter():
    engine = VllmEngine(EngineOptions(model="unused", enable_lora=False))
    engine._start_task = object()  # as once start() has begun
    with pytest.raises(ValueError, match="started without LoRA"):
        engine.add_adapter(Adapter("acme", 1, "/a", 8, 16.0))
    assert not engine.adapters


def test_a_bad_adapter_never_reaches_the_engine(good, tiny_model_dir, tmp_path):
    """Registration checks first: the engine's set holds only adapters that passed."""
    pipeline = load_pipeline(tiny_model_dir)  # the engine is never started
    bad = _copy(good, tmp_path / "bad", lambda c: {**c, "r": 4})  # its tensors say 8
    with pytest.raises(AdapterError, match="has shape"):
        serve_adapters(pipeline, {"acme": str(bad)})
    assert not pipeline.engine.adapters and not pipeline.engine.started
    with pytest.raises(AdapterError, match="already a voice"):
        serve_adapters(pipeline, {"kavya": str(good)})
    serve_adapters(pipeline, {"acme": str(good)})
    serve_adapters(pipeline, {"acme": str(good)})  # the same folder again: kept
    with pytest.raises(AdapterError, match="already served from"):
        serve_adapters(pipeline, {"acme": str(bad)})
    assert pipeline.engine.adapters.names == ("acme",)


def test_a_voice_names_an_adapter_only_where_it_is_registered():
    plain = resolve_voice(VEENA, "acme", adapters=("acme",))
    assert (plain.voice, plain.adapter) == ("acme", "acme")
    with pytest.raises(ValueError, match="unknown voice 'acme'"):
        resolve_voice(VEENA, "acme")
    maya = resolve_voice(veena.MAYA1, "acme", adapters=("acme",))
    assert (maya.voice, maya.adapter) == (veena.MAYA1.default_voice, "acme")


def test_a_voice_file_may_name_an_adapter_and_old_files_still_load():
    data = VoiceFile("veena", "m", "acme", seed=7, adapter="acme").to_json()
    assert parse_voice(data, VEENA).adapter == "acme"
    old = {k: v for k, v in data.items() if k != "adapter"} | {"voice": "kavya"}
    assert parse_voice(old, VEENA).adapter is None
    with pytest.raises(VoiceFileError, match="adapter name"):
        parse_voice({**data, "adapter": "a b"}, VEENA)
    found = resolve_voice(VEENA, "v.json", lookup=lambda _: parse_voice(data, VEENA),
                          adapters=("acme",))
    assert (found.voice, found.adapter, found.seed) == ("acme", "acme", 7)
    with pytest.raises(ValueError, match="not registered"):
        resolve_voice(VEENA, "v.json", lookup=lambda _: parse_voice(data, VEENA))


def test_the_plugin_and_the_command_line_refuse_a_bad_adapter(good, tiny_model_dir, tmp_path):
    bad = _copy(good, tmp_path / "bad", lambda c: {**c, "target_modules": ["lm_head"]})
    with pytest.raises(ValueError, match="unsupported target modules"):
        veena.TTS(pipeline=load_pipeline(tiny_model_dir), lora={"acme": str(bad)})
    with pytest.raises(ValueError, match="in-process engine"):
        veena.TTS(base_url="ws://127.0.0.1:1", lora={"acme": str(good)})
    code = cli.main(["say", "hi", "--model", tiny_model_dir, "--lora", f"acme={bad}",
                     "--voice", "acme", "-o", str(tmp_path / "a.wav")])
    assert code == 2 and not (tmp_path / "a.wav").exists()


class _Words:
    """A tokenizer that keeps the words it was asked to encode."""

    texts: list

    def encode(self, text, add_special_tokens=False):
        self.texts.append(text)
        return [1]


@pytest.mark.parametrize("profile,words", [(VEENA, "<spk_acme> Hi."),
                                           (veena.ORPHEUS, "acme: Hi.")])
def test_an_adapter_speaks_its_name_in_the_profiles_own_prompt(profile, words):
    """The fine-tune convention of each named-speaker model: its template with the adapter's
    name, allowed only where the request carries that adapter."""
    tokenizer = _Words()
    tokenizer.texts = []
    profile.build_prompt(tokenizer, "Hi.", "acme", speakers=("acme",))
    assert words in tokenizer.texts
    with pytest.raises(ValueError, match="unknown voice 'acme'"):
        profile.build_prompt(tokenizer, "Hi.", "acme")


async def test_a_call_keeps_its_adapter_voice_stream_after_stream():
    """``voice="acme"``: every engine request of every stream carries the adapter, in both
    of the plugin's streams, until the voice changes."""
    from ..fakes import fake_pipeline

    async with fake_pipeline() as p:
        p.engine.adapters.add(Adapter("acme", 1, "/a", 8, 16.0))
        tts = veena.TTS(pipeline=p, voice="acme", max_tokens_per_chunk=14)
        await tts.synthesize("Hello there.").collect()
        stream = tts.stream()
        stream.push_text("Hello again.")
        stream.end_input()
        async for _ in stream:
            pass
        asked = list(p.engine.adapters_asked)
        assert len(asked) >= 2 and set(asked) == {"acme"}
        tts.update_options(voice="kavya")
        await tts.synthesize("Hello there.").collect()
        assert set(p.engine.adapters_asked[len(asked):]) == {None}
        await tts.aclose()


def test_processes_sharing_an_engine_start_lora_alike(good, tmp_path, monkeypatch):
    """``serve`` settles LoRA in its environment before it starts a shared core and its
    front ends: on, with a rank that holds every configured adapter (VEENA_LORA and the
    adapters folder), so that the core, which registers none, is sized as they are."""
    from livekit.plugins.veena.models.adapters import settle_lora_env

    # empty is unset; monkeypatch puts back what was there, whatever settle_lora_env writes
    for name in ("VEENA_ENABLE_LORA", "VEENA_MAX_LORA_RANK", "VEENA_ADAPTERS_DIR", "VEENA_LORA"):
        monkeypatch.setenv(name, "")
    settle_lora_env()
    assert os.environ["VEENA_ENABLE_LORA"] == ""  # nothing configured: LoRA stays off
    folder = tmp_path / "adapters"
    folder.mkdir()
    big = _copy(good, folder / "big", lambda c: {**c, "r": 24})
    assert big.is_dir()
    monkeypatch.setenv("VEENA_ADAPTERS_DIR", str(folder))
    monkeypatch.setenv("VEENA_LORA", f"acme={good}")
    settle_lora_env()
    assert os.environ["VEENA_ENABLE_LORA"] == "1" and os.environ["VEENA_MAX_LORA_RANK"] == "32"
    assert EngineOptions.from_env("m").enable_lora is True
