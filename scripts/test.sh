#!/usr/bin/env bash
# Build the documentation, then run the whole test suite inside the project's environment
# (created on first use).
# VEENA_TEST_WORKERS=N runs it on N xdist workers (default 0: in this process; the whole suite
# on two workers peaked at 20-24 GiB of this machine's 24, since each worker starts the
# session engines). The fast lane: VEENA_TEST_WORKERS=2 bash scripts/test.sh -m "not slow"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# the documentation first: a broken link, a missing page or a docstring that no longer
# resolves fails the run (a few seconds)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet
WORKERS=${VEENA_TEST_WORKERS:-0}
if [ "$WORKERS" != "0" ]; then
  exec .venv/bin/python -m pytest -n "$WORKERS" "$@"
fi
exec .venv/bin/python -m pytest "$@"
