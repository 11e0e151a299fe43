"""``python -m livekit.agents download-files`` (livekit-agents' current form) finds this plugin
in the ``livekit.plugins`` namespace and runs its ``download_files()``; an unreachable hub is
our one clear message and a non-zero exit, not a traceback."""

import os
import subprocess
import sys


def test_download_files_finds_the_plugin_and_fails_cleanly(tmp_path):
    env = dict(os.environ, VEENA_MODEL="nobody/missing-model", HF_HUB_OFFLINE="1",
               HF_HOME=str(tmp_path / "hf"))
    done = subprocess.run([sys.executable, "-m", "livekit.agents", "download-files"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert "livekit.plugins.veena" in out, out[-2000:]
    assert done.returncode != 0
    assert "'nobody/missing-model' is not in the Hugging Face cache" in out
    assert "Traceback" not in out, out[-2000:]


def test_without_a_model_there_is_nothing_to_fetch(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "VEENA_MODEL"}
    done = subprocess.run([sys.executable, "-m", "livekit.agents", "download-files"],
                          cwd=tmp_path, env=dict(env, HF_HUB_OFFLINE="1"), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "VEENA_MODEL is not set" in done.stdout + done.stderr
