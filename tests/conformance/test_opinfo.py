"""OpInfo conformance: op_db samples on neuron against the CPU, with CPU fallback made an error.

The default run checks a sampled subset (float32 forward and grad); `pytest -m slow` checks every
op_db entry in every tested dtype with its variants and error inputs. Either way an unlisted
failure fails, and so does a listed one that now passes: the list in expected_failures.txt only shrinks.
"""
import pytest

from torchneuron.conformance import harness, report

from . import expected

EXPECTED = expected.load()
ALL_OPS = harness.all_ops()


def _check(op, checks, dtypes):
    results = harness.check_op(op, checks, dtypes)
    failing = {r.key: r.message for r in results if r.status != harness.PASS}
    listed = {r.key for r in results} & EXPECTED.keys()
    unexpected = {k: v for k, v in failing.items() if k not in listed}
    fixed = listed - failing.keys()
    assert not unexpected, "new failures (fix them, or list them with a reason):\n" + "\n".join(
        f"{k}  {v}" for k, v in sorted(unexpected.items())
    )
    assert not fixed, "listed failures that now pass (remove them from expected_failures.txt):\n" + "\n".join(
        sorted(fixed)
    )


@pytest.mark.parametrize("op", [op for op in ALL_OPS if report.in_subset(harness.op_id(op))], ids=harness.op_id)
def test_sampled_op(op):
    _check(op, report.SUBSET_CHECKS, report.SUBSET_DTYPES)


@pytest.mark.slow
@pytest.mark.parametrize("op", ALL_OPS, ids=harness.op_id)
def test_op(op):
    _check(op, harness.CHECKS, harness.DTYPES)


def test_expected_failures_name_real_checks():
    planned = {
        f"{harness.op_id(op)} {check}:{harness.dtype_name(dtype) if dtype else '-'}"
        for op in ALL_OPS
        for check, dtype in harness.planned(op) + [("timeout", None)]
    }
    assert not EXPECTED.keys() - planned, f"stale entries: {sorted(EXPECTED.keys() - planned)}"
