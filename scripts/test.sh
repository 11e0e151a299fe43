#!/usr/bin/env bash
# Build the documentation, then run the whole test suite inside the project's environment
# (created on first use).
#
# With no arguments the suite runs as two pytest processes side by side, one per core:
#   - the tests on the session engines (one vLLM engine per tiny model, started once) and
#     every test without an engine, in the foreground;
#   - the tests that start engines of their own (launched servers, benchmark scripts, LoRA
#     engines), and one benchmark that evens the lanes (marker second_lane, see
#     tests/conftest.py), one at a time, beside it; their report follows the first one's.
# Only the first process starts the session engines: memory peaked at 16 GiB of this
# machine's 24 (two xdist workers, each with the session engines, reached 20-24).
# VEENA_TEST_LANES=1 runs everything in one process.
# With arguments, they go to one pytest process (bash scripts/test.sh tests/codecs -x).
# VEENA_TEST_WORKERS=N runs on N xdist workers instead. The fast lane:
#   VEENA_TEST_WORKERS=2 bash scripts/test.sh -m "not slow"
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bytecode.sh
bash scripts/bootstrap.sh
# the documentation: a broken link, a missing page or a docstring that no longer resolves
# fails the run (a few seconds; with two lanes, in the shorter one, before its tests). Not
# --quiet: it hides the warnings that --strict counts, and a missing page passed.
DOCS=(env NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict)
PYTEST=(.venv/bin/python -m pytest)
WORKERS=${VEENA_TEST_WORKERS:-0}
if [ "$WORKERS" != "0" ]; then
  "${DOCS[@]}"
  exec "${PYTEST[@]}" -n "$WORKERS" "$@"
fi
if [ $# -gt 0 ] || [ "${VEENA_TEST_LANES:-2}" = "1" ]; then
  "${DOCS[@]}"
  exec "${PYTEST[@]}" "$@"
fi
lanes=$(mktemp -d "${TMPDIR:-/tmp}/veena-lanes.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$lanes"' EXIT
# (its own --basetemp, and no .pytest_cache: the two processes would write the same one)
{ "${DOCS[@]}" && "${PYTEST[@]}" -m second_lane --basetemp "$lanes/own" \
  -p no:cacheprovider; } > "$lanes/own.log" 2>&1 &
own=$!
shared=0
"${PYTEST[@]}" -m "not second_lane" --basetemp "$lanes/shared" || shared=$?
rc=0
wait "$own" || rc=$?
echo
echo "==== the documentation, then the tests with engines of their own (run beside the above) ===="
cat "$lanes/own.log"
trap - EXIT
rm -rf "$lanes"
if [ "$shared" != 0 ]; then exit "$shared"; fi
exit "$rc"
