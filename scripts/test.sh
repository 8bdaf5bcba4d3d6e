#!/usr/bin/env bash
# Sets everything up, then runs the test suite (slow sweeps excluded; `scripts/test.sh -m slow` runs them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
