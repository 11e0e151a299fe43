#!/usr/bin/env bash
# Run the veena-tts command line inside the project's environment (created on first use).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"  # paths given here stay relative to where it runs
for arg in "$@"; do  # -v also shows the install's own output
  case "$arg" in -v|--verbose) export VEENA_VERBOSE=1 ;; esac
done
source "$ROOT/scripts/bytecode.sh"
bash "$ROOT/scripts/bootstrap.sh"
VENV=${VEENA_VENV:-.venv}
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac  # as bootstrap.sh reads it: from the root
exec "$VENV/bin/veena-tts" "$@"
