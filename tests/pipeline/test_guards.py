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
    RunGuards,
    SilenceMeter,
    fade_out,
    guard_counts,
    spoken_length,
    step_key,
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


def _loops_by_definition(keys, repeats, min_period, max_period):
    """Per step, what a loop detector must answer, straight from the definition: the
    smallest period whose last ``(repeats - 1) * p`` steps each equal the one ``p`` before
    (a held sound, below ``min_period``: None), as the index where its second copy starts."""
    out = []
    for n in range(len(keys)):
        answer = None
        for p in range(1, max_period + 1):
            run = 0
            while n - run - p >= 0 and keys[n - run] == keys[n - run - p]:
                run += 1
            if run >= (repeats - 1) * p:
                answer = None if p < min_period else n + 1 - run
                break
        out.append(answer)
    return out


def test_the_loop_detector_answers_as_its_definition_on_plain_ints():
    rng = np.random.default_rng(5)
    for alphabet, length in ((3, 600), (8, 1500), (4096, 1500)):
        keys = rng.integers(0, alphabet, length).tolist()
        phrase = rng.integers(0, alphabet, 7).tolist()
        keys[100:100 + 28] = phrase * 4  # a planted loop among chance repeats
        keys[400:440] = [keys[399]] * 40  # and a held sound
        d = LoopDetector(repeats=3, min_period=3, max_period=20)
        assert [d.push(k) for k in keys] == _loops_by_definition(keys, 3, 3, 20)


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


def test_silence_past_the_limit_is_dropped_across_pushes_and_the_sound_after_it_kept():
    m = SilenceMeter(seconds=1.0, dbfs=-45.0, sample_rate=1000)
    loud = np.full(10, 0.5, np.float32)
    quiet = np.full(400, 0.001, np.float32)

    def same(got, want):
        return np.array_equal(got[0], want) and got[1]

    assert m.trim(np.concatenate([loud, quiet]))[1] == 0
    assert m.trim(np.concatenate([quiet, loud]))[1] == 0  # 800 in a row, then sound
    assert m.trim(quiet)[1] == 0
    assert m.trim(np.concatenate([quiet, quiet[:199]]))[1] == 0  # 999
    out, cuts = m.trim(np.concatenate([quiet, loud]))  # 1000 kept, 399 dropped, the sound
    assert cuts == 1 and np.array_equal(out, np.concatenate([quiet[:1], loud]))
    inside = SilenceMeter(seconds=1.0, dbfs=-45.0, sample_rate=1000)
    pause = np.concatenate([loud, np.zeros(1500, np.float32), loud * 0.9])
    out, cuts = inside.trim(pause)
    assert cuts == 1 and len(out) == 10 + 1000 + 10 and out[-1] == pause[-1]
    lead = SilenceMeter(seconds=1.0, dbfs=-45.0, sample_rate=1000)
    out, cuts = lead.trim(np.concatenate([np.zeros(2500, np.float32), loud]))
    assert cuts == 1 and len(out) == 1010 and np.array_equal(out[-10:], loud)
    tail = SilenceMeter(seconds=1.0, dbfs=-45.0, sample_rate=1000)
    assert tail.trim(np.concatenate([loud, np.zeros(1200, np.float32)]))[0].size == 1010
    assert tail.trim(np.zeros(300, np.float32)) == (pytest.approx([]), 0)  # one stretch: one cut
    assert np.array_equal(tail.trim(loud)[0], loud)


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
    ("loop_min_s", float("nan")), ("loop_min_s", 0.0), ("loop_min_s", 0.05),
    ("loop_max_s", 0.1), ("silence_dbfs", 3.0),
    ("runaway_s_per_char", float("inf")), ("fade_ms", "20"),
])
def test_options_are_checked(field, value):
    with pytest.raises(ValueError, match=field):
        GuardOptions(**{field: value}).validate()


def test_a_held_sound_is_no_loop_at_the_shortest_loop_min_s_on_any_codec():
    """``loop_min_s`` 0 validated once and made one step held (silence) a loop."""
    for steps_per_s in (STEPS_PER_S, 50.0):  # SNAC frames, BiCodec / NeuCodec tokens
        g = RunGuards(GuardOptions(loop_min_s=0.1).validate(), steps_per_s, RATE, None)
        held = [np.array([0, 1, 2, 3, 4, 5, 6])] * 200
        assert all(g.steps(held[:i + 1], 1) is None for i in range(200))


def test_a_frame_is_keyed_by_every_code():
    a, b = np.array([5, 1, 2, 3, 4, 5, 6]), np.array([5, 1, 2, 3, 4, 5, 7])
    assert step_key(a) != step_key(b) and step_key(a) == step_key(a.copy())
    assert step_key(17) == 17


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


