"""Designed voices that never drift (SNAC: no speaker tokens, so a voice is its words and its
seed): ``veena-tts voice design`` writes a file, the file loads and a TTS speaks with exactly
its description and seed; a hand-edited bad file is a ``VoiceFileError`` before any engine
work; with ``voice_scope="call"`` (the default) every stream of one TTS speaks with one seed,
in-process and through a server, and ``reset_voice()``, a new voice or ``turn`` scope draw
anew. Seeds and prompts are read where they reach the (fake) engine."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from pathlib import Path

import pytest
from livekit.plugins import veena

from livekit.plugins.veena import cli
from livekit.plugins.veena.models.profiles import MAYA1, VEENA, VEENA3
from livekit.plugins.veena.server.app import ServerOptions
from livekit.plugins.veena.voices.files import (
    FORMAT_VERSION,
    VoiceFile,
    VoiceFileError,
    design_voice,
    load_voice,
)

from ..models.test_maya1_surfaces import DESCRIPTION, maya1_server, recording_pipeline

TOKENS = 42
"""Tokens per engine request: six SNAC frames, enough to speak and cheap on the fake engine."""


async def _speak_stream(t: veena.TTS, text: str = "Hello there. How are you today?"):
    stream = t.stream()
    stream.push_text(text)
    stream.end_input()
    samples = sum([ev.frame.samples_per_channel async for ev in stream])
    await stream.aclose()
    assert samples > 0
    return stream


async def _replies(t: veena.TTS, engine, n: int = 3) -> list[set[int]]:
    """The seeds that reached the engine for each of ``n`` replies (streams and whole texts
    alternating, as an agent's replies and a ``say()`` would)."""
    out = []
    for i in range(n):
        engine.requests.clear()
        if i % 2:
            assert (await t.synthesize("A whole text.").collect()).samples_per_channel > 0
        else:
            await _speak_stream(t)
        out.append(set(engine.seeds))
    return out


# --- the file -------------------------------------------------------------------------------

def test_design_writes_a_file_that_loads_back(tmp_path):
    made = design_voice(MAYA1, f"  {DESCRIPTION} ", seed=12345, model="maya-research/maya1")
    path = made.save(tmp_path / "v.json")
    data = json.loads(path.read_text())
    assert data == {"format_version": FORMAT_VERSION, "profile": "maya1",
                    "model": "maya-research/maya1", "voice": DESCRIPTION, "seed": 12345}
    assert load_voice(path, MAYA1) == made and made.speaker_globals is None
    drawn = {design_voice(MAYA1, "ava").seed for _ in range(3)}
    assert all(isinstance(s, int) and 0 <= s < 2**31 for s in drawn) and len(drawn) > 1
    # a preset name is a voice too, and a named SNAC voice (veena) can be pinned the same way
    assert design_voice(VEENA, "kavya", seed=1).voice == "kavya"


def test_a_bicodec_file_keeps_loading_and_writes_no_seed(tmp_path):
    globals_ = tuple(range(100, 132))
    path = VoiceFile("veena3", "m", "kavya", globals_).save(tmp_path / "b.json")
    assert "seed" not in json.loads(path.read_text())
    assert load_voice(path, VEENA3) == VoiceFile("veena3", "m", "kavya", globals_)
    with pytest.raises(VoiceFileError, match="voice capture"):
        design_voice(VEENA3, "kavya")


GOOD = {"format_version": 1, "profile": "maya1", "model": "m", "voice": DESCRIPTION, "seed": 5}


@pytest.mark.parametrize("data,match", [
    ({k: v for k, v in GOOD.items() if k != "seed"}, "'seed' .* is required"),
    ({**GOOD, "seed": 1.0}, "seed must be an integer"),
    ({**GOOD, "seed": True}, "seed must be an integer"),
    ({**GOOD, "seed": "5"}, "seed must be an integer"),
    ({**GOOD, "seed": -1}, r"seed must be in \[0, "),
    ({**GOOD, "seed": 2**63}, r"seed must be in \[0, "),
    ({**GOOD, "voice": 'A "quoted" voice'}, "must not contain"),
    ({**GOOD, "voice": "A voice <|eot_id|>"}, "must not contain"),
    ({**GOOD, "voice": "a\tb"}, "control, format or separator"),
    ({**GOOD, "voice": "x" * 501}, "at most 500"),
    ({**GOOD, "voice": "   "}, "must not be empty"),
    ({**GOOD, "speaker_globals": list(range(32))}, "takes no speaker_globals"),
    ({**GOOD, "profile": "veena"}, "profile"),
    ({**GOOD, "format_version": 2}, "format_version"),
])
def test_a_hand_edited_bad_file_fails_before_any_engine_work(tmp_path, data, match):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(VoiceFileError, match=match):
        load_voice(path, MAYA1)
    with pytest.raises(ValueError, match=match):  # the plugin refuses it at construction
        veena.TTS(base_url="ws://127.0.0.1:9", profile="maya1", voice=str(path))


# --- the command line -----------------------------------------------------------------------

def test_cli_design_writes_the_file_and_logs_where(tmp_path, caplog):
    out = tmp_path / "voices" / "rob.json"
    with caplog.at_level(logging.INFO):
        assert cli.main(["voice", "design", DESCRIPTION, "-o", str(out), "--seed", "77"]) == 0
    saved = load_voice(out, MAYA1)
    assert (saved.voice, saved.seed, saved.profile) == (DESCRIPTION, 77, "maya1")
    assert any(str(out) in r.getMessage() for r in caplog.records)
    drawn = tmp_path / "drawn.json"
    assert cli.main(["voice", "design", "ava", "-o", str(drawn), "--profile", "maya1"]) == 0
    assert isinstance(load_voice(drawn, MAYA1).seed, int)


def test_the_wrapper_script_keeps_relative_paths_where_it_runs(tmp_path):
    """``scripts/veena-tts.sh`` run from another folder: ``-o rob.json`` lands there, not in
    the checkout (the script used to ``cd`` to the repository root first)."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "veena-tts.sh"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VEENA_")}
    subprocess.run(["bash", str(script), "voice", "design", "ava", "-o", "rob.json",
                    "--profile", "maya1", "--seed", "5"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=900)  # a hang guard (a refresh installs)
    assert load_voice(tmp_path / "rob.json", MAYA1).seed == 5


@pytest.mark.parametrize("argv,match", [
    (['Say "hi"', "--profile", "maya1"], "must not contain"),
    (["ava", "--seed", "-3"], r"seed must be in \[0, "),
    (["kavya", "--profile", "veena3"], "voice capture"),
    (["nobody", "--profile", "veena"], "unknown voice"),
    (["ava", "--profile", "nope"], "unknown model profile"),
])
def test_cli_design_refuses_with_one_clear_line(tmp_path, caplog, argv, match):
    out = tmp_path / "v.json"
    assert cli.main(["voice", "design", *argv, "-o", str(out)]) == 2
    assert not out.exists()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors and any(re.search(match, e) for e in errors), errors


def test_cli_say_speaks_a_designed_voice_with_its_description_and_seed(tmp_path, monkeypatch):
    """``say --voice rob.json``: the product's Pipeline (over the recording fake engine)
    gets the file's description in its prompt and the file's seed; ``--seed`` wins."""
    from livekit.plugins.veena.models import loading
    from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions

    from ..fakes import ToneCodec
    from ..models.test_maya1_surfaces import RecordingEngine

    path = design_voice(MAYA1, DESCRIPTION, seed=8675309).save(tmp_path / "rob.json")
    engines: list[RecordingEngine] = []

    def load_pipeline(model, profile=None, **kw):
        engines.append(RecordingEngine())
        return Pipeline(engines[-1], ToneCodec(), MAYA1, PipelineOptions())

    monkeypatch.setattr(loading, "load_pipeline", load_pipeline)
    (tmp_path / "model").mkdir()
    argv = ["say", "Hello there.", "--voice", str(path), "--model", str(tmp_path / "model"),
            "--profile", "maya1", "--max-tokens", str(TOKENS), "-o", str(tmp_path / "x.wav")]
    assert cli.main(argv) == 0
    assert engines[-1].spoke_with(DESCRIPTION) and set(engines[-1].seeds) == {8675309}
    assert cli.main([*argv, "--seed", "4"]) == 0
    assert engines[-1].spoke_with(DESCRIPTION) and set(engines[-1].seeds) == {4}


# --- a TTS speaks with the file's description and seed --------------------------------------

async def test_a_tts_with_a_designed_voice_file_uses_its_description_and_seed(tmp_path):
    path = design_voice(MAYA1, DESCRIPTION, seed=31337).save(tmp_path / "rob.json")
    async with recording_pipeline() as p:
        t = veena.TTS(pipeline=p, voice=str(path), max_tokens_per_chunk=TOKENS)
        assert t.voice_seed == 31337
        for seeds in await _replies(t, p.engine):
            assert seeds == {31337}
        assert p.engine.spoke_with(DESCRIPTION)
        # reset_voice() keeps a voice file's seed: the file is the voice
        t.reset_voice()
        assert await _replies(t, p.engine, 1) == [{31337}]
        # an explicit seed wins over the file's
        t.update_options(seed=9)
        assert await _replies(t, p.engine, 1) == [{9}]
        # a preset replaces the file: its own words, and the call's seed from then on
        t.update_options(voice="noah", seed=None)
        replies = await _replies(t, p.engine)
        assert p.engine.spoke_with(MAYA1.render_voice("noah"))
        assert len(replies[0]) == 1 and all(r == replies[0] for r in replies)
        assert replies[0] != {31337} and t.voice_seed in replies[0]
        # and the file again, by update_options
        t.update_options(voice=str(path))
        assert await _replies(t, p.engine, 1) == [{31337}]
        await t.aclose()


# --- one seed for the whole call --------------------------------------------------------------

async def test_call_scope_keeps_one_seed_for_every_reply():
    async with recording_pipeline() as p:
        t = veena.TTS(pipeline=p, voice=DESCRIPTION, max_tokens_per_chunk=TOKENS)
        assert t.voice_scope == "call" and t.voice_seed is None  # drawn on first use
        replies = await _replies(t, p.engine, 4)
        (seed,) = replies[0]
        assert all(r == {seed} for r in replies) and t.voice_seed == seed
        assert p.engine.spoke_with(DESCRIPTION)
        stream = await _speak_stream(t)
        assert stream.seed == seed
        # reset_voice(): a new seed next time, then kept again
        t.reset_voice()
        assert t.voice_seed is None
        after = await _replies(t, p.engine)
        assert after[0] != {seed} and all(r == after[0] for r in after)
        # a new voice: a new seed too
        (kept,) = after[0]
        t.update_options(voice="isla")
        again = await _replies(t, p.engine, 2)
        assert again[0] != {kept} and again[0] == again[1]
        await t.aclose()


async def test_turn_scope_draws_a_seed_per_reply_and_a_given_seed_is_used_as_is():
    async with recording_pipeline() as p:
        t = veena.TTS(pipeline=p, voice="ava", voice_scope="turn", max_tokens_per_chunk=TOKENS)
        replies = await _replies(t, p.engine, 4)
        assert all(len(r) == 1 for r in replies)  # one seed for all chunks of a reply
        assert len(set().union(*replies)) == 4 and t.voice_seed is None
        fixed = veena.TTS(pipeline=p, voice="ava", seed=5, voice_scope="turn",
                          max_tokens_per_chunk=TOKENS)
        assert await _replies(fixed, p.engine) == [{5}] * 3
        await t.aclose()
        await fixed.aclose()


async def test_call_scope_seed_through_the_server(tmp_path):
    path = design_voice(MAYA1, DESCRIPTION, seed=2024).save(tmp_path / "rob.json")
    async with maya1_server(ServerOptions()) as (url, _, engine):
        ws = url.replace("http://", "ws://")
        call = veena.TTS(base_url=ws, profile="maya1", voice=DESCRIPTION,
                         max_tokens_per_chunk=TOKENS)
        replies = await _replies(call, engine, 3)
        (seed,) = replies[0]
        assert all(r == {seed} for r in replies) and engine.spoke_with(DESCRIPTION)
        call.reset_voice()
        assert (await _replies(call, engine, 1))[0] != {seed}
        per_turn = veena.TTS(base_url=ws, profile="maya1", voice_scope="turn",
                             max_tokens_per_chunk=TOKENS)
        replies = await _replies(per_turn, engine, 3)
        assert len(set().union(*replies)) == 3
        filed = veena.TTS(base_url=ws, profile="maya1", voice=str(path),
                          max_tokens_per_chunk=TOKENS)
        assert await _replies(filed, engine, 2) == [{2024}] * 2
        assert engine.spoke_with(DESCRIPTION)
        for t in (call, per_turn, filed):
            await t.aclose()
