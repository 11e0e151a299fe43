"""The normalisation stage in the turn, on every surface: the model reads the normalised text,
the transcript keeps what was written, ``off`` sends the text as written, any split of the
text into deltas gives the same chunks, and a normaliser that fails leaves the turn speaking."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from livekit.plugins import veena
from livekit.plugins.veena.normalization import grammars
from livekit.plugins.veena.normalization import normalizer as normalizer_module
from livekit.plugins.veena.normalization.normalizer import TextNormalizer
from livekit.plugins.veena.pipeline.engine import SamplingOptions
from livekit.plugins.veena.pipeline.turn import Turn, TurnOptions
from livekit.plugins.veena.protocol import ProtocolError, parse_client_message

from ..fakes import fake_pipeline

TEXT = "Pay Rs. 5,00,000 by 15/08/2026. Thank you!"
SAMPLING = SamplingOptions(max_tokens=7 * 4)


def _spy(p) -> list[str]:
    """The texts the pipeline is asked to speak, in order."""
    asked: list[str] = []
    synthesize = p.synthesize

    def spying(text, **kw):
        asked.append(text)
        return synthesize(text, **kw)

    p.synthesize = spying
    return asked


async def _turn(p, chunks, **options) -> tuple[Turn, list[str]]:
    turn = Turn(p, TurnOptions(voice=p.profile.default_voice, sampling=SAMPLING, seed=1,
                               **options))
    spoken: list[str] = []
    turn.lengths = []  # (per chunk: its words' spoken lengths, or None)

    def heard(text, a, b, lengths):
        spoken.append(text)
        turn.lengths.append(lengths)
    turn.on_chunk_spoken = heard

    async def source():
        for c in chunks:
            yield c

    await turn.speak(source(), lambda pcm: None)
    return turn, spoken


async def test_the_model_reads_the_normalised_text_and_the_transcript_what_was_written():
    async with fake_pipeline(hold_after=1) as p:
        asked = _spy(p)
        lengths_asked: list[asyncio.Future] = []
        spoken_lengths = p.spoken_lengths

        def spying(words, pronunciations=None):
            lengths_asked.append(spoken_lengths(words, pronunciations))
            return lengths_asked[-1]

        p.spoken_lengths = spying

        async def release():  # the engine speaks once the words' lengths are known
            while not lengths_asked:
                await asyncio.sleep(0.01)
            await asyncio.gather(*lengths_asked)
            p.engine.gate.set()

        releaser = asyncio.create_task(release())
        turn, spoken = await _turn(p, ["Pay Rs. 5,00,000 by 15/08/2026.", "Thank you!"])
        await releaser
    paid = next(t for t in asked if t.startswith("Pay"))  # (chunks run side by side)
    assert paid.startswith("Pay five lakh rupees by ") and "15/08/2026" not in paid
    assert spoken == ["Pay Rs. 5,00,000 by 15/08/2026.", "Thank you!"]
    # the written words, timed by what they were read as: the date takes the most time
    lengths = turn.lengths[0]
    assert lengths is not None and turn.lengths[1] is None
    words = "Pay Rs. 5,00,000 by 15/08/2026.".split()
    assert lengths[0] == 3 and lengths[4] > len(words[4]) and max(lengths) == lengths[4]


async def test_off_sends_the_text_as_written_and_the_environment_sets_the_default():
    async with fake_pipeline() as p:
        asked = _spy(p)
        await _turn(p, ["Pay Rs. 5,00,000 now."], text_normalization="off")
    assert asked == ["Pay Rs. 5,00,000 now."]


async def test_any_split_into_deltas_gives_the_same_chunks():
    results = []
    for deltas in ([TEXT], list(TEXT), [TEXT[:7], TEXT[7:15], TEXT[15:]],
                   re.findall(r"\S+\s*", TEXT)):
        async with fake_pipeline() as p:
            asked = _spy(p)
            tts = veena.TTS(pipeline=p, max_tokens_per_chunk=28)
            stream = tts.stream()
            for d in deltas:
                stream.push_text(d)
            stream.end_input()
            async for _ in stream:
                pass
            await stream.aclose()
            results.append(asked)
    assert all(sorted(r) == sorted(results[0]) for r in results), results
    assert "five lakh rupees" in " ".join(results[0])


async def test_a_normaliser_that_raises_leaves_the_turn_speaking(monkeypatch, caplog):
    def broken(self, text):
        raise RuntimeError("grammar exploded")

    monkeypatch.setattr(TextNormalizer, "normalize", broken)
    before = normalizer_module.failures()
    async with fake_pipeline() as p:
        asked = _spy(p)
        with caplog.at_level(logging.WARNING):
            await _turn(p, ["Pay Rs. 500 now.", "Hello there."])
    assert sorted(asked) == ["Hello there.", "Pay Rs. 500 now."]  # spoken as written
    assert normalizer_module.failures() == before + 1  # the second chunk needs none
    assert any("normalisation failed" in r.getMessage() for r in caplog.records)


async def test_pronunciations_of_a_turn_and_of_the_plugin():
    async with fake_pipeline() as p:
        asked = _spy(p)
        await _turn(p, ["We ship SQL on LiveKit."], pronunciations={"SQL": "sequel"})
        tts = veena.TTS(pipeline=p, pronunciations={"livekit": "live kit"},
                        max_tokens_per_chunk=28)
        await tts.synthesize("LiveKit rocks.").collect()
        with pytest.raises(ValueError, match="pronunciation"):
            tts.update_options(pronunciations={"x": "<laugh>"})
        with pytest.raises(ValueError, match="text_normalization"):
            veena.TTS(pipeline=p, text_normalization="maybe")
    assert asked == ["We ship sequel on LiveKit.", "live kit rocks."]


@pytest.mark.parametrize("field, value", [
    ("text_normalization", "on"), ("text_normalization", True),
    ("pronunciations", ["SQL"]), ("pronunciations", {"SQL": 5}), ("pronunciations", {"": "x"}),
])
def test_the_server_refuses_bad_normalisation_fields(field, value):
    import json

    with pytest.raises(ProtocolError) as e:
        parse_client_message(json.dumps({"type": "speak", "context_id": "c", "text": "hi",
                                         field: value}))
    assert e.value.code == "bad_field"


SAID = "₹12,35,000 was paid on 05/09/2026."
READ = ("twelve lakh thirty five thousand rupees was paid on the fifth of september twenty "
        "twenty six.")


@pytest.mark.skipif(not grammars.available(), reason="nemo-text-processing is not installed")
@pytest.mark.parametrize("mode, read", [("auto", READ), ("off", SAID)])
def test_say_sends_the_engine_the_normalised_prompt_and_logs_it(tmp_path, monkeypatch, caplog,
                                                                mode, read):
    from livekit.plugins.veena import cli
    from livekit.plugins.veena.models import loading
    from livekit.plugins.veena.models.profiles import VEENA
    from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions

    from ..fakes import STOP, ScriptedEngine, ToneCodec, frames

    made: list[Pipeline] = []

    def fake_load(model, **kw):
        made.append(Pipeline(ScriptedEngine([frames([[1] * 7] * 3) + [STOP]]), ToneCodec(),
                             VEENA, PipelineOptions()))
        return made[-1]

    monkeypatch.setattr(loading, "load_pipeline", fake_load)
    with caplog.at_level(logging.DEBUG):
        assert cli.main(["say", SAID, "--model", str(tmp_path), "--profile", "veena", "-v",
                         "--text-normalization", mode, "-o", str(tmp_path / "x.wav")]) == 0
    p = made[0]
    ((_, prompt, _),) = p.engine.requests
    assert prompt == p.family.prompt(p.engine.tokenizer, read, VEENA.default_voice, None)
    # -v: the line as the log format prints it (its message: no extras) has the text read
    logged = [r.getMessage() for r in caplog.records if str(r.msg).startswith("normalised text")]
    assert logged == ([f"normalised text [say]: {SAID!r} -> {READ!r}"] if mode == "auto" else [])


async def test_the_server_counts_normalisation_failures(monkeypatch):
    from livekit.plugins.veena.server.metrics import ServerMetrics

    def broken(self, text):
        raise RuntimeError("grammar exploded")

    monkeypatch.setattr(TextNormalizer, "normalize", broken)
    m = ServerMetrics()
    try:
        before = m.registry.get_sample_value("veena_normalization_failures_total")
        async with fake_pipeline() as p:
            await _turn(p, ["Pay Rs. 500 now."])
        assert m.registry.get_sample_value("veena_normalization_failures_total") == before + 1
    finally:
        m.close()


async def test_grammars_are_prepared_by_download_and_prewarm(tiny_model_dir, monkeypatch):
    """``veena-tts download`` (like ``download-files``) and ``prewarm()`` compile or load
    the grammars ahead of the first turn; with normalisation off they leave them."""
    from livekit.plugins.veena import cli

    asked: list[str] = []
    monkeypatch.setattr(grammars, "available", lambda: True)
    monkeypatch.setattr(grammars, "grammar", lambda language: asked.append(language))
    assert await asyncio.to_thread(cli.main, ["download", tiny_model_dir]) == 0
    assert asked == list(grammars.LANGUAGES)
    asked.clear()
    async with fake_pipeline() as p:
        veena.TTS(pipeline=p).prewarm()
        while not asked:  # the prewarm runs in the background
            await asyncio.sleep(0.01)
    assert asked == ["hi", "en"]  # Veena's languages
    asked.clear()
    monkeypatch.setenv("VEENA_TEXT_NORMALIZATION", "off")
    assert await asyncio.to_thread(cli.main, ["download", tiny_model_dir]) == 0
    assert asked == []
