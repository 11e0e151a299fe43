"""Text into speakable pieces the livekit-agents way: any ``tokenize.SentenceTokenizer``
(ours by default), optionally behind a ``tts.SentenceStreamPacer``.

Our chunker is a ``SentenceTokenizer`` too, so other plugins can use its Indic-aware
sentence ends (``।`` ``॥``) and its short first chunk (first audio sooner).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

from livekit.agents import tokenize, tts, utils

from .chunking import ChunkerOptions, TextChunker, chunk_text


class SentenceTokenizer(tokenize.SentenceTokenizer):
    """The chunker as a livekit-agents tokenizer: a short first piece, then sentences."""

    def __init__(self, options: ChunkerOptions | None = None) -> None:
        if options is not None and not isinstance(options, ChunkerOptions):
            raise ValueError(f"chunker must be a ChunkerOptions, got {type(options).__name__}")
        self.options = (options or ChunkerOptions.from_env()).validate()

    def tokenize(self, text: str, *, language: str | None = None) -> list[str]:
        return chunk_text(text, self.options)

    def stream(self, *, language: str | None = None) -> tokenize.SentenceStream:
        return _ChunkerStream(self.options)


class _ChunkerStream(tokenize.SentenceStream):
    def __init__(self, options: ChunkerOptions) -> None:
        super().__init__()
        self._chunker = TextChunker(options)
        self._segment_id = utils.shortuuid()

    def push_text(self, text: str) -> None:
        self._check_not_closed()
        self._emit(self._chunker.push(text))

    def flush(self) -> None:
        self._check_not_closed()
        self._emit(self._chunker.flush())

    def end_input(self) -> None:
        self.flush()
        self._do_close()

    async def aclose(self) -> None:
        self._do_close()

    def _emit(self, pieces: list[str]) -> None:
        for piece in pieces:
            self._event_ch.send_nowait(tokenize.TokenData(segment_id=self._segment_id,
                                                          token=piece))


async def sentences(deltas: AsyncIterator[str | None], tokenizer: tokenize.SentenceTokenizer,
                    pacer: tts.SentenceStreamPacer | None,
                    emitter: tts.AudioEmitter) -> AsyncIterator[str]:
    """The pieces to speak, from text deltas (``None``: a flush, which only forces out what
    the tokenizer holds). With a pacer, pieces wait while enough audio is buffered."""
    stream = tokenizer.stream()
    if pacer is not None:
        stream = pacer.wrap(stream, emitter)

    async def forward() -> None:
        try:
            async for delta in deltas:
                stream.flush() if delta is None else stream.push_text(delta)
        finally:  # also on an error, so that the pieces below end
            with contextlib.suppress(RuntimeError):
                stream.end_input()

    feeder = asyncio.create_task(forward(), name="veena-text-in")
    try:
        async for data in stream:
            if data.token.strip():
                yield data.token
        await feeder  # its errors are the stream's errors
    finally:
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeder
        await stream.aclose()
