"""OpInfo conformance: op_db samples on neuron against the CPU, with CPU fallback made an error.

The default run checks a sampled subset (float32 forward and grad); `pytest -m slow` checks every
op_db entry in every tested dtype with its variants and error inputs. The sweep runs in child
processes (an op that aborts its process fails alone), then each op's results are asserted: an
unlisted failure fails, and so does a listed one that now passes, so expected_failures.txt only shrinks.
"""
import pytest
import torch

import torchneuron.compile as neuron_compile
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


@pytest.mark.parametrize("check, graphs_per_sample", [("compiled", 1), ("compiled_grad", 2)])
def test_compiled_checks_compile_every_sample(check, graphs_per_sample):
    """Each sample gets graphs of its own (forward; forward and backward): with a wrapper Dynamo skips,
    every sample after a process's first ran eagerly, and the check passed on eager's answers."""
    op = next(op for op in ALL_OPS if harness.op_id(op) == "mul")
    samples = list(harness._samples(op, torch.float32, check == "compiled_grad",
                                    harness.max_samples(check, torch.float32)))
    for _ in range(2):  # and again, after this process has compiled
        before = neuron_compile.report()["graphs"]
        result, = harness.check_op(op, [check], [torch.float32])
        assert result.status == harness.PASS, result.message
        assert neuron_compile.report()["graphs"] - before == graphs_per_sample * len(samples)


def test_low_precision_results_are_still_checked(monkeypatch):
    """The float32 reference accepts other roundings of the right answer, not a wrong answer."""
    from torchneuron.eager import dispatch

    op = next(op for op in ALL_OPS if harness.op_id(op) == "neg")
    monkeypatch.setitem(dispatch._HANDLERS, torch.ops.aten.neg.default, lambda func, args, kwargs: args[0].clone())
    result = harness.check_op(op, ["forward"], [torch.bfloat16])[0]
    assert result.status == harness.FAIL and "not close" in result.message


def _sort_sample(**kwargs):
    from torch.testing._internal.opinfo.core import SampleInput

    return SampleInput(torch.tensor([[2.0, 1.0, 2.0, 1.0]]), **kwargs)


@pytest.mark.parametrize("stable, passes", [(False, True), (True, False)])
def test_unstable_sort_may_order_ties_either_way(stable, passes):
    sample = _sort_sample(kwargs={"dim": 1, "stable": stable})
    values = torch.tensor([[1.0, 1.0, 2.0, 2.0]])
    cpu, neuron = (values, torch.tensor([[1, 3, 0, 2]])), (values, torch.tensor([[3, 1, 2, 0]]))
    canonical = harness._CANONICAL["sort"]
    if passes:
        harness.assert_close(*canonical(sample, neuron, cpu))
    else:
        with pytest.raises(AssertionError):
            harness.assert_close(*canonical(sample, neuron, cpu))


def test_sort_indices_must_pick_the_right_values():
    sample = _sort_sample(kwargs={"dim": 1})
    values = torch.tensor([[1.0, 1.0, 2.0, 2.0]])
    cpu, wrong = (values, torch.tensor([[1, 3, 0, 2]])), (values, torch.tensor([[1, 0, 3, 2]]))
    with pytest.raises(AssertionError):
        harness.assert_close(*harness._CANONICAL["sort"](sample, wrong, cpu))


def test_eigenvectors_are_compared_up_to_sign():
    vectors = torch.linalg.eigh(torch.tensor([[2.0, 1.0], [1.0, 3.0]]))
    flipped = (vectors[0], vectors[1] * torch.tensor([-1.0, 1.0]))
    harness.assert_close(*harness._CANONICAL["linalg.eigh"](None, flipped, vectors))
    swapped = (vectors[0], vectors[1].flip(-1))
    with pytest.raises(AssertionError):
        harness.assert_close(*harness._CANONICAL["linalg.eigh"](None, swapped, vectors))
