#!/usr/bin/env bash
# The prepared accelerator run: under 8 minutes on a bare machine that has PyTorch (and vLLM
# for the engine part). Installs only what is missing; without CUDA it runs at small sizes.
# Results: bench/results/gpu.json (or gpu_cpu_small.json).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
need=()
"$PY" -c "import snac" 2>/dev/null || need+=("snac==1.2.1")
"$PY" -c "import livekit.agents" 2>/dev/null || need+=("livekit-agents==1.8.9")
"$PY" -c "import prometheus_client" 2>/dev/null || need+=("prometheus-client")
"$PY" -c "import vllm" 2>/dev/null || need+=("vllm==0.32.0")
if [ ${#need[@]} -gt 0 ]; then "$PY" -m pip install -q "${need[@]}"; fi
export PYTHONPATH="$PWD/plugin:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 470 "$PY" bench/gpu_bench.py "$@"
