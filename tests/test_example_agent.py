"""The example agent builds its components from the environment."""

import importlib.util
from pathlib import Path

import pytest

AGENT = Path(__file__).resolve().parents[1] / "agent" / "agent.py"


@pytest.fixture
def agent_module():
    spec = importlib.util.spec_from_file_location("veena_example_agent", AGENT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_components_from_env(agent_module, monkeypatch):
    monkeypatch.setenv("LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("LLM_MODEL", "local-model")
    assert agent_module.build_llm().model == "local-model"
    assert agent_module.build_stt() is not None
    monkeypatch.delenv("VEENA_MODEL", raising=False)
    monkeypatch.delenv("VEENA_TTS_URL", raising=False)
    with pytest.raises(ValueError, match="VEENA_MODEL"):
        agent_module.build_tts()


def test_prewarm_loads_silero(agent_module):
    class Proc:
        userdata: dict = {}

    proc = Proc()
    agent_module.prewarm(proc)
    assert proc.userdata["vad"] is not None
