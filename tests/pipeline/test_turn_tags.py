"""A turn's gate for expressive tags (fake engine, no vLLM): the prompt the engine reads keeps
the profile's tags and loses every other one (special-token forms too), a chunk left empty
asks the engine for nothing, transcripts carry no tag, the first removal of a turn logs one
warning, and every removal is counted."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace

import numpy as np
import pytest

from livekit.plugins.veena.models.profiles import VEENA, with_overrides
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions
from livekit.plugins.veena.pipeline.transcripts import word_timings
from livekit.plugins.veena.pipeline.turn import Turn, TurnOptions, unknown_tags_removed

from ..fakes import FakeEngine, ToneCodec

TAGGED = with_overrides(VEENA, name="veena-tagged", tags=("laugh", "sigh"))
FRAMES = 4  # SNAC frames per chunk (28 tokens)


def prompt_text(prompt) -> str:
    """The words of a prompt: the fake tokenizer maps an ASCII byte b to b + 1, and every
    other id of the prompt is a special token of the profile."""
    return bytes(i - 1 for i in prompt if i < 256).decode()


@contextlib.asynccontextmanager
async def tagged_pipeline(profile=TAGGED):
    """A started pipeline over the fake engine; yields it and the prompts' words, in order."""
    p = Pipeline(FakeEngine(), ToneCodec(), profile, PipelineOptions())
    prompts: list[str] = []
    generate = p.engine.generate

    def spy(prompt, sampling, request_id=None):
        prompts.append(prompt_text(prompt))
        return generate(prompt, sampling, request_id)

    p.engine.generate = spy
    await p.start()
    try:
        yield p, prompts
    finally:
        await p.aclose()


def _turn(p) -> Turn:
    sampling = replace(p.sampling.defaults(), max_tokens=7 * FRAMES)
    return Turn(p, TurnOptions(voice="kavya", sampling=sampling, seed=5))


async def _texts(*chunks):
    for c in chunks:
        yield c


async def _speak(turn: Turn, *chunks) -> tuple[list[str], int]:
    """Speak ``chunks``; the words each chunk reported, and the samples pushed."""
    spoken, pushed = [], []
    turn.on_chunk_spoken = lambda text, a, b, lengths: spoken.append(text)
    await turn.speak(_texts(*chunks), pushed.append)
    return spoken, sum(len(x) for x in pushed)


async def test_the_prompt_keeps_known_tags_and_loses_the_rest():
    async with tagged_pipeline() as (p, prompts):
        turn = _turn(p)
        spoken, _ = await _speak(turn, "Hello <laugh> there <happy>, friend.",
                                 "<|eot_id|>Second <SIGH> chunk <custom_token_5>.")
        assert prompts == ["<spk_kavya> Hello <laugh> there, friend.",
                           "<spk_kavya> Second <sigh> chunk."]
        assert spoken == ["Hello there, friend.", "Second chunk."]
        assert len(turn.request_ids) == 2


async def test_a_profile_without_tags_reads_none():
    async with tagged_pipeline(VEENA) as (p, prompts):
        spoken, _ = await _speak(_turn(p), "<sigh> Well <laugh> then.")
        assert prompts == ["<spk_kavya> Well then."] and spoken == ["Well then."]


async def test_a_chunk_left_empty_asks_the_engine_for_nothing():
    async with tagged_pipeline() as (p, prompts):
        turn = _turn(p)
        spoken, samples = await _speak(turn, "<happy>", "Hello.", "<|eot_id|> <x>", "<laugh>")
        assert prompts == ["<spk_kavya> Hello.", "<spk_kavya> <laugh>"]
        assert len(turn.request_ids) == 2 and not p.engine.live
        # a chunk of only a known tag is performed, but has no words for the transcript
        assert spoken == ["Hello."]
        assert samples == 2 * FRAMES * ToneCodec.samples_per_step - 360  # one 15 ms seam


async def test_transcripts_carry_no_tag():
    async with tagged_pipeline() as (p, _):
        turn = _turn(p)
        words = []
        turn.on_chunk_spoken = lambda text, a, b, lengths: words.extend(
            word_timings(text, a, b, lengths))
        await turn.speak(_texts("<sigh> Fine, <laugh> really.", "Bye <gasp> now! <laugh>"),
                         lambda pcm: None)
        assert [w.text for w in words] == ["Fine, ", "really. ", "Bye ", "now! "]
        assert np.all(np.diff([w.start for w in words]) >= 0)
    assert [w.text for w in word_timings("<laugh> a <happy> b <laugh>", 0, 1)] == ["a ", "b "]


async def test_one_warning_per_turn_and_every_removal_counted(caplog):
    caplog.set_level(logging.WARNING, logger="livekit.plugins.veena")
    async with tagged_pipeline() as (p, _):
        before = unknown_tags_removed()
        await _speak(_turn(p), "One <happy> two <sad>.", "Three <|eot_id|>.", "Four <laugh>.")
        assert unknown_tags_removed() == before + 3
        (record,) = [r for r in caplog.records if hasattr(r, "removed_tags")]
        assert record.levelno == logging.WARNING
        assert record.removed_tags == ["<happy>", "<sad>"]
        assert record.profile == "veena-tagged" and record.request_id.startswith("fake-")
        # the next turn warns again, once; a turn with nothing to remove says nothing
        await _speak(_turn(p), "Five <happy>.", "Six <happy>.")
        await _speak(_turn(p), "Seven <laugh>.")
        assert unknown_tags_removed() == before + 5
        warned = [r.removed_tags for r in caplog.records if hasattr(r, "removed_tags")]
        assert warned == [["<happy>", "<sad>"], ["<happy>"]]


@pytest.mark.engine
async def test_a_first_chunk_left_empty_does_not_stop_a_bicodec_voice(spark_pipeline):
    """BiCodec: later chunks continue the globals of the first chunk with text, even when
    the turn's first chunk held only tags the model does not perform."""
    p = spark_pipeline
    assert p.profile.tags == ()
    turn = Turn(p, TurnOptions(voice="kavya", sampling=replace(p.sampling.defaults(),
                                                               max_tokens=30),
                               seed=3, timeout=60))
    audio = []
    await turn.speak(_texts("<laugh>", "पहला हिस्सा।", "दूसरा <sigh> हिस्सा।"), audio.append)
    assert len(turn.request_ids) == 2 and turn.speaker_globals is not None
    assert turn.chunk_globals == [turn.speaker_globals] * 2
    assert len(np.concatenate(audio)) == 2 * 30 * 320 - 240
