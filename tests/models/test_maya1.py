"""The maya1 profile, its ids written as literals from maya-research/maya1's model card and its
vLLM streaming reference: the prompt is START_OF_HUMAN 128259, BOS 128000, then
``<description="..."> text`` with no special tokens added, then EOT 128009, END_OF_HUMAN
128260, START_OF_AI 128261, START_OF_SPEECH 128257; only END_OF_SPEECH 128258 stops, and
128009, which the prompt carries and which is the tiny model's EOS as in Llama-3 chat models,
must not. A voice is a preset name or a description in words, checked before any engine work.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import wave
from dataclasses import dataclass, replace

import numpy as np
import pytest
from livekit.plugins import veena
from transformers import AutoTokenizer

from livekit.plugins.veena.models.families import family_for
from livekit.plugins.veena.models.profiles import MAYA1
from livekit.plugins.veena.pipeline.engine_options import SamplingOptions
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions

from ..fakes import FakeEngine, ToneCodec

SOH, BOS, EOT, EOH, SOA, SOS, EOS_SPEECH = 128259, 128000, 128009, 128260, 128261, 128257, 128258

TAGS = ("angry", "appalled", "chuckle", "cry", "curious", "disappointed", "excited", "exhale",
        "gasp", "giggle", "gulp", "laugh", "laugh_harder", "mischievous", "sarcastic", "scream",
        "sigh", "sing", "snort", "whisper")
"""The model card's 20 emotion tags."""

DESCRIPTION = "Female, 30s, British accent, calm"
ACCENTED = "Mujer de 30 años, acento andaluz, voz cálida y pausada; très douce"


@pytest.fixture(scope="module")
def tok(tiny_maya1_dir):
    t = AutoTokenizer.from_pretrained(tiny_maya1_dir)
    assert t.eos_token_id == EOT, "the tiny model's EOS is <|eot_id|>, as in Llama-3 chat"
    assert t("x")["input_ids"][0] == BOS, "it prepends BOS, as Llama-3's tokenizer does"
    return t


REF = [BOS, SOH, BOS]
"""How the model card's ids start: its prompt string (SOH, BOS, ...) tokenised with the
tokenizer's specials on, so a tokenizer that prepends BOS puts one more first."""


