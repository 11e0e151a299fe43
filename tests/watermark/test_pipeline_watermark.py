"""The watermark through the product's Pipeline (NeuTTS over a scripted engine and the real
tiny NeuCodec, no vLLM): with it on, a synthesis's audio is the whole-clip Perth watermark of
the audio it has off, every sample, the length unchanged; a turn's chunks each carry it; and
``load_pipeline``'s resolution follows ``VEENA_WATERMARK``."""

import asyncio

import numpy as np
import pytest

from livekit.plugins.veena.codecs.neucodec import NeuCodecCodec
from livekit.plugins.veena.models.loading import pipeline_options_from_env
from livekit.plugins.veena.models.profiles import NEUTTS, VEENA
from livekit.plugins.veena.pipeline.guards import GuardOptions
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions
from livekit.plugins.veena.pipeline.turn import Turn, TurnOptions
from livekit.plugins.veena.watermark import watermarker_for
from tests.fakes import ScriptedEngine

TRANSCRIPT = "This is the reference clip, read aloud."
REFERENCE = tuple(int(c) for c in np.random.default_rng(5).integers(0, 65536, 60))
STEPS = 60
TOLERANCE = 2e-6  # as tests/watermark/test_streaming.py


@pytest.fixture(scope="module")
def codec(tiny_neutts_dir):
    return NeuCodecCodec.load(f"{tiny_neutts_dir}/neucodec")


def _speech(tokenizer, seed):
    base = tokenizer.convert_tokens_to_ids("<|speech_0|>")
    codes = np.random.default_rng(seed).integers(0, 65536, STEPS)
    return [base + int(c) for c in codes] + [
        tokenizer.convert_tokens_to_ids("<|SPEECH_GENERATION_END|>")]


async def _pipeline(tokenizer, codec, watermarker):
    engine = ScriptedEngine([_speech(tokenizer, i) for i in range(4)], delta=5)
    engine.tokenizer = tokenizer
    options = PipelineOptions(freeze_gc_heap=False, adaptive_windows=False,
                              guards=GuardOptions(silence_s=0.0))
    p = Pipeline(engine, codec, NEUTTS, options, watermarker=watermarker)
    await p.start()
    return p


async def _synthesis(p):
    pushes = []
    syn = p.synthesize("Hello there.", voice=TRANSCRIPT, speaker_globals=REFERENCE, seed=1)
    await syn.play(lambda pcm, final: pushes.append((pcm, final)))
    return pushes


def _rel_rms(got, want):
    return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want ** 2)))


async def test_a_synthesis_is_the_whole_clip_watermark_of_its_audio(neutts_tokenizer, codec,
                                                                     perth):
    plain = await _pipeline(neutts_tokenizer, codec, None)
    marked = await _pipeline(neutts_tokenizer, codec, perth)
    try:
        off, on = await _synthesis(plain), await _synthesis(marked)
    finally:
        await plain.aclose()
        await marked.aclose()
    off_audio = np.concatenate([a for a, _ in off])
    on_audio = np.concatenate([a for a, _ in on])
    assert len(on_audio) == len(off_audio) == STEPS * 480
    assert on[-1][1] and not any(final for _, final in on[:-1])
    assert all(len(a) for a, _ in on[:-1])  # never an empty push but the last
    assert 1e-3 < _rel_rms(on_audio, off_audio) < 0.5  # changed, not replaced
    assert _rel_rms(on_audio, perth.apply(off_audio, 24000)) <= TOLERANCE


async def test_every_chunk_of_a_turn_is_watermarked(neutts_tokenizer, codec, perth):
    heard = {}
    for name, marker in (("off", None), ("on", perth)):
        p = await _pipeline(neutts_tokenizer, codec, marker)
        try:
            turn = Turn(p, TurnOptions(voice=TRANSCRIPT, sampling=p.sampling.defaults(),
                                       speaker_globals=REFERENCE, seed=3))
            pushed = []

            async def chunks():
                yield "Hello there, this is the first sentence."
                yield "And here is a second one, in the same voice."

            await asyncio.wait_for(turn.speak(chunks(), pushed.append), 300)
            heard[name] = np.concatenate(pushed)
        finally:
            await p.aclose()
    assert len(heard["on"]) == len(heard["off"])
    half = len(heard["on"]) // 2
    for part in (slice(0, half - 2400), slice(half + 2400, None)):  # away from the seam
        assert _rel_rms(heard["on"][part], heard["off"][part]) > 1e-3


def test_the_option_resolves_per_profile(monkeypatch, perth):
    monkeypatch.delenv("VEENA_WATERMARK", raising=False)
    assert pipeline_options_from_env().watermark == "auto"
    monkeypatch.setenv("VEENA_WATERMARK", "OFF")
    assert pipeline_options_from_env().watermark == "off"
    monkeypatch.setenv("VEENA_WATERMARK", "maybe")
    with pytest.raises(ValueError, match="auto, on, off"):
        pipeline_options_from_env()
    assert watermarker_for("auto", NEUTTS) is not None  # its reference watermarks
    assert watermarker_for("auto", VEENA) is None  # Veena's does not
    assert watermarker_for("on", VEENA) is not None
    assert watermarker_for("off", NEUTTS) is None


def test_on_without_weights_is_an_error_at_start(monkeypatch, tmp_path, caplog):
    import livekit.plugins.veena.watermark as wm
    from livekit.plugins.veena.watermark.weights import find_perth_weights

    with pytest.raises(ValueError, match="hparams.yaml"):  # a folder given, and empty
        find_perth_weights(tmp_path)
    monkeypatch.setattr(wm, "find_perth_weights", lambda folder=None: None)
    with pytest.raises(ValueError, match="resemble-perth==1.0.1"):
        wm.watermarker_for("on", NEUTTS)
    with caplog.at_level("WARNING"):
        assert wm.watermarker_for("auto", NEUTTS) is None
    assert "watermark off" in caplog.text


def test_the_cli_flag_sets_the_variable_every_worker_reads(monkeypatch):
    from livekit.plugins.veena import cli

    monkeypatch.delenv("VEENA_WATERMARK", raising=False)
    monkeypatch.delenv("VEENA_MODEL", raising=False)
    assert cli.main(["serve", "--watermark", "off"]) == 2  # no model: stops before loading
    assert pipeline_options_from_env().watermark == "off"
    with pytest.raises(SystemExit):
        cli.main(["say", "hi", "--watermark", "maybe"])


async def test_the_watermark_runs_on_the_codecs_thread(neutts_tokenizer, codec, perth):
    """Off the event loop, and on the one thread whose torch work the codec's is
    (``codecs.torch_threads``): a second OpenMP team would slow every decode."""
    import threading

    threads = []

    class _Spy:
        def grid(self, rate):
            return perth.grid(rate)

        def apply(self, audio, rate):
            threads.append(threading.current_thread().name)
            return perth.apply(audio, rate)

    p = await _pipeline(neutts_tokenizer, codec, _Spy())
    try:
        pushes = await _synthesis(p)
    finally:
        await p.aclose()
    assert sum(len(a) for a, _ in pushes) == STEPS * 480
    assert threads and all(name.startswith("veena-decode") for name in threads)
