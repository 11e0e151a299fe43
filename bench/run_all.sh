#!/usr/bin/env bash
# Every CPU benchmark in one go; each prints a table and writes bench/results/NAME.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PYTHONPATH="$PWD/bench"
for b in snac_decode bicodec_stream neucodec_stream parser scheduler e2e server_load control_plane vllm_frontend guards \
    engine_sharing watermark; do
  .venv/bin/python "bench/$b.py"
done
PYTHON=.venv/bin/python bash bench/gpu.sh --small
