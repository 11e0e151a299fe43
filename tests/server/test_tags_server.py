"""Expressive tags through the server (fake engine, no vLLM): a WebSocket context's and a
speech request's prompts keep the profile's tags and lose the rest, its ``words`` events
carry no tag, and ``/metrics`` counts every removed tag."""

import aiohttp

from livekit.plugins.veena.server.app import ServerOptions

from ..pipeline.test_turn_tags import tagged_pipeline
from ..servers import poll_until, serve_app
from .rawws import RawWebSocket
from .test_contexts import GUARD_POLLS, Reader, speak

TEXT = "Hello <laugh> there, my friend. <happy> How are you <|eot_id|> today? <sigh>"


async def _removed_total(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    (line,) = [x for x in text.splitlines() if x.startswith("veena_unknown_tags_removed_total ")]
    return float(line.split()[1])


async def test_a_context_speaks_known_tags_and_its_words_carry_none():
    async with tagged_pipeline() as (p, prompts), serve_app(p, ServerOptions()) as (url, _):
        async with aiohttp.ClientSession() as s:
            before = await _removed_total(s, url)
            r = Reader(await RawWebSocket.connect(int(url.rsplit(":", 1)[1])))
            # in deltas that split the tags, as an LLM would send them
            for i in range(0, len(TEXT), 4):
                await r.ws.send_together([speak("a", TEXT[i:i + 4], True)])
            await r.ws.send_together([speak("a", "", False)])
            await poll_until(lambda: r.terminal("a"), "a's end", polls=GUARD_POLLS)
            assert [e["type"] for e in r.terminal("a")] == ["done"]
            assert prompts == ["<spk_kavya> Hello <laugh> there,",
                               "<spk_kavya> my friend. How are you today? <sigh>"]
            words = [w["text"] for e in r.of("a", "words") for w in e["words"]]
            assert "".join(words).split() == "Hello there, my friend. How are you today?".split()
            assert await _removed_total(s, url) == before + 2
            await r.stop()


async def test_a_speech_request_reads_no_unknown_tag():
    async with tagged_pipeline() as (p, prompts), serve_app(p, ServerOptions()) as (url, _):
        async with aiohttp.ClientSession() as s:
            before = await _removed_total(s, url)
            body = {"input": "<happy> Oh <laugh> that is <custom_token_7> funny.",
                    "response_format": "pcm", "sampling": {"max_tokens": 28}}
            async with s.post(url + "/v1/audio/speech", json=body) as r:
                assert r.status == 200 and len(await r.read()) > 0
            assert prompts == ["<spk_kavya> Oh <laugh> that is funny."]
            assert await _removed_total(s, url) == before + 2
