"""The two stream types of the TTS (livekit-agents' contract): ``ChunkedStream`` for a whole
text, ``SynthesizeStream`` for LLM deltas; each one LiveKit segment, spoken by the TTS's
speaker (``speakers``) with the options and voice the stream was made with."""

from __future__ import annotations

import contextlib
from typing import AsyncIterator

from livekit.agents import APIConnectOptions, tts, utils

from ..pipeline.sentences import sentences
from ..voices.call_voice import StreamVoice
from .options import TTSOptions
from .speakers import Speaker, SpeakRequest, StreamText


def _say_nothing(emitter: tts.AudioEmitter, sample_rate: int) -> None:
    """10 ms of silence for a turn with nothing to say (its text held only tags the model
    does not perform): livekit counts a turn without audio as a failed attempt, retries it,
    and an AgentSession ends after a few such failures."""
    emitter.push(bytes(2 * (sample_rate // 100)))


class _SpokenStream:
    """What both streams hold: the TTS's speaker, the options and the voice the stream was
    made with; and what it spoke with (``tts.stream().speaker_globals``)."""

    _speaker: Speaker
    _opts: TTSOptions
    _voice: StreamVoice

    def _hold(self, speaker: Speaker, options: TTSOptions, voice: StreamVoice) -> None:
        self._speaker, self._opts, self._voice = speaker, options, voice

    @property
    def speaker_globals(self) -> tuple[int, ...] | None:
        """The speaker globals this stream spoke with (BiCodec), once known."""
        return self._voice.speaker_globals

    @property
    def seed(self) -> int | None:
        """The seed this stream spoke with, once known."""
        return self._voice.seed


class ChunkedStream(_SpokenStream, tts.ChunkedStream):
    """``synthesize(text)``: the same chunked, pipelined turn over a complete text."""

    def __init__(self, *, tts: tts.TTS, speaker: Speaker, options: TTSOptions,
                 voice: StreamVoice, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._hold(speaker, options, voice)

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        request_id = utils.shortuuid()
        rate = await self._speaker.learn_sample_rate(self._conn_options.timeout)
        output_emitter.initialize(request_id=request_id, sample_rate=rate,
                                  num_channels=1, mime_type="audio/pcm", stream=False)

        async def pieces() -> AsyncIterator[str]:
            for piece in self._opts.tokenizer.tokenize(self._input_text):
                yield piece

        async def raw() -> AsyncIterator[str | None]:
            yield self._input_text

        request = SpeakRequest(self._opts, self._voice, self._conn_options.timeout, request_id)
        if not await self._speaker.speak(StreamText(pieces(), raw()), request, output_emitter) \
                and self._input_text.strip():
            _say_nothing(output_emitter, rate)
        output_emitter.flush()


class SynthesizeStream(_SpokenStream, tts.SynthesizeStream):
    """``stream()``: LLM deltas in, one segment of audio out, chunk by chunk."""

    def __init__(self, *, tts: tts.TTS, speaker: Speaker, options: TTSOptions,
                 voice: StreamVoice, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._hold(speaker, options, voice)

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        request_id = utils.shortuuid()
        rate = await self._speaker.learn_sample_rate(self._conn_options.timeout)
        output_emitter.initialize(request_id=request_id, sample_rate=rate, num_channels=1,
                                  mime_type="audio/pcm", stream=True)
        output_emitter.start_segment(segment_id=utils.shortuuid())
        given = False  # any text at all (an empty reply says nothing, not even silence)

        async def deltas() -> AsyncIterator[str | None]:
            nonlocal given
            async for data in self._input_ch:
                if isinstance(data, self._FlushSentinel):
                    yield None
                    continue
                given = given or bool(data.strip())
                yield data

        # every piece of the stream goes into this one segment: a flush only forces out
        # what the tokenizer holds, it never opens a second segment
        raw = deltas()
        pieces = sentences(raw, self._opts.tokenizer, self._opts.text_pacing, output_emitter)
        request = SpeakRequest(self._opts, self._voice, self._conn_options.timeout, request_id,
                               self._mark_started)
        async with contextlib.aclosing(pieces):
            spoke = await self._speaker.speak(StreamText(pieces, raw), request, output_emitter)
        if not spoke and given:
            _say_nothing(output_emitter, rate)
        output_emitter.end_segment()
