#!/usr/bin/env bash
# The benchmark table on an NVIDIA GPU: neuron on XLA:GPU against PyTorch CUDA eager and Inductor.
#
#   bash bench/gpu.sh [OUT_DIR]        # from the repository root on a GPU machine; under 10 minutes on an H200
#   bash bench/gpu.sh OUT_DIR kernels  # the kernel library against the eager compositions, its kernels
#                                      # lowered by Pallas (Triton) and by JAX (XLA:GPU); under 10 minutes
#   CPU_CHECK=1 bash bench/gpu.sh DIR [kernels]  # the same on XLA:CPU (smoke sizes; Pallas interpreted)
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
if [ "${2:-}" = kernels ]; then
    if [ -n "${CPU_CHECK:-}" ]; then
        exec "$python" -m bench.kernels --smoke --lowering pallas --out "$out/kernels-pallas.json"
    fi
    for lowering in pallas jax; do
        timeout 270 "$python" -m bench.kernels --platform cuda --size medium --lowering "$lowering" \
            --out "$out/kernels-$lowering.json" 2>&1 | tee "$out/kernels-$lowering.log" || true
    done
    exit 0
fi
if [ -n "${CPU_CHECK:-}" ]; then
    exec "$python" -m bench.gpu --out "$out" --cpu --smoke
fi
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
"$python" -c "import torch, jax; print('torch', torch.__version__, 'jax', jax.__version__, jax.devices())" | tee "$out/versions.txt"
timeout 540 "$python" -m bench.gpu --out "$out" 2>&1 | tee "$out/bench.log"
