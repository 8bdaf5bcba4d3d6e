#!/usr/bin/env bash
# Creates .venv (if needed) and installs TorchNeuron with its test dependencies. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# torch first and pinned: an unpinned resolve would pull a multi-GB CUDA build on Linux
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==${TORCH_VERSION:-2.13.0}"
# the native extension is compiled against the torch just installed, so no isolated build environment
.venv/bin/python -m pip install -q --disable-pip-version-check "setuptools>=68" wheel
.venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation -e ".[test]" \
    || { echo "torchneuron: installing (and building the native extension) failed; see the compiler output above" >&2; exit 1; }
