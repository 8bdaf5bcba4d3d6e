#!/usr/bin/env bash
# The benchmark table on an NVIDIA GPU: neuron on XLA:GPU against PyTorch CUDA eager and Inductor.
#
#   bash bench/gpu.sh [OUT_DIR]        # from the repository root on a GPU machine; under 10 minutes on an H200
#   CPU_CHECK=1 bash bench/gpu.sh DIR  # the same script on XLA:CPU (smoke sizes), to keep it working here
#
# It uses the machine's own torch and jax (with the CUDA PJRT plugin): only the native extension is built,
# against that torch.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-bench/results/gpu}}"
python="${PYTHON:-python}"
mkdir -p "$out"
if ! "$python" -c "import torchneuron.native._C" 2>/dev/null; then
    "$python" setup.py build_ext --inplace >"$out/build.log" 2>&1 || { cat "$out/build.log"; exit 1; }
fi
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "${CPU_CHECK:-}" ]; then
    exec "$python" -m bench.gpu --out "$out" --cpu --smoke
fi
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
"$python" -c "import torch, jax; print('torch', torch.__version__, 'jax', jax.__version__, jax.devices())" | tee "$out/versions.txt"
timeout 540 "$python" -m bench.gpu --out "$out" 2>&1 | tee "$out/bench.log"
