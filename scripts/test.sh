#!/usr/bin/env bash
# Run the whole test suite inside the project's environment (created on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest "$@"
