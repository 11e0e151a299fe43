"""``veena-tts say`` end to end over the product's own pipeline and a scripted engine: what
it tells the user when the model gives it nothing to write."""

from __future__ import annotations

import logging

import pytest

from livekit.plugins.veena import cli
from livekit.plugins.veena.models import loading
from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.pipeline.guards import guard_counts
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions

from .fakes import STOP, ScriptedEngine, ToneCodec


@pytest.mark.guards  # the empty-chunk guard fires, as it must
def test_say_with_a_model_that_speaks_nothing_says_so_in_one_line(tmp_path, monkeypatch,
                                                                     caplog, capsys):
    made: list[Pipeline] = []

    def fake_load(model, **kw):  # every request stops at once: no audio token, every try
        made.append(Pipeline(ScriptedEngine([[STOP]]), ToneCodec(), VEENA, PipelineOptions()))
        return made[-1]

    monkeypatch.setattr(loading, "load_pipeline", fake_load)
    out = tmp_path / "x.wav"
    empty_before = guard_counts()["empty"]
    with caplog.at_level(logging.ERROR):
        code = cli.main(["say", "Hello there.", "--model", str(tmp_path), "--profile", "veena",
                         "--text-normalization", "off", "-o", str(out)])
    assert code == 1
    assert guard_counts()["empty"] == empty_before + 2  # the empty chunk was tried again
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "no audio" in errors[0] and "\n" not in errors[0]
    assert not any(r.exc_info for r in caplog.records)
    assert capsys.readouterr().out == ""  # no summary line for audio that does not exist
    assert not out.exists()  # no empty WAV left to be mistaken for the answer
