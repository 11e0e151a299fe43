"""LiveKit's text conventions: any ``tokenize.SentenceTokenizer`` as ``tokenizer=`` and a
``tts.SentenceStreamPacer`` as ``text_pacing=``, through ``AgentSession``; our chunker as a
``SentenceTokenizer`` other plugins can use."""

import asyncio

import pytest
from livekit.agents import Agent, AgentSession, tokenize, tts
from livekit.plugins import veena

from livekit.plugins.veena.pipeline.chunking import chunk_text

from .livekit_fakes import CapturingAudioOutput, ScriptedLLM

REPLY = "Sure, I can help with that. The first step is simple. The second step takes longer."
LONG_REPLY = REPLY + " The third step needs some care. And then we are done here, all of us."


def test_our_chunker_is_a_sentence_tokenizer():
    tok = veena.SentenceTokenizer()
    assert isinstance(tok, tokenize.SentenceTokenizer)
    text = ("नमस्ते, आप कैसे हैं? मैं ठीक हूँ, धन्यवाद, और आज का दिन बहुत अच्छा रहा है। "
            "आज मौसम बहुत अच्छा है और हम सब बाहर घूमने जाने वाले हैं॥ "
            "Dr. Rao paid $3.50 for the tickets, and the show starts at seven tonight.")
    pieces = tok.tokenize(text)
    assert pieces == chunk_text(text) and len(pieces) >= 3
    assert all(p.rstrip()[-1] in ".?!।॥" for p in pieces)
    assert any(p.rstrip().endswith("।") for p in pieces)
    assert any(p.rstrip().endswith("॥") for p in pieces)
    assert any("Dr. Rao paid $3.50 for" in p for p in pieces)  # no cut at "Dr." or "3.50"


async def test_its_stream_gives_the_same_pieces_as_tokenize():
    tok = veena.SentenceTokenizer()
    stream = tok.stream()
    for word in REPLY.split(" "):
        stream.push_text(word + " ")
    stream.end_input()
    got = [data.token async for data in stream]
    assert [p.strip() for p in got] == [p.strip() for p in tok.tokenize(REPLY)]


def test_bad_tokenizer_or_pacing_is_a_clear_error():
    with pytest.raises(ValueError, match="SentenceTokenizer"):
        veena.TTS(base_url="ws://127.0.0.1:9", tokenizer="blingfire")
    with pytest.raises(ValueError, match="SentenceStreamPacer"):
        veena.TTS(base_url="ws://127.0.0.1:9", text_pacing="yes")


class _Recording(tokenize.SentenceTokenizer):
    """Another tokenizer (livekit's basic one), recording what it hands out."""

    def __init__(self) -> None:
        self.inner = tokenize.basic.SentenceTokenizer(min_sentence_len=1)
        self.pieces: list[str] = []

    def tokenize(self, text, *, language=None):
        return self.inner.tokenize(text, language=language)

    def stream(self, *, language=None):
        inner, pieces = self.inner.stream(language=language), self.pieces

        class Stream(tokenize.SentenceStream):
            def __init__(self):
                super().__init__()
                self._task = asyncio.create_task(self._pump())

            async def _pump(self):
                async for data in inner:
                    pieces.append(data.token)
                    self._event_ch.send_nowait(data)
                self._do_close()

            def push_text(self, text):
                inner.push_text(text)

            def flush(self):
                inner.flush()

            def end_input(self):
                inner.end_input()

            async def aclose(self):
                await inner.aclose()
                self._task.cancel()

        return Stream()


async def _speak(pipeline, monkeypatch, reply=REPLY, **tts_kwargs):
    requested = []
    real = pipeline.synthesize
    monkeypatch.setattr(pipeline, "synthesize",
                        lambda text, *a, **kw: requested.append(text) or real(text, *a, **kw))
    out = CapturingAudioOutput()
    session = AgentSession(llm=ScriptedLLM(reply),
                           tts=veena.TTS(pipeline=pipeline, max_tokens_per_chunk=70, seed=3,
                                         **tts_kwargs))
    session.output.audio = out
    await session.start(Agent(instructions="You are a test agent."), record=False)
    try:
        handle = session.generate_reply(user_input="Can you help me?")
        await asyncio.wait_for(handle.wait_for_playout(), 180)  # hang guard only
    finally:
        await session.aclose()
    return requested, out


@pytest.mark.engine
async def test_any_sentence_tokenizer_cuts_the_requests(pipeline, monkeypatch):
    recording = _Recording()
    requested, out = await _speak(pipeline, monkeypatch, tokenizer=recording)
    assert recording.pieces and len(requested) == len(recording.pieces) >= 2
    assert [r.strip() for r in requested] == [p.strip() for p in recording.pieces]
    # each request speaks 10 frames (0.853 s), one 15 ms crossfade per seam
    n = len(requested)
    assert out.seconds == pytest.approx(n * 0.8533 - (n - 1) * 0.015, abs=0.02)


@pytest.mark.engine
async def test_text_pacing_holds_the_rest_back_until_the_first_piece_is_spoken(pipeline,
                                                                              monkeypatch):
    """Without pacing every chunk is its own request (two in flight); with a pacer the first
    piece goes at once and the rest waits for the first to finish generating, then goes as
    one batch."""
    pacer = tts.SentenceStreamPacer(min_remaining_audio=1000.0, max_text_length=1000)
    requested, out = await _speak(pipeline, monkeypatch, LONG_REPLY, text_pacing=pacer)
    chunks = chunk_text(LONG_REPLY)
    assert len(chunks) >= 3
    assert len(requested) == 2, requested
    assert requested[0].strip() == chunks[0].strip()
    assert requested[1].split() == " ".join(chunks[1:]).split()
    assert out.seconds > 0
