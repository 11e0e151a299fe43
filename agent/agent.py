"""Example voice agent: Silero VAD + any OpenAI-compatible STT and LLM + Veena TTS.

Run with the livekit-agents CLI:
    python agent/agent.py console   # local microphone/speaker (needs libportaudio2)
    python agent/agent.py dev       # against LIVEKIT_URL (e.g. `livekit-server --dev`)
    python agent/agent.py start     # production worker
Every setting is an environment variable; see ../.env.example.
"""

from __future__ import annotations

import logging
import os

from livekit.agents import (
    Agent,
    AgentServer,
    AgentSession,
    APIError,
    JobContext,
    JobProcess,
    cli,
)
from livekit.agents.types import NOT_GIVEN
from livekit.plugins import openai, silero, veena

logger = logging.getLogger("veena-agent")

# an empty variable (compose passes every one in .env) means the default, as unset does
INSTRUCTIONS = os.environ.get("AGENT_INSTRUCTIONS") or (
    "You are a friendly voice assistant. Answer briefly, in plain spoken sentences.")


def build_tts() -> veena.TTS:
    """The shared server at VEENA_TTS_URL (recommended: one GPU engine for all workers),
    else an in-process engine on VEENA_MODEL (one per worker process). VEENA_VOICE is a
    voice name, a description in words (maya1) or a voice file (.json)."""
    return veena.TTS(
        base_url=os.environ.get("VEENA_TTS_URL") or None,
        model=os.environ.get("VEENA_MODEL") or None,
        voice=os.environ.get("VEENA_VOICE") or NOT_GIVEN,
    )


def build_instructions(tags: tuple[str, ...] | list[str]) -> str:
    """The agent's LLM instructions: AGENT_INSTRUCTIONS, then, when the TTS's model performs
    expressive tags (Maya1, Orpheus), the paragraph that says which ones it may write."""
    extra = veena.tag_instructions(tags)
    return f"{INSTRUCTIONS}\n\n{extra}" if extra else INSTRUCTIONS


def build_llm() -> openai.LLM:
    return openai.LLM(
        model=os.environ.get("LLM_MODEL") or "gpt-4o-mini",
        base_url=os.environ.get("LLM_BASE_URL") or NOT_GIVEN,
        api_key=os.environ.get("LLM_API_KEY") or os.environ.get("OPENAI_API_KEY") or "unused",
    )


def build_stt() -> openai.STT:
    return openai.STT(
        model=os.environ.get("STT_MODEL") or "gpt-4o-mini-transcribe",
        base_url=os.environ.get("STT_BASE_URL") or NOT_GIVEN,
        api_key=os.environ.get("STT_API_KEY") or os.environ.get("OPENAI_API_KEY") or "unused",
        language=os.environ.get("STT_LANGUAGE") or "en",
    )


def prewarm(proc: JobProcess) -> None:
    proc.userdata["vad"] = silero.VAD.load()


async def _tags(tts: veena.TTS) -> tuple[str, ...]:
    """The TTS's tags; through a server, the server's own (its /ready), else the profile's."""
    try:
        return await tts.fetch_tags()
    except APIError as e:  # the server is not reachable yet: the TTS will say so itself
        logger.warning("could not ask the TTS server for its tags: %s", e)
        return tts.tags


server = AgentServer(setup_fnc=prewarm)


@server.rtc_session()
async def entrypoint(ctx: JobContext) -> None:
    tts = build_tts()
    tts.prewarm()
    instructions = build_instructions(await _tags(tts))
    session = AgentSession(vad=ctx.proc.userdata["vad"], stt=build_stt(), llm=build_llm(), tts=tts)
    await session.start(agent=Agent(instructions=instructions), room=ctx.room)
    await ctx.connect()
    greeting = os.environ.get("AGENT_GREETING", "Hello! How can I help you today?")
    if greeting:
        session.say(greeting)


if __name__ == "__main__":
    cli.run_app(server)
