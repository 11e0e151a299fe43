"""The two stream types of the TTS (livekit-agents' contract): ``ChunkedStream`` for a whole
text, ``SynthesizeStream`` for LLM deltas; each one LiveKit segment, spoken as one turn
in-process or as one server context."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Any, Protocol

from livekit.agents import (
    APIConnectionError,
    APIConnectOptions,
    APIError,
    APITimeoutError,
    tts,
    utils,
)
from livekit.agents.types import TimedString

from .log import logger
from .options import TTSOptions
from .pipeline.engine import EngineDeadError, EngineError, EngineStartingError
from .pipeline.sentences import sentences
from .pipeline.stitching import to_int16
from .pipeline.turn import Turn, TurnTimeout
from .remote import FLUSH, RemoteClient


class StreamOwner(Protocol):
    """What a stream asks of the ``veena.TTS`` that made it (this module never imports it)."""

    _opts: TTSOptions
    _voice_epoch: int
    remote: RemoteClient | None

    async def _learn_sample_rate(self, timeout: float) -> int: ...

    async def _speak_remote(self, opts: TTSOptions, texts: Any, emitter: tts.AudioEmitter,
                            timeout: float, stream: Any, on_started: Any = ...) -> bool: ...

    def _new_turn(self, opts: TTSOptions, timeout: float, stream: Any,
                  emitter: tts.AudioEmitter) -> Turn: ...


def _push_words(emitter: tts.AudioEmitter, words) -> None:
    """Timed words (text, start s, end s) for ``AgentSession(use_tts_aligned_transcript=True)``."""
    if words:
        emitter.push_timed_transcript(
            [TimedString(text, start_time=a, end_time=b) for text, a, b in words])


def _say_nothing(emitter: tts.AudioEmitter, sample_rate: int) -> None:
    """10 ms of silence for a turn with nothing to say (its text held only tags the model
    does not perform): livekit counts a turn without audio as a failed attempt, retries it,
    and an AgentSession ends after a few such failures."""
    emitter.push(bytes(2 * (sample_rate // 100)))


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


class _VoiceOfStream:
    speaker_globals: tuple[int, ...] | None = None
    """The speaker globals this stream spoke with (BiCodec), once known."""
    seed: int | None = None
    """The seed this stream spoke with, once known (through a server: where the plugin chose
    it, i.e. given, a voice file's or the call's; else the server draws one)."""
    voice_epoch = 0
    """Its TTS's ``reset_voice`` count when it was made, with its options: a stream of an
    older voice neither uses nor keeps the call's voice."""


class ChunkedStream(_VoiceOfStream, tts.ChunkedStream):
    """``synthesize(text)``: the same chunked, pipelined turn over a complete text."""

    def __init__(self, *, tts: StreamOwner, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._tts: StreamOwner = tts
        self._opts = dataclasses.replace(tts._opts)
        self.voice_epoch = tts._voice_epoch

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        rate = await self._tts._learn_sample_rate(self._conn_options.timeout)
        output_emitter.initialize(request_id=utils.shortuuid(), sample_rate=rate,
                                  num_channels=1, mime_type="audio/pcm", stream=False)
        if self._tts.remote is not None:
            async def whole():
                if self._opts.server_chunks:
                    yield self._input_text  # the server's chunker is the same as ours
                    return
                for piece in self._opts.tokenizer.tokenize(self._input_text):
                    yield piece
                    yield FLUSH

            if not await self._tts._speak_remote(self._opts, whole(), output_emitter,
                                                 self._conn_options.timeout, self) \
                    and self._input_text.strip():
                _say_nothing(output_emitter, rate)
            output_emitter.flush()
            return
        push = lambda pcm: output_emitter.push(to_int16(pcm).tobytes())  # noqa: E731

        async def texts():
            for chunk in self._opts.tokenizer.tokenize(self._input_text):
                if chunk.strip():
                    yield chunk

        turn = self._tts._new_turn(self._opts, self._conn_options.timeout, self, output_emitter)
        try:
            await turn.speak(texts(), push)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            raise _map_error(e, turn.audio_pushed) from e
        if not turn.audio_pushed and self._input_text.strip():
            _say_nothing(output_emitter, rate)
        output_emitter.flush()


class SynthesizeStream(_VoiceOfStream, tts.SynthesizeStream):
    """``stream()``: LLM deltas in, one segment of audio out, chunk by chunk."""

    def __init__(self, *, tts: StreamOwner, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._tts: StreamOwner = tts
        self._opts = dataclasses.replace(tts._opts)
        self.voice_epoch = tts._voice_epoch

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        request_id = utils.shortuuid()
        rate = await self._tts._learn_sample_rate(self._conn_options.timeout)
        output_emitter.initialize(request_id=request_id, sample_rate=rate, num_channels=1,
                                  mime_type="audio/pcm", stream=True)
        output_emitter.start_segment(segment_id=utils.shortuuid())
        given = False  # any text at all (an empty reply says nothing, not even silence)

        async def deltas():
            nonlocal given
            async for data in self._input_ch:
                if isinstance(data, self._FlushSentinel):
                    yield None
                    continue
                given = given or bool(data.strip())
                yield data

        # every piece of the stream goes into this one segment: a flush only forces out
        # what the tokenizer holds, it never opens a second segment
        texts = sentences(deltas(), self._opts.tokenizer, self._opts.text_pacing, output_emitter)
        if self._tts.remote is not None:
            async def remote_texts():
                if self._opts.server_chunks:  # the server chunks the raw deltas itself
                    async for delta in deltas():
                        yield FLUSH if delta is None else delta
                    return
                async for piece in texts:
                    yield piece
                    yield FLUSH

            async with contextlib.aclosing(texts):
                if not await self._tts._speak_remote(self._opts, remote_texts(), output_emitter,
                                                     self._conn_options.timeout, self,
                                                     self._mark_started) and given:
                    _say_nothing(output_emitter, rate)
            output_emitter.end_segment()
            return
        push = lambda pcm: output_emitter.push(to_int16(pcm).tobytes())  # noqa: E731
        turn = self._tts._new_turn(self._opts, self._conn_options.timeout, self, output_emitter)
        turn.on_request_started = self._mark_started
        try:
            async with contextlib.aclosing(texts):
                await turn.speak(texts, push)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            raise _map_error(e, turn.audio_pushed) from e
        finally:
            logger.debug("stream turn closed", extra={"request_id": request_id,
                                                      "engine_requests": turn.request_ids})
        if not turn.audio_pushed and given:
            _say_nothing(output_emitter, rate)
        output_emitter.end_segment()
