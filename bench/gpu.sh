#!/usr/bin/env bash
# The benchmark table on an NVIDIA GPU: neuron on XLA:GPU against PyTorch CUDA eager and Inductor.
#
#   bash bench/gpu.sh [OUT_DIR]        # from the repository root on a GPU machine; under 10 minutes on an H200
#   bash bench/gpu.sh OUT_DIR check    # part of the test suite on XLA:GPU (single-device tests against the CPU)
#   bash bench/gpu.sh OUT_DIR kernels  # the kernel library against the eager compositions, its kernels
#                                      # lowered by Pallas (Triton) and by JAX (XLA:GPU); under 10 minutes
#   CPU_CHECK=1 bash bench/gpu.sh DIR [kernels]  # the same on XLA:CPU (smoke sizes; Pallas interpreted)
#
# In one lease of a GPU machine (15 minutes, its start included), the table and the check within 9:
#   BENCH_TIMEOUT=330 bash bench/gpu.sh "$OUT"; CHECK_TIMEOUT=150 bash bench/gpu.sh "$OUT/check" check
#
# It uses the machine's own torch and jax (with the CUDA PJRT plugin): the package is installed into that
# Python without dependencies (which builds only the native extension, against that torch), as a user would.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-bench/results/gpu}}"
python="${PYTHON:-python3}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # bench/ and tests/ import from the repository root
if ! "$python" -c "import importlib.metadata as m, torchneuron.native._C; m.distribution('torchneuron')" 2>/dev/null; then
    if ! "$python" -m pip install --no-deps --no-build-isolation -e . >"$out/build.log" 2>&1; then
        # not installable into that Python: built in place, without the entry points (`torch.compile(...,
        # backend="neuron")` then reports InvalidBackend in the table)
        tail -20 "$out/build.log"
        "$python" setup.py build_ext --inplace >>"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
        export PYTHONPATH="$PWD/src:$PYTHONPATH"
    fi
fi
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
if [ "${2:-}" = check ]; then
    # one GPU: the tests of one device (multi-device and multi-process tests need several)
    platform=cuda
    [ -n "${CPU_CHECK:-}" ] && platform=cpu
    TORCHNEURON_PLATFORM=$platform timeout "${CHECK_TIMEOUT:-170}" "$python" -m pytest -v -p no:cacheprovider \
        tests/test_models.py tests/test_training.py tests/test_autograd_training.py \
        tests/test_views_inplace.py tests/test_attention.py tests/test_half_precision.py \
        tests/compile/test_behaviour.py tests/test_transfers_factories.py 2>&1 | tee "$out/check.log" | grep -E "FAILED|ERROR|Timeout|passed|failed" || true
    # counted from the log too: a run stopped at its time limit prints no summary
    echo "check: $(grep -c ' PASSED' "$out/check.log") passed, $(grep -c ' FAILED' "$out/check.log") failed so far"
    exit 0
fi
if [ -n "${CPU_CHECK:-}" ]; then
    exec "$python" -m bench.gpu --out "$out" --cpu --smoke
fi
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
"$python" -c "import torch, jax; print('torch', torch.__version__, 'jax', jax.__version__, jax.devices())" | tee "$out/versions.txt"
timeout "${BENCH_TIMEOUT:-540}" "$python" -m bench.gpu --out "$out" 2>&1 | tee "$out/bench.log"
