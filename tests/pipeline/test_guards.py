"""The guards against a model going wrong inside a chunk, each driven through the real
pipeline (turn, run, planner, scheduler, stitcher) by a scripted engine whose token stream
is the failure: a loop, an empty stop, a runaway, a silent stretch. Each fires exactly there,
and never on a normal stream."""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import numpy as np
import pytest

from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.pipeline import guards as guards_module
from livekit.plugins.veena.pipeline.engine import SamplingOptions
from livekit.plugins.veena.pipeline.guards import (
    GuardOptions,
    LoopDetector,
    SilenceMeter,
    fade_out,
    guard_counts,
    spoken_length,
)
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions
from livekit.plugins.veena.pipeline.turn import Turn, TurnOptions

from ..fakes import STOP, FakeEngine, LevelCodec, ScriptedEngine, frames

pytestmark = pytest.mark.guards

SPP, RATE = 2048, 24000
STEPS_PER_S = RATE / SPP
SAMPLING = SamplingOptions(max_tokens=7 * 400)
"""A budget of the caller's (Veena's card cap applies to the default budget only)."""


def _random_frames(n: int, seed: int, lo: int = 1) -> list[list[int]]:
    """``n`` frames of random codes, none silent (first code >= ``lo``) nor repeating."""
    return np.random.default_rng(seed).integers(lo, 4096, (n, 7)).tolist()


UNCAPPED = replace(VEENA, card_max_new_tokens=None)
"""Veena's layout without its card's cap (tighter than the runaway bound below 110
characters): the default budget is the per-character one."""


async def _speak(engine, text: str, *, options: GuardOptions = GuardOptions(),
                 chunks: list[str] | None = None, sampling: SamplingOptions = SAMPLING):
    p = Pipeline(engine, LevelCodec(), UNCAPPED, PipelineOptions(guards=options))
    await p.start()
    turn = Turn(p, TurnOptions(voice=VEENA.default_voice, sampling=sampling, seed=7))
    out: list[np.ndarray] = []

    async def text_source():
        for c in chunks or [text]:
            yield c

    try:
        await turn.speak(text_source(), out.append)
    finally:
        await p.aclose()
    return turn, (np.concatenate(out) if out else np.zeros(0, np.float32))


# -- the checks alone ----------------------------------------------------------------------
def test_a_loop_is_found_when_its_last_copy_completes_and_not_before():
    rng = np.random.default_rng(0)
    head, phrase = rng.integers(0, 10**6, 20).tolist(), rng.integers(0, 10**6, 6).tolist()
    seq = head + phrase * 5
    d = LoopDetector(repeats=3, min_period=3, max_period=36)
    found = [i for i, key in enumerate(seq) if d.push(key) is not None]
    # third copy complete at index 20 + 18 - 1; the loop's second copy starts at 26
    assert found[0] == 20 + 18 - 1
    d = LoopDetector(repeats=3, min_period=3, max_period=36)
    assert [d.push(k) for k in seq][20 + 18 - 1] == 26


def test_a_held_sound_or_a_short_or_long_repeat_is_not_a_loop():
    held = LoopDetector(repeats=3, min_period=3, max_period=36)
    assert all(held.push(5) is None for _ in range(200))  # one step held: silence's job
    short = LoopDetector(repeats=3, min_period=3, max_period=36)
    assert all(short.push(k) is None for k in [1, 2] * 100)  # period 2 < 3
    long = LoopDetector(repeats=3, min_period=3, max_period=10)
    phrase = list(range(100, 120))  # period 20 > 10: looked for no further
    assert all(long.push(k) is None for k in phrase * 4)
    rnd = LoopDetector(repeats=3, min_period=3, max_period=36)
    keys = np.random.default_rng(1).integers(0, 4096, 20000).tolist()
    assert all(rnd.push(k) is None for k in keys)


