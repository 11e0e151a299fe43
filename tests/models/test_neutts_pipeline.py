"""The NeuTTS family through the product's own Pipeline and Turn, over a scripted engine
(speech tokens of the tiny tokenizer) and the real tiny NeuCodec: every request of a call is
prompted with the same reference, the first windows decode the reference's last codes as
left context, and the reference's share of the 2048-token context sets how much text one
request carries. No vLLM."""

import asyncio

import numpy as np
import pytest

from livekit.plugins.veena.codecs.neucodec import NeuCodecCodec
from livekit.plugins.veena.models.profiles import NEUTTS
from livekit.plugins.veena.pipeline.guards import GuardOptions
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions
from livekit.plugins.veena.pipeline.turn import Turn, TurnOptions
from tests.fakes import ScriptedEngine

TRANSCRIPT = "This is the reference clip, read aloud."
REFERENCE = tuple(int(c) for c in np.random.default_rng(5).integers(0, 65536, 120))


@pytest.fixture
def tokenizer(neutts_tokenizer):
    return neutts_tokenizer


@pytest.fixture(scope="module")
def codec(tiny_neutts_dir):
    return NeuCodecCodec.load(f"{tiny_neutts_dir}/neucodec")


class _SpyCodec:
    """The real codec; records every window it decodes."""

    def __init__(self, codec):
        self._codec, self.windows = codec, []
        self.name, self.sample_rate = codec.name, codec.sample_rate
        self.samples_per_step = codec.samples_per_step

    def decode(self, batch):
        self.windows += [(w.start_step, w.context_steps, tuple(w.codes)) for w in batch]
        return self._codec.decode(batch)

    def warmup(self):
        pass


def _speech(tokenizer, n, seed):
    base = tokenizer.convert_tokens_to_ids("<|speech_0|>")
    codes = np.random.default_rng(seed).integers(0, 65536, n)
    return [base + int(c) for c in codes] + [
        tokenizer.convert_tokens_to_ids("<|SPEECH_GENERATION_END|>")]


async def _pipeline(tokenizer, codec, steps=60, scripts=None, guards=None):
    engine = ScriptedEngine(scripts or [_speech(tokenizer, steps, i) for i in range(8)], delta=5)
    engine.tokenizer = tokenizer
    spy = _SpyCodec(codec)
    # the silence guard judges real speech; random codes on random weights are noise
    options = PipelineOptions(freeze_gc_heap=False, adaptive_windows=False,
                              guards=guards or GuardOptions(silence_s=0.0))
    p = Pipeline(engine, spy, NEUTTS, options)
    await p.start()
    return p, engine, spy


async def test_a_call_speaks_every_chunk_after_the_same_reference(tokenizer, codec):
    p, engine, spy = await _pipeline(tokenizer, codec)
    try:
        turn = Turn(p, TurnOptions(voice=TRANSCRIPT, sampling=p.sampling.defaults(),
                                   speaker_globals=REFERENCE))
        heard = []

        async def chunks():
            yield "Hello there, this is the first sentence."
            yield "And here is a second one, spoken in the same voice."

        await asyncio.wait_for(turn.speak(chunks(), heard.append), 300)
        assert len(engine.requests) == 2
        start = tokenizer.convert_tokens_to_ids("<|SPEECH_GENERATION_START|>")
        base = tokenizer.convert_tokens_to_ids("<|speech_0|>")
        for _, prompt, sampling in engine.requests:
            at = prompt.index(start)
            assert prompt[at + 1:] == [base + c for c in REFERENCE]  # the reference, continued
            assert (sampling.temperature, sampling.top_k, sampling.min_tokens) == (1.0, 50, 50)
            assert prompt[at + 1 + len(REFERENCE):] == []
        # each chunk's 60 steps, 480 samples each, less the one seam's crossfade overlap
        assert 2 * 60 * 480 - 480 < sum(len(a) for a in heard) <= 2 * 60 * 480
    finally:
        await p.aclose()


async def test_the_first_windows_decode_the_reference_as_left_context(tokenizer, codec):
    p, engine, spy = await _pipeline(tokenizer, codec)
    try:
        syn = p.synthesize("Hello there.", voice=TRANSCRIPT, speaker_globals=REFERENCE, seed=1)
        audio = [c.pcm async for c in syn]
        left = p.family.decode_defaults.window.left
        first = spy.windows[0]
        assert first[0] == 0 and first[1] == left
        assert first[2][:left] == REFERENCE[-left:]
        later = [w for w in spy.windows if w[0] > 0]
        assert later and all(w[1] == 0 for w in later)
        assert sum(len(a) for a in audio) == 60 * 480
    finally:
        await p.aclose()


async def test_the_references_length_sets_the_text_per_request(tokenizer, codec):
    p, engine, spy = await _pipeline(tokenizer, codec)
    try:
        def limit(reference):
            return p.sampling.max_chars_per_request(
                p.family.voice_prompt_tokens(tokenizer, TRANSCRIPT, reference))

        assert limit(REFERENCE * 6) < limit(REFERENCE[:60]) - 660 // 7  # 720 codes vs 60
        text = "This sentence goes on and on, " * 12
        long = p.synthesize(text, voice=TRANSCRIPT, speaker_globals=REFERENCE * 6)
        assert len(long.pieces) > 1 and max(map(len, long.pieces)) <= limit(REFERENCE * 6)
        wordy = "A long transcript of the reference clip, " * 24  # ~1000 characters
        with pytest.raises(ValueError, match="context tokens"):
            p.synthesize("Hello.", voice=wordy.strip(), speaker_globals=REFERENCE * 6)
        with pytest.raises(ValueError, match="reference clip's codes and transcript"):
            p.synthesize("Hello.", voice=TRANSCRIPT)
    finally:
        await p.aclose()


