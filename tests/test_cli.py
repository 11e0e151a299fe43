"""``veena-tts serve`` never serves a random model nobody asked for: without a model it says
in one line to give --model; ``--model tiny`` builds the tiny random model, loudly."""

import logging

import pytest

from livekit.plugins.veena import cli


@pytest.fixture(autouse=True)
def _no_model(monkeypatch):
    monkeypatch.delenv("VEENA_MODEL", raising=False)


def test_serve_without_a_model_refuses_in_one_line(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)  # where the old fallback built .cache/tiny-veena
    assert cli.main(["serve", "--port", "0"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "--model" in errors[0] and "\n" not in errors[0]
    assert not (tmp_path / ".cache").exists()  # nothing was built


def test_serve_tiny_only_when_asked_and_loudly(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    # a bad setting ends the start right after the model is resolved, before any engine
    monkeypatch.setenv("VEENA_MAX_TEXT_CHARS", "many")
    monkeypatch.setenv("VEENA_MODEL", "tiny")
    assert cli.main(["serve", "--port", "0"]) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("TINY RANDOM-WEIGHT" in w for w in warnings)
    assert (tmp_path / ".cache" / "tiny-veena" / "veena_tts.json").is_file()
    assert "VEENA_MAX_TEXT_CHARS" in caplog.text