def test_silence_is_counted_across_pushes_and_reset_by_sound():
    m = SilenceMeter(seconds=1.0, dbfs=-45.0, sample_rate=1000)
    loud = np.full(10, 0.5, np.float32)
    quiet = np.full(400, 0.001, np.float32)
    assert m.push(np.concatenate([loud, quiet])) is None
    assert m.push(np.concatenate([quiet, loud])) is None  # 800 in a row, then sound
    assert m.push(quiet) is None
    assert m.push(np.concatenate([quiet, quiet[:199]])) is None  # 999
    assert m.push(quiet) == 1  # 1000 reached after its first sample
    inside = SilenceMeter(seconds=1.0, dbfs=-45.0, sample_rate=1000)
    assert inside.push(np.concatenate([loud, np.zeros(1500, np.float32), loud])) == 1010
    tail = SilenceMeter(seconds=1.0, dbfs=-45.0, sample_rate=1000)
    assert tail.push(np.concatenate([loud, np.zeros(1200, np.float32)])) == 1010


def test_a_fade_ends_at_zero_and_leaves_the_rest():
    pcm = np.ones(100, np.float32)
    faded = fade_out(pcm, 20)
    assert faded[-1] == 0 and np.all(faded[:80] == 1) and np.all(np.diff(faded[80:]) < 0)
    assert np.all(pcm == 1)  # a copy
    assert fade_out(pcm[:5], 20)[-1] == 0


def test_a_han_character_takes_three_letters_time():
    assert spoken_length("ab c") == 4 and spoken_length("你好") == 6


@pytest.mark.parametrize("field, value", [
    ("empty_tokens", True), ("empty_tokens", -1), ("loop_repeats", 1),
    ("loop_min_s", float("nan")), ("loop_max_s", 0.1), ("silence_dbfs", 3.0),
    ("runaway_s_per_char", float("inf")), ("fade_ms", "20"),
])
def test_options_are_checked(field, value):
    with pytest.raises(ValueError, match=field):
        GuardOptions(**{field: value}).validate()


# -- through the pipeline ------------------------------------------------------------------
TEXT = ("Your order of three blue notebooks ships on Monday, and it should arrive "
        "by Thursday afternoon at the latest.")


async def test_a_loop_is_cut_within_its_repeats_and_the_request_aborted():
    head, phrase = _random_frames(20, 1), _random_frames(6, 2)
    script = frames(head + phrase * 12 + _random_frames(10, 3)) + [STOP]
    engine = ScriptedEngine([script])
    turn, audio = await _speak(engine, TEXT)
    assert [g for g, _ in turn.guard_log.fired] == ["loop"]
    steps = len(audio) // SPP
    # heard: the text before the loop and its first copy, at most its three copies
    assert 20 + 6 <= steps <= 20 + 3 * 6
    assert engine.aborted == [engine.requests[0][0]]  # generation stopped there
    assert engine.tokens_out < len(script)
    assert audio[-1] == 0 and abs(audio[-500]) < 0.5  # cut with a fade


async def test_an_empty_first_generation_is_asked_again_with_the_same_prompt_and_the_turn_speaks():
    script = frames(_random_frames(30, 4)) + [STOP]
    engine = ScriptedEngine([[STOP], script])
    turn, audio = await _speak(engine, TEXT)
    assert [g for g, _ in turn.guard_log.fired] == ["empty"]
    (rid1, prompt1, s1), (rid2, prompt2, s2) = engine.requests
    assert rid2 == f"{rid1}.retry" and prompt1 == prompt2  # the same speaker prompt
    assert s1.seed != s2.seed and s1.max_tokens == s2.max_tokens
    assert len(audio) == 30 * SPP


async def test_no_audio_within_the_guards_tokens_stops_the_request_and_asks_again():
    junk = [7] * 500  # a text token, over and over: never a frame
    engine = ScriptedEngine([junk, frames(_random_frames(30, 5)) + [STOP]], delta=1)
    turn, audio = await _speak(engine, TEXT, options=GuardOptions(empty_tokens=40))
    assert [g for g, _ in turn.guard_log.fired] == ["empty"]
    assert engine.aborted == [engine.requests[0][0]]
    assert engine.tokens_out == 40 + 30 * 7 + 1
    assert len(audio) == 30 * SPP


async def test_an_empty_retry_ends_the_chunk_and_the_next_chunk_still_speaks():
    engine = ScriptedEngine({"fake-0": [STOP], "fake-0.retry": [STOP],
                             "*": frames(_random_frames(30, 6)) + [STOP]})
    turn, audio = await _speak(engine, "", chunks=["First sentence here.",
                                                   "Second sentence, spoken."])
    assert turn.guard_log.fired == [("empty", "fake-0"), ("empty", "fake-0")]
    assert sorted(r[0] for r in engine.requests) == ["fake-0", "fake-0.retry", "fake-1"]
    assert len(audio) == 30 * SPP


