"""The NeuTTS family end to end on the command line: ``make-tiny-model --profile neutts``
(a tiny Qwen2 with NeuTTS's tokens and a tiny NeuCodec), then ``say`` through vLLM writes a
24 kHz WAV. The family's one engine start."""

import os
import subprocess
import sys
import wave

import numpy as np
import pytest

from livekit.plugins.veena import cli


@pytest.mark.engine
def test_make_tiny_model_then_say_writes_a_24khz_wav(tmp_path):
    model = tmp_path / "neutts"
    assert cli.main(["make-tiny-model", str(model), "--profile", "neutts"]) == 0
    out = tmp_path / "a.wav"
    done = subprocess.run(
        [sys.executable, "-m", "livekit.plugins.veena.cli", "say", "--model", str(model),
         "--seed", "3", "--max-tokens", "100",  # 2 s: the tiny model never stops by itself
         "-o", str(out), "Hello there, this is NeuTTS."],
        env=dict(os.environ, VEENA_MAX_MODEL_LEN="2048", VEENA_MAX_NUM_SEQS="4"),
        capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"wav={out}" in done.stdout
    with wave.open(str(out)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        frames = w.getnframes()
        samples = np.frombuffer(w.readframes(frames), np.int16)
    # 100 tokens, one 480-sample step each (min_tokens 50 is met)
    assert frames == 100 * 480 and np.count_nonzero(samples) > frames // 2
