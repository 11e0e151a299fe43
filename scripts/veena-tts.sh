#!/usr/bin/env bash
# Run the veena-tts command line inside the project's environment (created on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
for arg in "$@"; do  # -v also shows the install's own output
  case "$arg" in -v|--verbose) export VEENA_VERBOSE=1 ;; esac
done
bash scripts/bootstrap.sh
exec .venv/bin/veena-tts "$@"
