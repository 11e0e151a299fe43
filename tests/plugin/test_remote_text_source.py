"""A turn whose text source fails (the agent's own sentence tokenizer raised) ends at once with
the same typed error in both modes, and the server frees the context: in remote mode it waited
for the server until its read timeout, then blamed the server with a timeout."""

import asyncio

import pytest
from livekit.agents import APIConnectionError, APIConnectOptions, tokenize
from livekit.plugins import veena

from livekit.plugins.veena.server.app import ServerOptions

from ..fakes import fake_pipeline, fake_server
from ..helpers import tasks_left_since

NO_RETRY = APIConnectOptions(max_retry=0, timeout=30)


class _Breaking(tokenize.SentenceTokenizer):
    """livekit's basic tokenizer, except that its stream raises on a piece saying BOOM."""

    def __init__(self) -> None:
        self.inner = tokenize.basic.SentenceTokenizer(min_sentence_len=1)

    def tokenize(self, text, *, language=None):
        return self.inner.tokenize(text, language=language)

    def stream(self, *, language=None):
        stream = self.inner.stream(language=language)
        push = stream.push_text

        def push_text(text: str) -> None:
            if "BOOM" in text:
                raise RuntimeError("the tokenizer broke")
            push(text)

        stream.push_text = push_text
        return stream


async def _failing_turn(tts_: veena.TTS) -> tuple[APIConnectionError, int]:
    """A turn that speaks its first sentence, then its text source raises: the error and the
    bytes of audio heard before it."""
    stream = tts_.stream(conn_options=NO_RETRY)
    stream.push_text("Hello there. This first sentence is spoken. And then ")
    heard = 0
    with pytest.raises(APIConnectionError) as info:
        async for ev in stream:
            if not heard:
                stream.push_text("BOOM ")
            heard += len(ev.frame.data)
    await stream.aclose()
    return info.value, heard


async def test_a_failing_text_source_ends_the_turn_alike_in_both_modes():
    async with fake_pipeline() as p:
        local = veena.TTS(pipeline=p, tokenizer=_Breaking())
        try:
            local_error, local_heard = await asyncio.wait_for(_failing_turn(local), 60)
        finally:
            await local.aclose()
    async with fake_server(ServerOptions()) as server:
        before = set(asyncio.all_tasks())
        remote = veena.TTS(base_url=server.ws_url, tokenizer=_Breaking())
        try:  # a hang guard only: before, the turn waited forever
            remote_error, remote_heard = await asyncio.wait_for(_failing_turn(remote), 60)
            for _ in range(200):  # the server frees the context, its socket still open
                if server.idle():
                    break
                await asyncio.sleep(0.05)
            assert server.idle(), server.leftovers()
            assert server.state.connections == 1
        finally:
            await remote.aclose()
        leaked = await tasks_left_since(before)  # the context's sender and receiver included
        assert not leaked, leaked
    for error, heard in ((local_error, local_heard), (remote_error, remote_heard)):
        assert type(error) is APIConnectionError, error  # not a timeout
        assert "the tokenizer broke" in str(error)
        assert heard > 0 and not error.retryable  # audio was heard: never said twice
