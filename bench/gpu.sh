#!/usr/bin/env bash
# The prepared accelerator run (#21), under 9 minutes on a bare machine that has PyTorch:
# the CUDA graph tests on the GPU, the control plane at 64-384 streams with the real SNAC
# decoder on the GPU (windowed with CUDA graphs, streamed, one and two server processes) and with
# the GPU-like sleep (what the server costs on this machine's CPU), then host CPU per codec
# call with and without graphs and, where vLLM is installed, a Llama-3B-shaped engine.
# Installs what is missing: from the wheels in .whl/ where that folder has any (a machine
# with no registry), else from PyPI. `--small`: the codec calls and engine only, at CPU sizes.
# Results: bench/results/ (or VEENA_BENCH_RESULTS).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  site=${TMPDIR:-/tmp}/veena-gpu-site
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl \
    || exit 1
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
else
  need=()
  "$PY" -c "import snac" 2>/dev/null || need+=("snac==1.2.1")
  "$PY" -c "import livekit.agents" 2>/dev/null || need+=("livekit-agents>=1.7.0,<2")
  "$PY" -c "import prometheus_client" 2>/dev/null || need+=("prometheus-client")
  "$PY" -c "import vllm" 2>/dev/null || need+=("vllm==0.32.0")
  if [ ${#need[@]} -gt 0 ]; then "$PY" -m pip install -q "${need[@]}" || exit 1; fi
fi
export PYTHONPATH="$PWD/plugin:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}"
# without livekit-agents the package is registered without its __init__ (bench/device)
"$PY" -c "import livekit.agents" 2>/dev/null || export PYTHONPATH="$PWD/bench/device:$PYTHONPATH"

if [[ " $* " == *" --small "* ]]; then
  exec timeout 470 "$PY" bench/gpu_bench.py "$@"
fi
step() {  # step SECONDS TITLE COMMAND...: one step; a failed or timed-out step ends only itself
  local limit=$1 title=$2; shift 2
  echo "== $title"
  timeout -k 5 "$limit" "$@" || echo "== $title: failed or timed out (exit $?)"
}
nvidia-smi -L 2>/dev/null
"$PY" -c "import torch, platform; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), platform.processor() or platform.machine())"
step 90 "CUDA graph tests" "$PY" -m pytest -q -p no:cacheprovider tests/codecs/test_cuda_graphs.py
# one run of the fake engine alone per N (three would not fit these steps' limits)
cp="$PY bench/control_plane.py --cases normal --modes adaptive --no-pipeline-alone --alone-runs 1"
step 75 "control plane, GPU-like codec" $cp --codec gpu-like --streams 256,384 --label _gpu_host
step 110 "control plane, SNAC with CUDA graphs" $cp --codec snac --streams 64,256,384 --label _gpu_snac_graphs
step 70 "control plane, SNAC streamed" $cp --codec snac-streamed --streams 256 --label _gpu_snac_streamed
step 90 "control plane, SNAC, two server processes" $cp --codec snac --streams 384 --workers 2 --label _gpu_snac_workers
step 120 "codec calls (and the engine where vLLM is installed)" "$PY" bench/gpu_bench.py "$@"
