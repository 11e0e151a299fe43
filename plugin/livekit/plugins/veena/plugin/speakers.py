"""The speaker seam under the plugin: where a stream's text becomes audio.

``LocalSpeaker`` speaks through an in-process pipeline (one turn per stream);
``RemoteSpeaker`` through a ``veena-tts serve`` server (one context per stream). A stream
hands either one its text, its options and its voice, and gets the audio pushed into its
emitter; it never asks which one it has.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import AsyncIterable, AsyncIterator, Callable, Protocol

from livekit.agents import APIConnectionError, APIError, APITimeoutError, tts
from livekit.agents.types import TimedString

from ..log import logger
from ..normalization import grammars
from ..pipeline.engine import EngineDeadError, EngineError, EngineStartingError
from ..pipeline.pipeline import Pipeline
from ..pipeline.stitching import to_int16
from ..pipeline.transcripts import word_timings
from ..pipeline.turn import Turn, TurnOptions, TurnTimeout
from ..voices.call_voice import StreamVoice
from .options import TTSOptions
from .remote import FLUSH, RemoteClient


@dataclass
class StreamText:
    """A stream's text two ways: ``pieces`` as its tokenizer cut them, ``raw`` as it came
    (None at each flush). A speaker reads one of them, never both."""

    pieces: AsyncIterator[str]
    raw: AsyncIterator[str | None]


@dataclass(frozen=True)
class SpeakRequest:
    """One stream's turn: its options and voice snapshots, and its progress timeout."""

    options: TTSOptions
    voice: StreamVoice
    timeout: float
    request_id: str
    on_started: Callable[[], None] = lambda: None


class Speaker(Protocol):
    """What a stream asks of the TTS's transport."""

    sample_rate: int
    """The rate known now (a server's, once its ``/ready`` has been read)."""

    async def learn_sample_rate(self, timeout: float) -> int: ...

    async def speak(self, text: StreamText, request: SpeakRequest,
                    emitter: tts.AudioEmitter) -> bool:
        """Push the turn's audio and timed words into ``emitter``; whether any audio came."""
        ...

    def prewarm(self) -> None: ...

    async def aclose(self) -> None: ...


def push_words(emitter: tts.AudioEmitter, words) -> None:
    """Timed words (text, start s, end s) for ``AgentSession(use_tts_aligned_transcript=True)``."""
    if words:
        emitter.push_timed_transcript(
            [TimedString(text, start_time=a, end_time=b) for text, a, b in words])


def _map_error(e: BaseException, audio_pushed: bool) -> APIError:
    if isinstance(e, APIError):
        return e
    if isinstance(e, (TurnTimeout, EngineStartingError)):
        return APITimeoutError(str(e), retryable=not audio_pushed)
    if isinstance(e, EngineDeadError):  # nothing will succeed on this engine again
        return APIConnectionError(str(e), retryable=False)
    if isinstance(e, EngineError):
        return APIConnectionError(str(e), retryable=not audio_pushed)
    return APIConnectionError(f"veena synthesis failed: {e!r}", retryable=not audio_pushed)


class LocalSpeaker:
    """Speaks through an in-process pipeline: one ``Turn`` per stream."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.sample_rate = pipeline.profile.sample_rate
        self._prewarm_task: asyncio.Task | None = None

    async def learn_sample_rate(self, timeout: float) -> int:
        return self.sample_rate

    async def speak(self, text: StreamText, request: SpeakRequest,
                    emitter: tts.AudioEmitter) -> bool:
        opts = request.options
        speaker_globals, seed = request.voice.start()
        turn = Turn(self.pipeline, TurnOptions(
            voice=request.voice.voice.voice, sampling=opts.sampling, seed=seed,
            speaker_globals=speaker_globals, adapter=request.voice.voice.adapter,
            chunk_crossfade_ms=opts.chunk_crossfade_ms,
            max_chunks_in_flight=opts.max_chunks_in_flight, timeout=request.timeout,
            startup_timeout=opts.startup_timeout, text_normalization=opts.text_normalization,
            pronunciations=opts.pronunciations))
        request.voice.seed = turn.seed
        turn.on_request_started = request.on_started
        turn.on_speaker_globals = request.voice.captured
        turn.on_chunk_spoken = lambda said, a, b, lengths: push_words(
            emitter, [(w.text, w.start, w.end) for w in word_timings(said, a, b, lengths)])

        async def spoken() -> AsyncIterator[str]:
            async for piece in text.pieces:
                if piece.strip():
                    yield piece

        try:
            await turn.speak(spoken(), lambda pcm: emitter.push(to_int16(pcm).tobytes()))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            raise _map_error(e, turn.audio_pushed) from e
        finally:
            logger.debug("stream turn closed", extra={"request_id": request.request_id,
                                                      "engine_requests": turn.request_ids})
        return turn.audio_pushed

    def prewarm(self) -> None:
        """Start the engine, warm the codec and load the text-normalisation grammars in the
        background; never blocks."""
        if self._prewarm_task is None or self._prewarm_task.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                logger.warning("prewarm() needs a running event loop; skipped")
                return
            self._prewarm_task = loop.create_task(self.pipeline.start(), name="veena-prewarm")
            if self.pipeline.options.normalization.mode != "off":  # compiled once, then cached
                languages = tuple(getattr(self.pipeline.profile, "languages", ()))
                loop.run_in_executor(None, grammars.prepare, languages)

    async def aclose(self) -> None:
        if self._prewarm_task is not None:
            self._prewarm_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._prewarm_task


class RemoteSpeaker:
    """Speaks through a ``veena-tts serve`` server: one context per stream, the call's voice
    in its first message."""

    def __init__(self, client: RemoteClient, sample_rate: int) -> None:
        self.client = client
        self.sample_rate = sample_rate
        """The profile's guess until the server's ``/ready`` has been read."""

    async def learn_sample_rate(self, timeout: float) -> int:
        """The server's ``/ready`` says the rate."""
        rate = await self.client.sample_rate(timeout)
        if rate is not None and rate != self.sample_rate:
            logger.info("the server's sample rate replaces the profile's",
                        extra={"sample_rate": rate, "profile_rate": self.sample_rate})
            self.sample_rate = rate
        return self.sample_rate

    async def speak(self, text: StreamText, request: SpeakRequest,
                    emitter: tts.AudioEmitter) -> bool:
        opts = request.options
        speaker_globals, seed = request.voice.start()
        voice = request.voice.voice
        # an adapter voice goes by its name: the server resolves it to its own adapter
        message = {"voice": voice.adapter or voice.voice, "seed": seed,
                   "sampling": opts.remote_sampling()}
        if speaker_globals is not None:
            message["speaker_globals"] = list(speaker_globals)
        if opts.text_normalization is not None:  # else the server's default
            message["text_normalization"] = opts.text_normalization
        if opts.pronunciations:
            message["pronunciations"] = dict(opts.pronunciations)
        return await self.client.speak(
            _context_texts(text, opts.server_chunks), message, emitter.push, request.timeout,
            request.on_started, request.voice.captured, lambda words: push_words(emitter, words))

    def prewarm(self) -> None:
        self.client.prewarm()

    async def aclose(self) -> None:
        await self.client.aclose()


async def _context_texts(text: StreamText, server_chunks: bool) -> AsyncIterable[object]:
    """What a context sends: the raw text where the server cuts it as our tokenizer would,
    else each piece followed by a flush."""
    if server_chunks:
        async for delta in text.raw:
            yield FLUSH if delta is None else delta
        return
    async for piece in text.pieces:
        yield piece
        yield FLUSH
