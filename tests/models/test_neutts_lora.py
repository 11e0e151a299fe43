"""LoRA for NeuTTS: an adapter on all seven of Qwen2's projections (q/k/v/o, gate/up/down)
of the tiny NeuTTS model passes the adapter check against that base (the shapes read from
Qwen2's config), one for another base does not, and its name resolves as a voice. No engine:
tests/models/test_neutts_say.py speaks such an adapter through vLLM (``say --lora``) and
checks it against the model with the adapter merged into its weights."""

import json

import pytest

from livekit.plugins.veena.models.adapters import TARGET_MODULES, AdapterError, check_adapter
from livekit.plugins.veena.models.profiles import NEUTTS
from livekit.plugins.veena.models.tiny_model import make_random_adapter
from livekit.plugins.veena.voices.call_voice import resolve_voice


def test_an_adapter_on_qwen2s_seven_projections_passes_the_check(tiny_neutts_dir, tmp_path):
    folder = make_random_adapter(tmp_path / "acme", tiny_neutts_dir, rank=4)
    config = json.loads((folder / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == sorted(TARGET_MODULES)
    checked = check_adapter("acme", str(folder), tiny_neutts_dir)
    assert checked.rank == 4 and sorted(checked.target_modules) == sorted(TARGET_MODULES)


def test_an_adapter_for_another_base_is_refused(tiny_neutts_dir, tiny_model_dir, tmp_path):
    folder = make_random_adapter(tmp_path / "other", tiny_model_dir, rank=4)  # tiny Llama
    with pytest.raises(AdapterError):
        check_adapter("other", str(folder), tiny_neutts_dir)


def test_an_adapters_name_is_a_voice():
    voice = resolve_voice(NEUTTS, "acme", adapters=("acme",))
    assert (voice.voice, voice.adapter, voice.speaker_globals) == ("", "acme", None)
