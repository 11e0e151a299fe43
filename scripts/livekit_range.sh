#!/usr/bin/env bash
# The plugin against the ends of its livekit-agents range (pyproject.toml: >=1.7.0,<2).
# For each VERSION (default: the oldest and the newest of the range on the package index):
# a fresh virtual environment gets livekit-agents[codecs], livekit-plugins-silero and
# livekit-plugins-openai at VERSION from the index, this checkout's plugin/ first on its
# path, and the project's .venv (VENV, default ./.venv) only after its own packages (a .pth:
# everything else, vLLM and torch for the tests' server, comes from there; so a copy of
# the tree, e.g. `git archive HEAD`, can be checked with the main checkout's .venv); then
# the plugin's tests run in it (tests/plugin, among them the base
# install into yet another fresh environment, and the example agent's). One line per
# version goes to bench/results/livekit_range.txt.
#   bash scripts/livekit_range.sh [VERSION ...]
# It downloads from the package index and takes several minutes per version: a check run
# when the range changes, not part of the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export ROOT
VERSIONS=("$@")
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(1.7.0 1.8.9)
VENV=${VENV:-$ROOT/.venv}
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
OUT="$ROOT/bench/results/livekit_range.txt"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

for version in "${VERSIONS[@]}"; do
  venv="$WORK/lk-$version"
  "$VENV/bin/python" -m venv "$venv"
  # Python 3.11's venv brings setuptools 65, which cannot build this pyproject (PEP 639's
  # license string): the project's own (the [test] extra's) is used instead
  "$venv/bin/python" -m pip uninstall -y -q setuptools
  "$venv/bin/python" -m pip install -q "livekit-agents[codecs]==$version" \
    "livekit-plugins-silero==$version" "livekit-plugins-openai==$version"
  own=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # this tree's plugin first; after the environment's own packages (its livekit-agents wins)
  # the project's .venv, whose editable install may point at another checkout
  echo "$ROOT/plugin" > "$own/aa_project_plugin.pth"
  echo "import site; site.addsitedir('$SITE')" > "$own/zz_project_venv.pth"
  got=$(OWN="$own" "$venv/bin/python" -c 'from importlib.metadata import version; import livekit.agents as a, livekit.plugins.veena as v, os; assert a.__file__.startswith(os.environ["OWN"]), a.__file__; assert v.__file__.startswith(os.environ["ROOT"]), v.__file__; print(version("livekit-agents"))' 2>&1 | tail -1) \
    || { echo "livekit-agents $version: not importable from its own environment: $got"; exit 1; }
  [ "$got" = "$version" ] || { echo "livekit-agents $version: got $got"; exit 1; }
  log="$WORK/pytest-$version.log"
  set +e
  OWN="$own" "$venv/bin/python" -m pytest tests/plugin tests/test_example_agent.py -q \
    -p no:cacheprovider -m "not livekit_server" > "$log" 2>&1
  rc=$?
  set -e
  summary=$(tail -1 "$log")
  echo "$(date -u +%Y-%m-%d) livekit-agents $version (rtc $("$venv/bin/python" -c 'from importlib.metadata import version; print(version("livekit"))')): rc=$rc $summary" | tee -a "$OUT"
  [ $rc -eq 0 ] || { tail -40 "$log"; exit $rc; }
done
