"""Test doubles for the parts of a voice agent that are not ours: a scripted LLM and an
audio sink that captures frames (no room, no speaker). The TTS under test is real."""

from __future__ import annotations

import asyncio
import re

from livekit.agents import llm
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS
from livekit.agents.voice import io


class ScriptedLLM(llm.LLM):
    """Streams a fixed reply word by word, like an LLM writing."""

    def __init__(self, reply: str, delay: float = 0.005) -> None:
        super().__init__()
        self.reply = reply
        self.delay = delay

    def chat(self, *, chat_ctx, tools=None, conn_options=DEFAULT_API_CONNECT_OPTIONS, **_):
        return _ScriptedStream(self, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)


class _ScriptedStream(llm.LLMStream):
    async def _run(self) -> None:
        for i, word in enumerate(re.findall(r"\S+\s*", self._llm.reply)):
            self._event_ch.send_nowait(
                llm.ChatChunk(id=f"c{i}", delta=llm.ChoiceDelta(role="assistant", content=word))
            )
            await asyncio.sleep(self._llm.delay)


class CapturingAudioOutput(io.AudioOutput):
    def __init__(self) -> None:
        super().__init__(label="capture", capabilities=io.AudioOutputCapabilities(pause=False))
        self.frames = []
        self.interruptions = 0
        self._segment = 0.0
        self.first_frame = asyncio.Event()

    async def capture_frame(self, frame) -> None:
        await super().capture_frame(frame)
        self.frames.append(frame)
        self._segment += frame.duration
        self.first_frame.set()

    def flush(self) -> None:
        super().flush()
        self.on_playback_finished(playback_position=self._segment, interrupted=False)
        self._segment = 0.0

    def clear_buffer(self) -> None:
        if self._segment:
            self.interruptions += 1
            self.on_playback_finished(playback_position=self._segment, interrupted=True)
        self._segment = 0.0

    @property
    def seconds(self) -> float:
        return sum(f.duration for f in self.frames)


class CapturingTextOutput(io.TextOutput):
    """Records every piece of transcript text the session sends to the text output."""

    def __init__(self) -> None:
        super().__init__(label="capture-text", next_in_chain=None)
        self.pieces: list = []

    async def capture_text(self, text: str) -> None:
        self.pieces.append(text)

    def flush(self) -> None:
        pass
