"""The example agent builds its components from the environment, and tells its LLM which
expressive tags the TTS performs (none: the instructions are left as they are)."""

import importlib.util
from pathlib import Path

import pytest
from livekit.plugins import veena

from livekit.plugins.veena.models.profiles import MAYA1_TAGS, ORPHEUS_TAGS

from .models.test_maya1_surfaces import maya1_server

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


def test_the_agent_runs_on_an_agent_server(agent_module):
    """livekit-agents' current entry (``AgentServer``, ``rtc_session``), not the deprecated
    ``WorkerOptions``: the server holds the entrypoint and runs prewarm in each process."""
    from livekit.agents import AgentServer

    server = agent_module.server
    assert isinstance(server, AgentServer)
    assert server.setup_fnc is agent_module.prewarm
    with pytest.raises(RuntimeError, match="only one rtc_session"):  # its entry is taken
        server.rtc_session(agent_module.entrypoint)
    assert "WorkerOptions" not in AGENT.read_text()


def test_prewarm_loads_silero(agent_module):
    class Proc:
        userdata: dict = {}

    proc = Proc()
    agent_module.prewarm(proc)
    assert proc.userdata["vad"] is not None


def test_instructions_carry_the_tts_tags(agent_module, monkeypatch):
    monkeypatch.delenv("VEENA_MODEL", raising=False)
    monkeypatch.setenv("VEENA_TTS_URL", "ws://127.0.0.1:9")
    monkeypatch.setenv("VEENA_PROFILE", "orpheus")
    tts = agent_module.build_tts()
    assert tts.tags == ORPHEUS_TAGS
    instructions = agent_module.build_instructions(tts.tags)
    assert instructions.startswith(agent_module.INSTRUCTIONS)
    assert veena.tag_instructions(ORPHEUS_TAGS) in instructions and "<laugh>" in instructions
    monkeypatch.setenv("VEENA_PROFILE", "veena")  # no tags: the instructions as they are
    assert agent_module.build_tts().tags == ()
    assert agent_module.build_instructions(()) == agent_module.INSTRUCTIONS


async def test_the_entrypoint_asks_the_server_for_its_tags(agent_module, monkeypatch):
    monkeypatch.delenv("VEENA_MODEL", raising=False)
    monkeypatch.setenv("VEENA_PROFILE", "veena")  # the server's own tags win over the guess
    async with maya1_server() as (url, _, _engine):
        monkeypatch.setenv("VEENA_TTS_URL", url.replace("http://", "ws://"))
        tts = agent_module.build_tts()
        assert await agent_module._tags(tts) == MAYA1_TAGS
        await tts.aclose()
    # an unreachable server: the given profile's tags, and a warning, not a crash
    monkeypatch.setenv("VEENA_TTS_URL", "ws://127.0.0.1:9")
    monkeypatch.setenv("VEENA_PROFILE", "orpheus")
    tts = agent_module.build_tts()
    assert await agent_module._tags(tts) == ORPHEUS_TAGS
    await tts.aclose()