@pytest.mark.parametrize("text, length", [
    ("Hi there.", 9),
    ("今天天气很好我们去公园", 33),  # a Han character is a syllable: three letters' time
])
async def test_a_runaway_is_cut_at_the_chunks_bound_with_a_fade_and_counted(text, length):
    """The engine's own budget lies past the bound, so the guard ends a runaway (Chinese
    was cut by ``max_tokens`` first, with no fade and no count)."""
    engine = ScriptedEngine([frames(_random_frames(300, 7)) + [STOP]])
    turn, audio = await _speak(engine, text, sampling=SamplingOptions())  # the default budget
    assert [g for g, _ in turn.guard_log.fired] == ["runaway"]
    assert spoken_length(text) == length
    bound = math.ceil((1.5 + VEENA.runaway_s_per_char * length) * STEPS_PER_S)
    assert len(audio) == bound * SPP  # everything decoded so far was within the bound
    assert audio[-1] == 0 and np.abs(audio[-480:]).max() < 0.5 <= np.abs(audio[:-480]).max()
    assert engine.aborted and engine.requests[0][2].max_tokens > 7 * bound


async def test_slow_mandarin_within_its_bound_is_heard_whole():
    """20 syllables at 0.32 s each (a slow speaker): within 1.5 s + 3 x 0.1 s each."""
    text = "今天天气很好我们一起去公园散步然后回家"
    frames_spoken = math.ceil(0.32 * len(text) * STEPS_PER_S)
    engine = ScriptedEngine([frames(_random_frames(frames_spoken, 21)) + [STOP]])
    turn, audio = await _speak(engine, text, sampling=SamplingOptions())
    assert turn.guard_log.fired == [] and len(audio) == frames_spoken * SPP


@pytest.mark.parametrize("before, silent, after", [
    (10, 30, 12),  # "Please hold... [2.56 s] ...thanks": the second clause is heard
    (0, 30, 20),  # 2.56 s of silence before the first word: the chunk still speaks
    (10, 60, 0),  # a silent tail: trimmed, and the chunk ends where the model stopped
])
async def test_a_long_silence_is_trimmed_and_the_chunk_goes_on(before, silent, after):
    pause = [[0] + row[1:] for row in _random_frames(silent, 8)]  # decodes to silence
    script = frames(_random_frames(before, 9) + pause + _random_frames(after, 10)) + [STOP]
    engine = ScriptedEngine([script])
    turn, audio = await _speak(engine, TEXT)
    assert [g for g, _ in turn.guard_log.fired] == ["silence"]
    assert engine.aborted == [] and engine.tokens_out == len(script)  # nothing cut short
    # the pause kept to 2 s (the tone after it starts at a zero crossing: a silent sample)
    assert len(audio) == (before + after) * SPP + 2 * RATE - (after > 0)
    loud = np.flatnonzero(np.abs(audio) > 0.01)
    if after:  # every frame after the pause is heard, right after its 2 s
        assert loud[-1] >= len(audio) - SPP and len(loud) > (before + after - 1) * SPP * 0.9


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


@pytest.mark.parametrize("per_char", ["", "0.1"])
async def test_a_budget_of_the_callers_own_has_no_runaway_bound(per_char, monkeypatch):
    """Whether the seconds per character come from the profile or from
    ``VEENA_GUARD_RUNAWAY_S_PER_CHAR``: a ``max_tokens`` the caller gives is theirs."""
    from livekit.plugins.veena.models.loading import pipeline_options_from_env

    monkeypatch.setenv("VEENA_GUARD_RUNAWAY_S_PER_CHAR", per_char)
    options = pipeline_options_from_env().guards
    text = "Hi there, good day."  # the bound: 3.4 s (40 frames)
    engine = ScriptedEngine([frames(_random_frames(300, 16)) + [STOP]])
    turn, audio = await _speak(engine, text, options=options,
                               sampling=SamplingOptions(max_tokens=7 * 60))
    assert turn.guard_log.fired == [] and len(audio) == 60 * SPP
    assert engine.requests[0][2].max_tokens == 7 * 60


async def test_no_no_no_no_spoken_as_four_different_code_runs_is_no_loop():
    """The loop guard compares codes, not text: "No." four times is four different runs
    (here alike in their first codebook, with the same pause between them), never a loop;
    the same run of codes over and over is one."""
    rng = np.random.default_rng(30)
    contour = rng.integers(1, 4096, 5)  # the same coarse codes in every "No."

    def no(seed):
        detail = np.random.default_rng(seed).integers(0, 4096, (5, 6))
        return [[int(c)] + d.tolist() for c, d in zip(contour, detail)]

    pause = [[0, 1, 2, 3, 4, 5, 6]] * 4  # one held silent frame, the same every time
    spoken = no(31) + pause + no(32) + pause + no(33) + pause + no(34)
    engine = ScriptedEngine([frames(spoken) + [STOP]])
    turn, audio = await _speak(engine, "No. No. No. No.")
    assert turn.guard_log.fired == [] and len(audio) == len(spoken) * SPP
    stuck = no(31) + pause
    engine = ScriptedEngine([frames(stuck * 12) + [STOP]])
    turn, audio = await _speak(engine, "No. No. No. No.", sampling=SAMPLING)
    assert [g for g, _ in turn.guard_log.fired] == ["loop"]
    assert len(stuck) <= len(audio) // SPP <= 3 * len(stuck)


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
    monkeypatch.setenv("VEENA_GUARD_LOOP_REPEATS", "3")
    monkeypatch.setenv("VEENA_GUARD_LOOP_MIN_S", "0")  # held silence would be a "loop"
    with pytest.raises(ValueError, match="VEENA_GUARD_LOOP_MIN_S"):
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
