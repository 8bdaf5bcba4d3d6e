"""OpInfo conformance: op_db samples on neuron against the CPU, with CPU fallback made an error.

The default run checks a sampled subset (float32 forward and grad); `pytest -m slow` checks every
op_db entry in every tested dtype with its variants and error inputs. The sweep runs in child
processes (an op that aborts its process fails alone), then each op's results are asserted: an
unlisted failure fails, and so does a listed one that now passes, so expected_failures.txt only shrinks.
"""
import pytest
import torch

from torchneuron.conformance import harness, report

from . import expected

EXPECTED = expected.load()
ALL_OPS = harness.all_ops()
SUBSET = [op for op in ALL_OPS if report.in_subset(harness.op_id(op))]


def _results_by_op(ops, checks, dtypes, directory):
    results = report.sweep(ops, checks, dtypes, str(directory / "results.jsonl"))
    by_op = {}
    for result in results:
        by_op.setdefault(result.op, []).append(result)
    return by_op


@pytest.fixture(scope="module")
def subset_results(tmp_path_factory):
    return _results_by_op(SUBSET, report.SUBSET_CHECKS, report.SUBSET_DTYPES, tmp_path_factory.mktemp("subset"))


@pytest.fixture(scope="module")
def full_results(tmp_path_factory):
    return _results_by_op(ALL_OPS, harness.CHECKS, harness.DTYPES, tmp_path_factory.mktemp("full"))


def _assert_as_listed(op, results):
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


@pytest.mark.parametrize("op", SUBSET, ids=harness.op_id)
def test_sampled_op(op, subset_results):
    _assert_as_listed(op, subset_results.get(harness.op_id(op), []))


@pytest.mark.slow
@pytest.mark.parametrize("op", ALL_OPS, ids=harness.op_id)
def test_op(op, full_results):
    _assert_as_listed(op, full_results.get(harness.op_id(op), []))


def test_expected_failures_name_real_checks():
    planned = {
        harness.key(harness.op_id(op), check, dtype)
        for op in ALL_OPS
        for check, dtype in harness.planned(op) + [("timeout", None), ("crash", None)]
    }
    assert not EXPECTED.keys() - planned, f"stale entries: {sorted(EXPECTED.keys() - planned)}"


def test_harness_catches_a_wrong_result(monkeypatch):
    """The harness is not vacuous: neg computing the identity on neuron fails its check."""
    from torchneuron.eager import dispatch

    op = next(op for op in ALL_OPS if harness.op_id(op) == "neg")
    monkeypatch.setitem(dispatch._HANDLERS, torch.ops.aten.neg.default, lambda func, args, kwargs: args[0].clone())
    result = harness.check_op(op, ["forward"], [torch.float32])[0]
    assert result.status == harness.FAIL and "not close" in result.message