async def test_a_runaway_is_cut_at_the_profiles_bound_with_a_fade():
    text = "Hi there."
    engine = ScriptedEngine([frames(_random_frames(300, 7)) + [STOP]])
    turn, audio = await _speak(engine, text, sampling=SamplingOptions())  # the default budget
    assert [g for g, _ in turn.guard_log.fired] == ["runaway"]
    bound = math.ceil((1.5 + VEENA.runaway_s_per_char * len(text)) * STEPS_PER_S)
    assert len(audio) == bound * SPP  # everything decoded so far was within the bound
    assert audio[-1] == 0 and np.abs(audio[-480:]).max() < 0.5 <= np.abs(audio[:-480]).max()
    assert engine.aborted


async def test_a_long_silence_inside_a_chunk_is_cut_on_the_decoded_audio():
    silent = [[0] + row[1:] for row in _random_frames(60, 8)]  # 5 s that decode to silence
    script = frames(_random_frames(10, 9) + silent + _random_frames(20, 10)) + [STOP]
    engine = ScriptedEngine([script])
    turn, audio = await _speak(engine, TEXT)
    assert [g for g, _ in turn.guard_log.fired] == ["silence"]
    loud = np.flatnonzero(np.abs(audio) > 0.01)
    assert loud[-1] < 10 * SPP  # nothing after the silence is heard
    assert len(audio) == 10 * SPP + 2 * RATE  # the silence heard up to the guard's limit


async def test_normal_streams_fire_no_guard():
    """Speech as long as a speaker takes (0.075 s a character), then a stop, on the default
    budget; a paced pause under the silence limit; the fake engine's random frames."""
    spoken = math.ceil(0.075 * len(TEXT) * STEPS_PER_S)
    natural = ScriptedEngine([frames(_random_frames(spoken, 18)) + [STOP]])
    turn0, audio0 = await _speak(natural, TEXT, sampling=SamplingOptions())
    assert turn0.guard_log.fired == [] and len(audio0) == spoken * SPP
    engine = FakeEngine()
    turn, audio = await _speak(engine, TEXT)
    pause = [[0] + row[1:] for row in _random_frames(15, 11)]  # 1.3 s of silence
    turn2, audio2 = await _speak(
        ScriptedEngine([frames(_random_frames(20, 12) + pause + _random_frames(20, 13))
                        + [STOP]]), TEXT)
    assert turn.guard_log.fired == [] and turn2.guard_log.fired == []
    assert len(audio) == engine.tokens_out // 7 * SPP > 0 and len(audio2) == 55 * SPP


async def test_each_guard_warns_once_per_turn_with_its_request_id_and_counts_every_firing(caplog):
    phrase = _random_frames(6, 14)
    loops = [frames(_random_frames(5, 20 + i) + phrase * 5) + [STOP] for i in range(3)]
    before = guard_counts()["loop"]
    with caplog.at_level(logging.WARNING, logger=guards_module.__name__):
        turn, _ = await _speak(ScriptedEngine(loops), "",
                               chunks=["One, two.", "Three, four.", "Five, six."])
    assert [g for g, _ in turn.guard_log.fired] == ["loop"] * 3
    assert guard_counts()["loop"] == before + 3
    warned = [r for r in caplog.records if getattr(r, "guard", None) == "loop"]
    assert len(warned) == 1 and warned[0].request_id == turn.guard_log.fired[0][1]


async def test_a_budget_of_the_callers_own_has_no_runaway_bound():
    text = "Hi there, good day."  # runaway past 3.4 s (40 frames), budget 5.8 s
    engine = ScriptedEngine([frames(_random_frames(300, 16)) + [STOP]])
    turn, audio = await _speak(engine, text, sampling=SamplingOptions(max_tokens=7 * 60))
    assert turn.guard_log.fired == [] and len(audio) == 60 * SPP