@pytest.mark.guards  # the scripted model never stops: the runaway guard ends its chunks
async def test_every_request_fits_2048_tokens(tokenizer, codec):
    p, engine, spy = await _pipeline(tokenizer, codec, steps=3000)
    try:
        reference = REFERENCE * 6  # 720 codes
        syn = p.synthesize("A fairly long sentence to say. " * 6, voice=TRANSCRIPT,
                           speaker_globals=reference)
        async for _ in syn:
            pass
        for _, prompt, sampling in engine.requests:
            assert len(prompt) + sampling.max_tokens <= 2048
    finally:
        await p.aclose()


@pytest.mark.guards
async def test_the_loop_guard_ends_a_chunk_that_repeats_single_codebook_steps(tokenizer, codec):
    from livekit.plugins.veena.pipeline.guards import guard_counts

    run = _speech(tokenizer, 20, 9)[:-1]  # 0.4 s of codes, then the same again and again
    p, engine, spy = await _pipeline(tokenizer, codec, scripts=[run * 8],
                                     guards=GuardOptions(silence_s=0.0, loop_repeats=3))
    try:
        before = guard_counts()["loop"]
        syn = p.synthesize("Hello there, how are you doing today?", voice=TRANSCRIPT,
                           speaker_globals=REFERENCE, seed=1)
        audio = sum(len(c.pcm) for c in [c async for c in syn])
        assert guard_counts()["loop"] == before + 1
        assert 0 < audio < 8 * 20 * 480 // 2  # cut near its first copies, not all eight
    finally:
        await p.aclose()


def _said(tokenizer, prompt):
    """The prompt's text part (phonemes), decoded."""
    start = prompt.index(tokenizer.convert_tokens_to_ids("<|TEXT_PROMPT_START|>"))
    end = prompt.index(tokenizer.convert_tokens_to_ids("<|TEXT_PROMPT_END|>"))
    return tokenizer.decode(prompt[start + 1:end])


async def test_english_text_is_normalised_before_its_phonemes(tokenizer, codec):
    from livekit.plugins.veena.models.phonemes import phonemize

    p, engine, spy = await _pipeline(tokenizer, codec)
    try:
        written = "It costs $12.50 today."
        turn = Turn(p, TurnOptions(voice=TRANSCRIPT, sampling=p.sampling.defaults(),
                                   speaker_globals=REFERENCE))

        async def chunks():
            yield written

        await asyncio.wait_for(turn.speak(chunks(), lambda pcm: None), 300)
        spoken = await p.normalized(written, "norm")
        assert spoken != written and "dollars" in spoken
        said = _said(tokenizer, engine.requests[0][1])
        assert said == f"{phonemize(TRANSCRIPT)} {phonemize(spoken)}"
    finally:
        await p.aclose()


async def test_the_plugin_speaks_a_voice_file_in_call_scope(tokenizer, codec, tmp_path,
                                                           monkeypatch):
    from livekit.plugins import veena
    from livekit.plugins.veena.voices.files import VoiceFile
    from tests.helpers import record_voices
    from tests.servers import poll_until

    path = VoiceFile("neutts", "tiny", TRANSCRIPT, REFERENCE).save(tmp_path / "me.json")
    p, engine, spy = await _pipeline(tokenizer, codec)
    try:
        given = record_voices(monkeypatch, p)
        t = veena.TTS(pipeline=p, voice=str(path))
        metrics = []
        t.on("metrics_collected", metrics.append)
        assert t.sample_rate == 24000
        texts = ("Hello there.", "And again.")
        for text in texts:
            frames = await t.synthesize(text).collect()
            assert frames.sample_rate == 24000  # 60 steps, within the emitter's 10 ms frames
            assert abs(frames.samples_per_channel - 60 * 480) <= 480
        assert given == [(TRANSCRIPT, REFERENCE)] * 2
        # livekit-agents' TTS metrics, one per synthesis (sent as its stream closes): its
        # first audio, its 1.2 s, its text
        await poll_until(lambda: len(metrics) == 2, lambda: f"two metrics, got {metrics}")
        assert [m.characters_count for m in metrics] == [len(x) for x in texts]
        assert all(m.ttfb > 0 and abs(m.audio_duration - 1.2) <= 0.02 for m in metrics)
        with pytest.raises(ValueError, match="reference clip's codes and transcript"):
            veena.TTS(pipeline=p, voice="just some words")
        await t.aclose()
    finally:
        await p.aclose()


async def test_aligned_transcripts_time_every_word_of_a_neutts_stream(tokenizer, codec, tmp_path):
    from livekit.plugins import veena
    from livekit.plugins.veena.voices.files import VoiceFile
    from tests.plugin.test_aligned_transcripts import _check, _timed_words

    path = VoiceFile("neutts", "tiny", TRANSCRIPT, REFERENCE).save(tmp_path / "me.json")
    p, engine, spy = await _pipeline(tokenizer, codec)
    try:
        t = veena.TTS(pipeline=p, voice=str(path))
        assert t.capabilities.aligned_transcript
        _check(*await _timed_words(t))
        await t.aclose()
    finally:
        await p.aclose()
