"""`_foreach_*` ops (ops/foreach.py): PyTorch's foreach OpInfo samples on neuron against the CPU, with the CPU
fallback an error (every op in the slow sweep, those optimizers call in the default run), and the per-tensor
lowering traced once per signature of a list's tensors."""
import jax.numpy as jnp
import pytest
import torch
from torch.testing._internal import common_methods_invocations as opinfo
from torch.utils._pytree import tree_map

from torchneuron.conformance.harness import assert_close
from torchneuron.eager import fallback
from torchneuron.ops import checks, foreach

FOREACH_OPS = [op for name in dir(opinfo) if name.startswith("foreach_") and name.endswith("_op_db")
               for op in getattr(opinfo, name)]
SAMPLES_PER_DTYPE = 2
OPTIMIZER_OPS = {"_foreach_add", "_foreach_mul", "_foreach_addcmul", "_foreach_addcdiv", "_foreach_lerp",
                 "_foreach_sqrt", "_foreach_maximum", "_foreach_norm", "_foreach_div", "_foreach_sign"}


def _to(value, device):
    return tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, value)


def _outcome(fn):
    try:
        return fn(), None
    except Exception as error:  # the CPU's error is the expected one
        return None, type(error)


def _check_samples(op, dtypes, samples_per_dtype):
    checked = 0
    for dtype in dtypes:
        if dtype not in op.supported_dtypes("cpu"):
            continue
        for sample in list(op.sample_inputs("cpu", dtype))[:samples_per_dtype]:
            args = (sample.input, *sample.args)
            expected, expected_error = _outcome(lambda: op.op(*args, **sample.kwargs))
            with fallback.as_error():
                got, error = _outcome(lambda: _to(op.op(*_to(args, "neuron"), **_to(sample.kwargs, "neuron")),
                                                  "cpu"))
            assert error is expected_error, (dtype, sample)
            if expected_error is None:
                assert_close(got, expected)  # the OpInfo sweep's tolerances
            checked += 1
    assert checked


@pytest.mark.slow  # a program compiled per sample: 2 minutes on 2 cores
@pytest.mark.parametrize("op", FOREACH_OPS, ids=lambda op: op.name)
def test_foreach_samples_match_the_cpu(op):
    _check_samples(op, (torch.float32, torch.bfloat16, torch.int64), SAMPLES_PER_DTYPE)


# what optimizers and gradient clipping call, one sample each in the default run
@pytest.mark.parametrize("op", [op for op in FOREACH_OPS if op.name in OPTIMIZER_OPS], ids=lambda op: op.name)
def test_optimizer_foreach_ops_match_the_cpu(op):
    _check_samples(op, (torch.float32,), 1)


def _lowered_like_the_cpu(call):
    tensors = [torch.randn(5, 3), torch.randn(7)]
    exponents = [torch.rand(5, 3) + 0.5, torch.rand(7) + 0.5]
    with fallback.as_error():
        got = call(_to(tensors, "neuron"), _to(exponents, "neuron"))
    torch.testing.assert_close(_to(got, "cpu"), list(call(tensors, exponents)), equal_nan=True)


def test_foreach_norm_takes_its_dtype_and_pow_of_two_lists_is_lowered():
    _lowered_like_the_cpu(lambda tensors, _: torch._foreach_norm(tensors, 3, torch.float64))  # dtype positional
    _lowered_like_the_cpu(lambda tensors, exponents: torch._foreach_pow(tensors, exponents))


def test_foreach_powsum_is_lowered():
    _lowered_like_the_cpu(lambda tensors, _: torch._foreach_powsum(tensors, 3))
    _lowered_like_the_cpu(lambda tensors, _: torch._foreach_powsum(tensors, 2, dtype=torch.float64))


def test_a_list_traces_its_per_tensor_lowering_once_per_signature_and_keeps_its_checks():
    traced_shapes = []

    def checked_sqrt(x, scale):
        traced_shapes.append(x.shape)
        checks.require(x >= 0, ValueError, "negative")
        return jnp.sqrt(x) * scale

    arrays = [jnp.ones(3), jnp.ones((2, 2)), 4 * jnp.ones(3), -jnp.ones((2, 2))]
    traced = {}
    with checks.collecting() as found:
        results = [foreach._once_per_signature(traced, checked_sqrt, (x, 2.0), {}) for x in arrays]
    assert traced_shapes == [(3,), (2, 2)]
    assert [float(r.sum()) for r in results[:3]] == [6.0, 8.0, 12.0]
    assert [(bool(condition), error, message) for condition, error, message in found] == [
        (True, ValueError, "negative")] * 3 + [(False, ValueError, "negative")]
