#!/usr/bin/env bash
# Run the whole test suite inside the project's environment (created on first use), on two
# workers (VEENA_TEST_WORKERS; 0: in this process). The fast lane: scripts/test.sh -m "not slow".
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest -n "${VEENA_TEST_WORKERS:-2}" --dist loadgroup "$@"
