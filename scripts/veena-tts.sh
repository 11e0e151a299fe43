#!/usr/bin/env bash
# Run the veena-tts command line inside the project's environment (created on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/veena-tts "$@"