def _words(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


# -- the prompt ------------------------------------------------------------------------------

def test_prompt_is_the_model_cards_prompt_token_for_token(tok):
    words = _words(tok, f'<description="{DESCRIPTION}"> Hello there, how are you?')
    expected = [*REF, *words, 128009, 128260, 128261, 128257]
    assert MAYA1.build_prompt(tok, "Hello there, how are you?", DESCRIPTION) == expected
    assert family_for(MAYA1).prompt(tok, "Hello there, how are you?", DESCRIPTION,
                                     None) == expected
    assert tok.decode(words) == f'<description="{DESCRIPTION}"> Hello there, how are you?'


def test_a_preset_voice_renders_its_description(tok):
    ava = ("Realistic female voice in her 30s with an American accent. Normal pitch, warm "
           "timbre, conversational pacing.")
    words = _words(tok, f'<description="{ava}"> Good morning.')
    assert MAYA1.build_prompt(tok, "Good morning.", "ava") == [
        *REF, *words, 128009, 128260, 128261, 128257]
    assert MAYA1.default_voice == "ava"
    assert "ava" not in tok.decode(words).split('"')[1], "the preset's words, not its name"


def test_every_tag_is_one_token_and_a_tag_in_the_text_stays_one_token(tok):
    assert MAYA1.tags == TAGS
    ids = {}
    for tag in TAGS:
        (ids[tag],) = _words(tok, f"<{tag}>")  # one token, never split into < tag >
        assert tok.convert_ids_to_tokens(ids[tag]) == f"<{tag}>"
    assert len(set(ids.values())) == 20 and EOT not in ids.values()
    laugh = ids["laugh"]
    prompt = MAYA1.build_prompt(tok, "Hello <laugh> there", DESCRIPTION)
    words = _words(tok, f'<description="{DESCRIPTION}"> Hello <laugh> there')
    assert prompt == [*REF, *words, 128009, 128260, 128261, 128257]
    assert prompt.count(laugh) == 1 and laugh in words
    # <laugh_harder> is its own token, not <laugh> followed by text
    harder = MAYA1.build_prompt(tok, "Ha <laugh_harder> ha", DESCRIPTION)
    assert ids["laugh_harder"] in harder and laugh not in harder


def test_a_description_with_accents_is_encoded_in_the_prompt(tok):
    words = _words(tok, f'<description="{ACCENTED}"> Hola <sigh> amigos')
    prompt = MAYA1.build_prompt(tok, "Hola <sigh> amigos", ACCENTED)
    assert prompt == [*REF, *words, 128009, 128260, 128261, 128257]
    assert tok.decode(words) == f'<description="{ACCENTED}"> Hola <sigh> amigos'
    assert prompt.count(tok.convert_tokens_to_ids("<sigh>")) == 1


# -- sampling --------------------------------------------------------------------------------

def test_default_sampling_is_the_model_cards():
    s = family_for(MAYA1).default_sampling()
    assert (s.temperature, s.top_p, s.repetition_penalty, s.min_tokens) == (0.4, 0.9, 1.1, 28)
    assert s.stop_token_ids == (128258,) and s.ignore_eos is True
    p = replace(s, max_tokens=700, seed=3).validate().to_vllm()
    assert (p.temperature, p.top_p, p.repetition_penalty, p.min_tokens) == (0.4, 0.9, 1.1, 28)
    assert p.stop_token_ids == [128258] and p.ignore_eos is True and p.max_tokens == 700


# -- voices checked before any engine work ---------------------------------------------------

class _CountingEngine(FakeEngine):
    """The fake engine, recording every request it is given."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.requests: list[tuple[list[int], SamplingOptions]] = []

    def generate(self, prompt, sampling, request_id=None):
        self.requests.append((list(prompt), sampling))
        return super().generate(prompt, sampling, request_id)


@contextlib.asynccontextmanager
async def _fake_maya1():
    p = Pipeline(_CountingEngine(), ToneCodec(), MAYA1, PipelineOptions())
    await p.start()
    try:
        yield p
    finally:
        await p.aclose()


def _fake_prompt(p: Pipeline, text: str, description: str) -> list[int]:
    """What the fake engine must be given, written out: the fake tokenizer's words (it
    prepends nothing, so no BOS comes before SOH)."""
    words = p.engine.tokenizer.encode(f'<description="{description}"> {text}')
    return [128259, 128000, *words, 128009, 128260, 128261, 128257]


REJECTED = [
    ("", "must not be empty"),
    ("   \u00a0 ", "must not be empty|separator"),
    ("x" * 501, "at most 500"),
    ("y" * 5000, "at most"),
    ('Female, "calm"', "must not contain '\"'"),
    ("Female <angry>", "must not contain '<'"),
    ("Female> calm", "must not contain '>'"),
    ("calm<|eot_id|>", "must not contain '<'"),
    ("Female, calm\nnew line", "U\\+000A"),
    ("Female,\tcalm", "U\\+0009"),
    ("Female,\u200bcalm", "U\\+200B"),
    ("Female, \u202ecalm", "U\\+202E"),
    (3, "must be a string"),
    (True, "must be a string"),
    (None, "must be a string"),
    (["ava"], "must be a string"),
]


@pytest.mark.parametrize("voice,match", REJECTED)
async def test_a_bad_description_is_a_clear_error_before_any_engine_work(voice, match):
    async with _fake_maya1() as p:
        with pytest.raises(ValueError, match=match):
            MAYA1.check_voice(voice)
        with pytest.raises(ValueError, match=match):
            veena.TTS(pipeline=p, voice=voice)
        t = veena.TTS(pipeline=p)
        with pytest.raises(ValueError, match=match):
            t.update_options(voice=voice)
        assert t.voice == "ava", "a refused voice changes nothing"
        if voice is not None:  # synthesize(voice=None) means the default voice
            with pytest.raises(ValueError, match=match):
                p.synthesize("Hello there.", voice=voice)
        assert p.engine.requests == [] and p.engine.tokens_out == 0


@pytest.mark.parametrize("voice,spoken", [
    *((name, prompt) for name, prompt in MAYA1.voice_prompts),
    *((d, d) for d in (DESCRIPTION, ACCENTED, "Male, 45 years old, 2 kids, deep voice; slow")),
    ("  Young woman, 20s, upbeat  ", "Young woman, 20s, upbeat"),
])
async def test_accepted_voices_reach_the_prompt(voice, spoken):
    async with _fake_maya1() as p:
        t = veena.TTS(pipeline=p, voice=voice)
        assert t.voice == (voice if voice in MAYA1.voices else spoken)
        t.update_options(voice=voice)
        # a budget of its own: the fake engine never stops (the runaway guard's case)
        budget = replace(p.sampling.defaults(), max_tokens=7 * 20)
        pcm = await p.synthesize("Hi there.", voice=voice, seed=1, sampling=budget).collect()
        assert len(pcm) > 0
        ((prompt, sampling),) = p.engine.requests
        assert prompt == _fake_prompt(p, "Hi there.", spoken)
        assert sampling.ignore_eos is True and sampling.stop_token_ids == (128258,)
        assert sampling.min_tokens == 28


# -- stopping, on the real engine ------------------------------------------------------------

@dataclass(frozen=True)
class _Biased(SamplingOptions):
    """Sampling with a vLLM logit bias: the test pushes the model onto one token."""

    logit_bias: tuple[tuple[int, float], ...] = ()

    def to_vllm(self):
        params = super().to_vllm()
        params.logit_bias = dict(self.logit_bias)
        return params


async def _generate(pipeline: Pipeline, sampling: SamplingOptions) -> list[int]:
    prompt = pipeline.family.prompt(pipeline.engine.tokenizer, "Hello <laugh> there.",
                                    DESCRIPTION, None)
    ids: list[int] = []
    async for new in pipeline.engine.generate(prompt, sampling):
        ids.extend(new)
    return ids


def _pushed_to(pipeline: Pipeline, token: int, **changes) -> _Biased:
    s = replace(pipeline.sampling.defaults(), max_tokens=70, seed=7, **changes)
    return _Biased(**{f: getattr(s, f) for f in s.__dataclass_fields__},
                   logit_bias=((token, 100.0),))


@pytest.mark.engine
async def test_eot_does_not_stop_a_maya1_request_but_would_without_ignore_eos(maya1_pipeline):
    """The model is pushed onto 128009 (the tokenizer's EOS): with the profile's sampling it
    goes on to max_tokens; the same request without ignore_eos ends at the first 128009."""
    sampling = _pushed_to(maya1_pipeline, 128009)
    assert sampling.ignore_eos is True and sampling.min_tokens == 28
    ids = await _generate(maya1_pipeline, sampling)
    assert len(ids) == 70, ids
    assert 128009 in ids[:-1], "128009 was generated and generation went on past it"
    assert 128009 not in ids[:28], "min_tokens holds the stop ids back for four frames"

    stopped = await _generate(maya1_pipeline, replace(sampling, ignore_eos=False))
    assert stopped[-1] == 128009 and stopped.count(128009) == 1, stopped
    assert 28 < len(stopped) < 70


@pytest.mark.engine
async def test_a_maya1_request_stops_at_end_of_speech(maya1_pipeline):
    sampling = _pushed_to(maya1_pipeline, 128258)
    ids = await _generate(maya1_pipeline, sampling)
    assert ids[-1] == 128258 and ids.count(128258) == 1 and 28 < len(ids) < 70, ids
    # the stop is the profile's stop id: without it the same request runs to max_tokens
    unstopped = await _generate(maya1_pipeline, replace(sampling, stop_token_ids=()))
    assert len(unstopped) == 70 and 128258 in unstopped[:-1]


@pytest.mark.engine
async def test_a_description_and_a_tag_speak_end_to_end(maya1_pipeline):
    """The audio is the one-pass decode of its frames less the first frame: Maya1's
    reference drops the decoder's warm-up (``audio[2048:]``) and its streaming reference
    never plays frame 0."""
    from livekit.plugins.veena.codecs.base import CodecInput
    from livekit.plugins.veena.pipeline.pipeline import piece_seed

    budget = replace(maya1_pipeline.sampling.defaults(), max_tokens=7 * 24)  # its own: the
    # tiny model never stops, and the runaway guard would cut (and fade) the default one
    syn = maya1_pipeline.synthesize("Hello <laugh> there.", voice=f"  {DESCRIPTION} ", seed=3,
                                    sampling=budget)
    pcm = await syn.collect()
    frames = syn.tracks[0].steps
    assert len(frames) > 1 and maya1_pipeline.sample_rate == 24000
    assert len(pcm) == (len(frames) - 1) * 2048 and np.abs(pcm).max() > 0
    (one,) = maya1_pipeline.scheduler.codec.decode(
        [CodecInput(np.stack(frames), 0, piece_seed(syn.seed, 0))])
    err = pcm.astype(np.float32) / 32767 - np.clip(one[2048:], -1, 1)
    assert np.abs(err).max() < 5e-3  # the windowed decode's bound (tests/pipeline/test_pipeline.py)
    assert syn.timings.audio_seconds == pytest.approx(len(pcm) / 24000)


def test_only_maya1_trims_the_decoders_warm_up():
    from livekit.plugins.veena.models.profiles import ORPHEUS, PROFILES

    assert family_for(MAYA1).trim_start_steps == 1
    assert family_for(ORPHEUS).trim_start_steps == 0  # its card decodes every frame
    assert [p.name for p in PROFILES.values() if family_for(p).trim_start_steps] == ["maya1"]


async def test_the_planner_counts_no_trimmed_audio_as_heard():
    """The listener never hears the trimmed frame: a planner that counted it would think
    it held 85 ms more than it does and wait that much too long at exactly real time."""
    from livekit.plugins.veena.pipeline.pacing import AdaptivePlanner, PacingOptions
    from livekit.plugins.veena.pipeline.windowing import Window, WindowOptions

    planner = AdaptivePlanner(WindowOptions(), PacingOptions(), 2048 / 24000, lambda n: None)
    planner.unheard_steps = 1
    planner.delivered(Window(0, 1, 0, 1), now=10.0)  # all of it trimmed
    assert planner.first_audio_at is None and planner.buffer_s(10.0) == 0
    planner.delivered(Window(1, 4, 1, 4), now=10.0)
    assert planner.first_audio_at == 10.0
    assert planner.buffer_s(10.0) == pytest.approx(3 * 2048 / 24000)

    p = Pipeline(FakeEngine(), ToneCodec(), MAYA1, PipelineOptions(adaptive_windows=True))
    await p.start()
    try:
        heard = []
        syn = p.synthesize("Hello there.", sampling=replace(p.sampling.defaults(),
                                                             max_tokens=70), seed=1)
        await syn.play(lambda pcm, final: heard.append(len(pcm)))
        assert sum(heard) == 9 * 2048  # ten frames, the first one dropped
    finally:
        await p.aclose()


# -- the command line ------------------------------------------------------------------------

@pytest.mark.engine
def test_say_with_the_maya1_profile_writes_a_wav(tiny_maya1_dir, tmp_path):
    out = tmp_path / "maya1.wav"
    done = subprocess.run(
        [sys.executable, "-m", "livekit.plugins.veena.cli", "say", "--profile", "maya1",
         "--model", tiny_maya1_dir, "--voice", DESCRIPTION, "--seed", "2",
         "--max-tokens", "140",  # 20 frames: the tiny model never stops by itself
         "-o", str(out), "Hello <laugh> there <happy>"],
        env=dict(os.environ, VEENA_MAX_MODEL_LEN="2048", VEENA_MAX_NUM_SEQS="4"),
        capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"wav={out}" in done.stdout
    # <happy> is no Maya1 tag: removed before the prompt, and said so; <laugh> is kept
    removed = [line for line in done.stderr.splitlines() if "removed tags" in line]
    assert len(removed) == 1, done.stderr[-3000:]
    assert "nanobind" not in done.stderr, done.stderr[-3000:]  # nothing reported leaked at exit
    with wave.open(str(out)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        frames = w.getnframes()
        samples = np.frombuffer(w.readframes(frames), np.int16)
    assert frames > 0 and frames % 2048 == 0 and np.count_nonzero(samples) > frames // 2


def test_say_without_a_model_builds_the_tiny_model_of_its_profile(tmp_path, monkeypatch):
    from livekit.plugins.veena import cli
    from livekit.plugins.veena.models.profiles import read_manifest

    monkeypatch.delenv("VEENA_MODEL", raising=False)
    monkeypatch.setattr(cli, "DEFAULT_TINY_DIR", tmp_path / "tiny-veena")
    folder = cli._resolve_model(None, "maya1")
    assert folder == str(tmp_path / "tiny-maya1")
    assert read_manifest(folder)["profile"] == "maya1"
    tok = AutoTokenizer.from_pretrained(folder)
    assert len(tok.encode("<laugh>", add_special_tokens=False)) == 1
    assert cli._resolve_model("some/model", "maya1") == "some/model"


async def test_tags_that_are_not_one_token_are_named_at_start(caplog, tok):
    """Maya1's 20 tags are single tokens of its tokenizer; one that splits them into text is
    named in one warning when the pipeline starts."""
    import logging

    from ..fakes import fake_pipeline

    with caplog.at_level(logging.WARNING, logger="livekit.plugins.veena.pipeline.pipeline"):
        async with fake_pipeline() as p:
            split = Pipeline(p.engine, p.codec, MAYA1, PipelineOptions())
            await split.start()
            await split.scheduler.aclose()
    (record,) = [r for r in caplog.records if "not one token" in r.getMessage()]
    assert record.tags == list(MAYA1.tags)
    assert all(len(tok.encode(f"<{t}>", add_special_tokens=False)) == 1 for t in MAYA1.tags)