async def test_guards_set_to_zero_are_off():
    phrase = _random_frames(6, 15)
    off = GuardOptions(loop_repeats=0, silence_s=0, empty_tokens=0, runaway_s_per_char=0)
    silent = [[0] + row[1:] for row in _random_frames(40, 17)]
    engine = ScriptedEngine([frames(phrase * 10 + silent) + [STOP]])
    turn, audio = await _speak(engine, "Hi there, good day.", options=off,
                               sampling=SamplingOptions())
    assert turn.guard_log.fired == [] and len(audio) == engine.tokens_out // 7 * SPP
    assert len(audio) > 60 * SPP  # the loop, the silence and past the runaway bound
    engine = ScriptedEngine([[STOP]])
    turn, audio = await _speak(engine, "Hi there, good day.", options=off)
    assert turn.guard_log.fired == [] and len(engine.requests) == 1 and len(audio) == 0


def test_each_guard_is_set_from_its_environment_variable(monkeypatch):
    from livekit.plugins.veena.models.loading import pipeline_options_from_env

    assert pipeline_options_from_env().guards == GuardOptions()
    monkeypatch.setenv("VEENA_GUARD_LOOP_REPEATS", "5")
    monkeypatch.setenv("VEENA_GUARD_RUNAWAY_S_PER_CHAR", "0.2")
    monkeypatch.setenv("VEENA_GUARD_SILENCE_S", "0")
    g = pipeline_options_from_env().guards
    assert (g.loop_repeats, g.runaway_s_per_char, g.silence_s) == (5, 0.2, 0.0)
    monkeypatch.setenv("VEENA_GUARD_LOOP_REPEATS", "1")
    with pytest.raises(ValueError, match="VEENA_GUARD_LOOP_REPEATS"):
        pipeline_options_from_env()


def test_the_server_counts_each_guard():
    from livekit.plugins.veena.pipeline.guards import GuardLog
    from livekit.plugins.veena.server.metrics import ServerMetrics

    def count(m, guard):
        return m.registry.get_sample_value("veena_guard_fired_total", {"guard": guard}) or 0

    m = ServerMetrics()
    try:
        before = count(m, "silence"), count(m, "empty")
        log = GuardLog()
        log.fire("silence", "r-1")
        log.fire("silence", "r-2")
        assert (count(m, "silence"), count(m, "empty")) == (before[0] + 2, before[1])
    finally:
        m.close()
    log.fire("silence", "r-3")  # closed: no longer counted there
    assert count(m, "silence") == before[0] + 2


class _BiCodecTokenizer:
    """BiCodec's token strings at fixed ids (globals from 1000, semantic from 6000), any other
    text as bytes."""

    def get_vocab(self) -> dict[str, int]:
        vocab = {f"<|bicodec_global_{i}|>": 1000 + i for i in range(4096)}
        vocab.update({f"<|bicodec_semantic_{i}|>": 6000 + i for i in range(8192)})
        vocab.update({"<|end_semantic_token|>": 998, "<|im_end|>": 999})
        return vocab

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1 + b % 250 for b in text.encode()]


class _BiCodecTone:
    """BiCodec's shape (16 kHz, 320 samples per semantic token), one quiet tone."""

    name, sample_rate, samples_per_step = "bicodec-tone", 16000, 320

    def decode(self, batch):
        return [np.full(len(b.codes) * 320, 0.2, np.float32) for b in batch]

    def warmup(self) -> None:
        pass


async def test_a_retry_keeps_the_captured_globals_the_voice_of_a_bicodec_call():
    from livekit.plugins.veena.models.profiles import VEENA3

    globals_ = list(range(5, 37))
    engine = ScriptedEngine({"fake-0.globals": [1000 + g for g in globals_], "fake-0": [998],
                             "fake-0.retry": [6000 + t for t in range(60)] + [998]}, delta=1)
    engine.tokenizer = _BiCodecTokenizer()
    p = Pipeline(engine, _BiCodecTone(), VEENA3, PipelineOptions())
    await p.start()
    turn = Turn(p, TurnOptions(voice=VEENA3.default_voice, sampling=SAMPLING, seed=3))
    out: list[np.ndarray] = []

    async def text():
        yield "यह एक वाक्य है।"

    try:
        await turn.speak(text(), out.append)
    finally:
        await p.aclose()
    assert [g for g, _ in turn.guard_log.fired] == ["empty"]
    (rid0, _, _), (rid1, main, _), (rid2, retry, _) = engine.requests
    assert (rid0, rid1, rid2) == ("fake-0.globals", "fake-0", "fake-0.retry")
    assert retry == main  # the same prompt, the captured globals in it
    assert turn.speaker_globals == tuple(globals_) and sum(map(len, out)) == 60 * 320
