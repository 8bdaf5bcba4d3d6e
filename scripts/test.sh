#!/usr/bin/env bash
# Sets everything up, then runs the test suite (slow sweeps excluded; `scripts/test.sh -m slow` runs them).
# Two pytest-xdist workers, each running whole test files: a test process spends much of its time waiting
# (on child processes, XLA's compiler threads), and two halved the suite's time on 2 cores (17.5 -> 9.8
# minutes). TEST_WORKERS=0 runs it in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -n "${TEST_WORKERS:-2}" --dist loadfile "$@"
