#!/usr/bin/env bash
# Sets everything up, then runs the demo: a small GPT trained on neuron and on the CPU, side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/demo.py "$@"
