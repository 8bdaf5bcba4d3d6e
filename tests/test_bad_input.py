"""No silent wrong answers: results keep the CPU's dtype whatever ran before, and input the CPU rejects
raises the CPU's exception type on neuron (value checks at the next synchronisation, as on CUDA)."""
import os
import re
import subprocess
import sys
import traceback

import pytest
import torch
import torch.nn.functional as F

from torchneuron.eager import fallback

from conftest import assert_same


def test_python_scalar_type_decides_the_result_dtype_not_a_cached_executable():
    """1, 1.0, True and 1+0j are equal and hash alike; each promotes differently."""
    for device in ("cpu", "neuron"):
        u = torch.tensor((0, 1), dtype=torch.uint8, device=device)
        b = torch.tensor((False, True), device=device)
        results = [u + (1 + 0j), u + 1, u + 1.0, u + True, b + True, b + 1, b.add(1.0)]
        if device == "cpu":
            expected = results
    assert [r.dtype for r in results] == [e.dtype for e in expected]
    for r, e in zip(results, expected):
        torch.testing.assert_close(r.cpu(), e)


def test_the_default_dtype_decides_the_result_dtype_not_a_cached_executable():
    u = torch.tensor((0, 1), dtype=torch.uint8, device="neuron")
    ops = [lambda: u + 5.5, lambda: u / u, lambda: torch.sqrt(u), lambda: torch.arange(3.0, device="neuron")]
    assert [op().dtype for op in ops] == [torch.float32] * 4
    torch.set_default_dtype(torch.float64)
    try:
        assert [op().dtype for op in ops] == [torch.float64] * 4
        assert (u + 5.5).cpu().tolist() == [5.5, 6.5]
    finally:
        torch.set_default_dtype(torch.float32)
    assert [op().dtype for op in ops] == [torch.float32] * 4


def raises_like_cpu(bad, *, synchronise=False):
    """`bad(device)` raises on neuron what it raises on the CPU: the type and the message's first line."""
    with pytest.raises(Exception) as on_cpu:
        bad("cpu")
    with pytest.raises(Exception) as on_neuron:
        result = bad("neuron")
        if synchronise:
            torch.neuron.synchronize()
            result.cpu()
    assert on_neuron.type is on_cpu.type, on_neuron.value
    assert str(on_cpu.value).splitlines()[0] in str(on_neuron.value)
    assert "jax" not in str(on_neuron.value).lower()
    assert torch.ones(2, device="neuron").sum().item() == 2.0  # the device keeps working


def _x(d):
    return torch.tensor([1.0, -2.0], device=d)


@pytest.mark.parametrize(
    "bad",
    [
        lambda d: torch.neg(_x(d), out=torch.empty(2, dtype=torch.float64, device=d)),  # neg: exactly self's dtype
        lambda d: torch.neg(_x(d), out=torch.empty(2, dtype=torch.int64, device=d)),
        lambda d: torch.sin(_x(d), out=torch.empty(2, dtype=torch.int64, device=d)),  # not a safe cast
        lambda d: torch.add(_x(d), 1, out=torch.empty(2, dtype=torch.int32, device=d)),
        lambda d: torch.nonzero(_x(d), out=torch.empty(0, 1, dtype=torch.int32, device=d)),
        lambda d: torch.masked_select(_x(d), _x(d) > 0, out=torch.empty(0, dtype=torch.int64, device=d)),
        lambda d: torch.max(_x(d), 0, out=(torch.empty(0, device=d), torch.empty(0, dtype=torch.int32, device=d))),
        lambda d: torch.multinomial(_x(d).abs(), 1, out=torch.empty(0, dtype=torch.int32, device=d)),
        lambda d: torch.linalg.matrix_rank(torch.eye(2, device=d), out=torch.empty(0, dtype=torch.bool, device=d)),
        lambda d: torch.abs(_x(d) * 1j, out=torch.empty(0, dtype=torch.int64, device=d)),
    ],
    ids=["neg-float64", "neg-int64", "sin-int64", "add-int32", "nonzero-int32", "masked_select-int64", "max-int32",
         "multinomial-int32", "matrix_rank-bool", "abs-complex-int64"],
)
def test_out_of_a_dtype_the_cpu_kernel_refuses_raises(bad):
    raises_like_cpu(bad)


def test_out_of_a_dtype_the_cpu_kernel_accepts_is_written_in_it():
    for device in ("cpu", "neuron"):
        out = torch.empty(2, dtype=torch.float64, device=device)
        assert torch.add(_x(device), 1, out=out) is out
        assert out.dtype == torch.float64 and out.cpu().tolist() == [2.0, -1.0]


@pytest.mark.parametrize("out_dtype", [torch.complex64, torch.float64, torch.float16])
def test_absolute_value_of_complex_is_cast_into_the_out_dtype_as_the_cpu(out_dtype):
    """PyTorch's reference kernel wants float32 exactly; the CPU's casts the result into any out it can."""
    x = torch.tensor([3 + 4j, 1 - 1j])
    expected = torch.abs(x, out=torch.empty(0, dtype=out_dtype))
    assert_same(torch.abs(x.to("neuron"), out=torch.empty(0, dtype=out_dtype, device="neuron")), expected)


@pytest.mark.parametrize("out_dtype", [torch.int64, torch.bool, torch.float64])
def test_bernoulli_draws_into_an_out_of_any_dtype_as_the_cpu(out_dtype):
    p = torch.tensor([0.0, 1.0, 0.0, 1.0], device="neuron")
    out = torch.empty(0, dtype=out_dtype, device="neuron")
    assert torch.bernoulli(p, out=out) is out
    assert out.dtype == out_dtype and out.cpu().tolist() == torch.tensor([0, 1, 0, 1]).to(out_dtype).tolist()


@pytest.mark.parametrize(
    "op, dtype, column",
    [
        (lambda x, out: torch.neg(x, out=out), torch.float32, 0),
        (lambda x, out: torch.add(x, 1, out=out), torch.float32, 0),
        (lambda x, out: torch.masked_select(x, x > -5, out=out), torch.float32, 0),
        (lambda x, out: torch.nonzero(x, out=out), torch.int64, slice(0, 1)),
    ],
    ids=["neg", "add", "masked_select", "nonzero"],
)
def test_non_contiguous_out_of_the_right_size_keeps_its_strides(op, dtype, column):
    """The result is written through the out view into its base, as on the CPU (not to a restrided view)."""
    bases = {}
    for device in ("cpu", "neuron"):
        bases[device] = torch.zeros(2, 3, dtype=dtype, device=device)
        op(torch.tensor([1.0, -2.0], device=device), bases[device][:, column])
    torch.testing.assert_close(bases["neuron"].cpu(), bases["cpu"])


def _t(values, d, **kwargs):
    return torch.tensor(values, device=d, **kwargs)


def _logits(d, *shape):
    return torch.ones(*shape, device=d)


# value checks: the op is queued as on CUDA, the error (the CPU's type and message) comes at the next sync
VALUE_CHECKS = {
    "cross_entropy": lambda d: F.cross_entropy(_logits(d, 2, 3), _t([0, 3], d)),
    "cross_entropy-negative": lambda d: F.cross_entropy(_logits(d, 2, 3), _t([0, -2], d)),
    "cross_entropy-2d": lambda d: F.cross_entropy(_logits(d, 2, 3, 2), torch.full((2, 2), 4, device=d)),
    "nll_loss-1d": lambda d: F.nll_loss(_logits(d, 3), _t(5, d)),
    "multinomial-nan": lambda d: torch.multinomial(_t([0.5, float("nan")], d), 1),
    "bernoulli-probability-above-1": lambda d: torch.bernoulli(torch.full((2,), 1.5, device=d)),
    "multilabel_margin-target": lambda d: F.multilabel_margin_loss(torch.ones(1, 3, device=d), _t([[0, -1, 5]], d)),
    "bernoulli_-negative-probability": lambda d: torch.empty(2, device=d).bernoulli_(torch.full((2,), -0.5, device=d)),
    "multinomial-inf": lambda d: torch.multinomial(_t([0.5, float("inf")], d), 1),
    "multinomial-negative": lambda d: torch.multinomial(_t([0.5, -1.0], d), 1),
    "multinomial-zero-row": lambda d: torch.multinomial(_t([[0.0, 0.0], [1.0, 1.0]], d), 1, True),
    "scatter-negative": lambda d: torch.zeros(3, device=d).scatter(0, _t([-1], d), _t([1.0], d)),
    "scatter_-value": lambda d: torch.zeros(3, device=d).scatter_(0, _t([3], d), 1.0),
    "scatter_add": lambda d: torch.zeros(3, device=d).scatter_add(0, _t([3], d), _t([1.0], d)),
    "scatter_reduce": lambda d: torch.zeros(3, device=d).scatter_reduce(0, _t([3], d), _t([1.0], d), "sum"),
    "gather-negative": lambda d: torch.gather(_t([1.0, 2.0], d), 0, _t([-1], d)),
    "index_select-negative": lambda d: torch.index_select(_t([1.0, 2.0], d), 0, _t([-1], d)),
    "index-negative": lambda d: _t([1.0, 2.0], d)[_t([-3], d)],
    "index_put_": lambda d: torch.zeros(3, device=d).index_put_((_t([5], d),), _t([1.0], d)),
    "index_put_-accumulate": lambda d: torch.zeros(3, device=d).index_put_((_t([-4], d),), _t([1.0], d), True),
    "index_add": lambda d: torch.zeros(3, device=d).index_add(0, _t([-1], d), _t([1.0], d)),
    # the CPU's type and message depend on its kernel's path: by dimension and rank
    "index_add-outer-dim": lambda d: torch.zeros(3, 4, device=d).index_add(0, _t([7], d), torch.ones(1, 4, device=d)),
    "index_add-inner-dim": lambda d: torch.zeros(3, 4, device=d).index_add(1, _t([7], d), torch.ones(3, 1, device=d)),
    "index_add-middle-dim": lambda d: torch.zeros(2, 3, 4, device=d).index_add(1, _t([7], d),
                                                                                torch.ones(2, 1, 4, device=d)),
    "index_select-dim1": lambda d: torch.zeros(3, 4, device=d).index_select(1, _t([0, 7], d)),
    "index_select-last-dim": lambda d: torch.zeros(2, 3, 4, device=d).index_select(2, _t([7], d)),
    "index_copy": lambda d: torch.zeros(3, device=d).index_copy(0, _t([5], d), _t([1.0], d)),
    "index_fill": lambda d: torch.zeros(3, device=d).index_fill(0, _t([-4], d), 1.0),
    "take": lambda d: _t([1.0, 2.0], d).take(_t([5], d)),
    "put": lambda d: torch.zeros(3, device=d).put(_t([-4], d), _t([1.0], d)),
    "embedding-negative": lambda d: F.embedding(_t([-1], d), _logits(d, 3, 2)),
    "one_hot": lambda d: F.one_hot(_t([0, 3], d), 3),
    "one_hot-negative": lambda d: F.one_hot(_t([0, -1], d), 3),
    "binary_cross_entropy-input": lambda d: F.binary_cross_entropy(_t([0.5, 1.5], d), _t([0.5, 0.5], d)),
    "binary_cross_entropy-nan-input": lambda d: F.binary_cross_entropy(_t([float("nan")], d), _t([0.5], d)),
    "binary_cross_entropy-target": lambda d: F.binary_cross_entropy(_t([0.5, 0.5], d), _t([0.5, -0.5], d)),
    "multi_margin-target": lambda d: F.multi_margin_loss(torch.ones(2, 3, device=d), _t([0, 3], d)),
    "max_unpool2d-index": lambda d: F.max_unpool2d(torch.ones(1, 1, 2, 2, device=d), _t([[[[0, 1], [2, 99]]]], d), 2),
    "max_unpool3d-negative-index": lambda d: F.max_unpool3d(torch.ones(1, 1, 1, 2, 2, device=d),
                                                            _t([[[[[0, 1], [2, -1]]]]], d), 2),
    "embedding_bag-index": lambda d: F.embedding_bag(_t([1, 7], d), _logits(d, 3, 2), _t([0], d)),
    "embedding_bag-index-max": lambda d: F.embedding_bag(_t([1, 7], d), _logits(d, 3, 2), _t([0], d), mode="max"),
    "embedding_bag-last-offset": lambda d: F.embedding_bag(_t([1, 2], d), _logits(d, 3, 2), _t([0, 5], d)),
    "normal-negative-std-tensor": lambda d: torch.normal(torch.zeros(2, device=d), _t([1.0, -1.0], d)),
}


@pytest.mark.parametrize("bad", VALUE_CHECKS.values(), ids=VALUE_CHECKS.keys())
def test_bad_values_raise_like_the_cpu_at_synchronisation(bad):
    raises_like_cpu(bad, synchronise=True)


def test_ignore_index_and_negative_indices_where_allowed_still_work():
    for device in ("cpu", "neuron"):
        logits = torch.arange(6.0, device=device).reshape(2, 3)
        results = [
            F.cross_entropy(logits, _t([2, -100], device)),
            F.nll_loss(logits, _t([1, 7], device), ignore_index=7),
            _t([1.0, 2.0], device)[_t([-1], device)],
            torch.zeros(3, device=device).index_fill(0, _t([-1], device), 1.0),
            torch.zeros(3, device=device).put(_t([-1], device), _t([1.0], device)),
            F.one_hot(_t([[0, 2]], device)),
            F.one_hot(_t([0, 2], device), 4),
        ]
        if device == "cpu":
            expected = results
    torch.neuron.synchronize()
    for r, e in zip(results, expected):
        torch.testing.assert_close(r.cpu(), e)


@pytest.mark.parametrize(
    "bad",
    [
        lambda d: torch.repeat_interleave(_t([1.0, 2.0], d), _t([1, -1], d)),
        lambda d: torch.repeat_interleave(_t([1, -1], d)),
        lambda d: torch.bincount(_t([1, -1], d)),
        lambda d: F.one_hot(torch.zeros(0, dtype=torch.long, device=d)),
    ],
    ids=["repeat_interleave", "repeat_interleave-repeats", "bincount", "one_hot-empty"],
)
def test_bad_values_of_data_dependent_ops_raise_at_the_call(bad):
    raises_like_cpu(bad)


@pytest.mark.parametrize(
    "bad",
    [
        lambda d: torch.masked_select(torch.ones(3, device=d), torch.ones(3, device=d)),
        lambda d: torch.unique(torch.ones(3, device=d), dim=2),
        lambda d: torch.unique_consecutive(torch.ones(3, device=d), dim=-3),
        lambda d: torch.unique(torch.tensor(1.0, device=d), dim=0),
    ],
    ids=["masked_select-float-mask", "unique-dim", "unique_consecutive-dim", "unique-dim-of-a-scalar"],
)
def test_bad_arguments_of_data_dependent_ops_raise_as_on_the_cpu(bad):
    """These ops have no meta kernel to check their arguments: their lowerings raise the CPU's errors (a float
    mask selected, a dimension out of range wrapped round)."""
    raises_like_cpu(bad)


_BLOCKING = """
import pytest, torch
x = torch.zeros(3, device="neuron")
with pytest.raises(RuntimeError, match="index 5 is out of bounds .* reported at the op"):
    x.scatter_(0, torch.tensor([5], device="neuron"), 1.0)
print("raised at the op")
"""


def test_launch_blocking_raises_value_errors_at_the_op():
    env = dict(os.environ, TORCHNEURON_LAUNCH_BLOCKING="1")
    run = subprocess.run([sys.executable, "-c", _BLOCKING], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0 and "raised at the op" in run.stdout, run.stderr[-3000:]


@pytest.mark.parametrize("float8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16, torch.int64])
def test_float8_conversions_saturate_as_on_the_cpu(source, float8):
    """e4m3fn has no infinities: the CPU saturates beyond 448 (inf included) instead of giving nan."""
    values = [464.0, 480.0, 500.0, 1e30, float("inf"), -float("inf"), float("nan"), -500.0, 0.001, 2.0**-10]
    x = torch.tensor([1000, -1000, 3, 448, 449]) if source == torch.int64 else torch.tensor(values).to(source)
    expected = x.to(float8).float().nan_to_num(7.0)
    converted = x.to("neuron").to(float8)
    copied = torch.empty(x.shape, dtype=float8, device="neuron").copy_(x.to("neuron"))
    for result in (converted, copied):
        assert result.dtype == float8
        assert torch.equal(result.float().cpu().nan_to_num(7.0), expected)


@pytest.mark.parametrize(
    "too_big",
    [
        lambda: torch.empty(1 << 40, device="neuron"),
        lambda: torch.zeros(1 << 38, device="neuron"),
        lambda: torch.ones(1, device="neuron").expand(1 << 38).contiguous(),  # the program's own allocation
    ],
    ids=["empty", "zeros", "program-output"],
)
def test_an_allocation_beyond_the_device_raises_out_of_memory_and_the_device_keeps_working(too_big):
    assert torch.neuron.OutOfMemoryError is torch.OutOfMemoryError
    before = torch.neuron.memory_allocated()
    ooms = torch.neuron.memory_stats()["num_ooms"]
    with pytest.raises(torch.OutOfMemoryError, match=r"neuron out of memory.*(1099511627776|4398046511104) bytes"):
        too_big()
    assert torch.neuron.memory_allocated() <= before  # nothing of the failed request stays counted
    assert torch.neuron.memory_stats()["num_ooms"] == ooms + 1
    assert torch.ones(1000, device="neuron").sum().item() == 1000.0


def test_growing_a_storage_beyond_the_device_raises_out_of_memory():
    x = torch.ones(4, device="neuron")
    with pytest.raises(torch.OutOfMemoryError, match="neuron out of memory"):
        x.untyped_storage().resize_(1 << 42)
    assert x.untyped_storage().nbytes() == 16 and x.sum().item() == 4.0


def _set(x, key, value):
    x[key] = value
    return x


INDEXING = {
    "cpu-mask-set": lambda d: _set(torch.zeros(3, device=d), torch.tensor([True, False, True]), 1.0),
    "cpu-index-set": lambda d: _set(torch.zeros(3, device=d), torch.tensor([0, 2]), torch.tensor(5.0)),
    "cpu-mask-column-add": lambda d: _set(torch.zeros(2, 3, device=d), (slice(None), torch.tensor([1, 0, 1]).bool()), 2.0),
    "cpu-index": lambda d: torch.arange(12.0, device=d).reshape(3, 4)[torch.tensor([0, 1])],
    "cpu-indices": lambda d: torch.arange(12.0, device=d).reshape(3, 4)[torch.tensor([0, 1]), torch.tensor([1, 2])],
    "cpu-mask": lambda d: torch.arange(12.0, device=d).reshape(3, 4)[torch.tensor([True, False, True])],
}


@pytest.mark.parametrize("indexing", INDEXING.values(), ids=INDEXING.keys())
def test_cpu_index_and_mask_tensors_index_neuron_tensors_as_cuda_ones(indexing):
    torch.testing.assert_close(indexing("neuron").cpu(), indexing("cpu"))


@pytest.mark.parametrize(
    "bad",
    [
        lambda d: torch.zeros(3, 4, device=d)[torch.tensor([True, False], device=d)],
        lambda d: torch.zeros(3, 4, device=d)[:, torch.tensor([True, False, True], device=d)],
        lambda d: torch.zeros(3, 4, device=d)[torch.ones(3, 3, dtype=torch.bool, device=d)],
        lambda d: _set(torch.zeros(3, 4, device=d), torch.tensor([True, False], device=d), 1.0),
    ],
    ids=["rows", "columns", "2d", "set"],
)
def test_a_mask_of_the_wrong_shape_raises_index_error(bad):
    raises_like_cpu(bad)


FILL_OVERFLOWS = {
    "full-float8": lambda d: torch.full((2,), 1000.0, dtype=torch.float8_e4m3fn, device=d),
    "fill-float8-inf": lambda d: torch.zeros(2, dtype=torch.float8_e4m3fn, device=d).fill_(float("inf")),
    "fill-half": lambda d: torch.zeros(2, dtype=torch.float16, device=d).fill_(1e6),
    "fill-float": lambda d: torch.zeros(2, device=d).fill_(1e300),
    "fill-int8": lambda d: torch.zeros(2, dtype=torch.int8, device=d).fill_(128),
    "fill-uint8-negative-float": lambda d: torch.zeros(2, dtype=torch.uint8, device=d).fill_(-0.5),
    "fill-uint8-below-wrap": lambda d: torch.zeros(2, dtype=torch.uint8, device=d).fill_(-256),
}


@pytest.mark.parametrize("bad", FILL_OVERFLOWS.values(), ids=FILL_OVERFLOWS.keys())
def test_fill_values_the_dtype_cannot_hold_raise_at_the_call(bad):
    """The device program would saturate or wrap them: the CPU refuses them."""
    raises_like_cpu(bad)


def test_fill_values_the_cpu_accepts_give_its_values():
    fills = [(torch.float8_e5m2, float("inf")), (torch.float16, float("nan")), (torch.int8, -3.7),
             (torch.uint8, -1), (torch.uint8, -255), (torch.bool, 5), (torch.float16, 65504.0)]
    with fallback.as_error():
        for dtype, value in fills:
            got = torch.zeros(2, dtype=dtype, device="neuron").fill_(value).cpu()
            torch.testing.assert_close(got, torch.zeros(2, dtype=dtype).fill_(value), equal_nan=True)


def _partly_itself(d, write):
    """`write` of a tensor part of whose elements it reads (TensorIterator refuses it; a whole alias is fine)."""
    x = torch.arange(4.0, device=d)
    write(x)
    x.add_(x)
    return x


def _cat_into_its_input(d):
    x = torch.arange(6.0, device=d)
    return torch.cat([x[:2], x[2:4]], out=x[:4])


@pytest.mark.parametrize(
    "bad",
    [
        lambda d: torch.ones(3, device=d).clamp(),
        lambda d: torch.ones(3, device=d).clamp_(),
        lambda d: torch.clamp(torch.ones(3, device=d), out=torch.empty(3, device=d)),
        lambda d: torch.sub(torch.ones(3, dtype=torch.int32, device=d), 1, alpha=1.5),
        lambda d: torch.add(torch.ones(3, dtype=torch.bool, device=d), True, alpha=1.5),
        lambda d: torch.ones(2, 2, dtype=torch.bool, device=d).index_fill_(1, torch.tensor([0], device=d), 1 + 1j),
        lambda d: torch.ones(2, 2, device=d).index_fill(1, torch.tensor([0], device=d), torch.tensor(1j, device=d)),
        lambda d: torch.multinomial(torch.tensor([1, 2], device=d), 1),
        lambda d: torch.multinomial(torch.tensor([1.0, 2.0], device=d), 3),
        lambda d: torch.index_select(torch.ones(3, 6, device=d), 1, torch.tensor([0, 1], device=d),
                                     out=torch.empty(1, 6, device=d).expand(2, 6)),
        lambda d: torch.index_select(torch.ones(3, device=d), 0, torch.zeros(1, 1, dtype=torch.long, device=d)),
        lambda d: torch.ones(2, device=d).softmax(2),
        lambda d: torch.tensor(1.0, device=d).log_softmax(1),
        lambda d: torch.sort(torch.ones(3, device=d), dim=1),
        lambda d: torch.argsort(torch.ones(3, device=d), dim=-2, stable=True),
        lambda d: torch.mm(torch.ones(2, 2, device=d), torch.ones(2, 2, dtype=torch.float64, device=d)),
        lambda d: torch.addmm(torch.ones(2, 2, dtype=torch.float64, device=d), torch.ones(2, 2, device=d),
                              torch.ones(2, 2, device=d)),
        lambda d: torch.mv(torch.ones(2, 2, device=d), torch.ones(2, dtype=torch.float64, device=d)),
        # beyond the size the CPU is asked about on zeros: asked on empty tensors of the same dtypes
        lambda d: F.linear(torch.ones(64, 1024, device=d), torch.ones(1024, 1024, dtype=torch.float64, device=d)),
        lambda d: torch.randint(5, 3, (2,), device=d),
        lambda d: torch.empty(2, device=d).random_(0),
        lambda d: torch.ones(3, device=d).as_strided((5,), (1,)),
        lambda d: torch.ones(3, device=d)[1:].as_strided((3,), (1,)),
        lambda d: torch.ones(3, device=d).as_strided_((4,), (1,)),
        lambda d: F.conv_transpose1d(torch.ones(1, 1, 4, device=d), torch.ones(1, 1, 2, device=d), output_padding=2),
        lambda d: F.conv_transpose3d(torch.ones(1, 1, 4, 4, 4, device=d), torch.ones(1, 1, 2, 2, 2, device=d),
                                     output_padding=(0, 0, 1)),
        lambda d: F.scaled_dot_product_attention(*[torch.ones(1, 2, 3, 4, device=d)] * 3,
                                                 attn_mask=torch.ones(3, 3, dtype=torch.long, device=d)),
        lambda d: F.scaled_dot_product_attention(torch.ones(1, 2, 3, 4, device=d),
                                                 torch.ones(1, 2, 3, 4, dtype=torch.bfloat16, device=d),
                                                 torch.ones(1, 2, 3, 4, device=d)),
        lambda d: F.smooth_l1_loss(torch.ones(2, device=d), torch.zeros(2, device=d), beta=-1.0),
        lambda d: _cat_into_its_input(d),
        lambda d: F.adaptive_avg_pool2d(torch.ones(1, 1, 0, 2, device=d), 2),
        lambda d: torch.ops.aten.upsample_bilinear2d(torch.ones(1, 4, 4, device=d), [2, 2], False),
        lambda d: torch.zeros(2, dtype=torch.int8, device=d).random_(0, 1000),
        lambda d: torch.randint(0, 300, (2,), dtype=torch.uint8, device=d),
        lambda d: torch.mvlgamma(torch.full((2,), 3.0, device=d), 0),
        lambda d: F.interpolate(torch.ones(1, 0, 2, 2, device=d), size=4, mode="bilinear"),
        lambda d: _partly_itself(d, lambda x: x[1:].add_(x[:-1])),
        lambda d: _partly_itself(d, lambda x: torch.add(x[:2], x[1:3], out=x[1:3])),
        lambda d: _partly_itself(d, lambda x: x.view(2, 2).T.copy_(x.view(2, 2))),
    ],
    ids=["clamp", "clamp_", "clamp-out", "sub-int-float-alpha", "add-bool-float-alpha", "index_fill_-bool-complex",
         "index_fill-complex-tensor", "multinomial-integer", "multinomial-more-samples-than-categories",
         "index_select-overlapping-out", "index_select-2d-index", "softmax-dim", "log_softmax-dim-of-a-scalar",
         "sort-dim", "argsort-dim", "mm-float-double", "addmm-double-bias", "mv-float-double", "linear-large-float-double",
         "randint-empty-range", "random_-to-0", "as_strided-beyond-storage", "as_strided-of-a-slice-beyond-storage",
         "as_strided_-beyond-storage", "conv_transpose1d-output-padding", "conv_transpose3d-output-padding",
         "sdpa-long-mask", "sdpa-mixed-dtypes", "smooth_l1-negative-beta", "cat-out-overlapping-an-input",
         "adaptive_avg_pool2d-empty-window", "upsample_bilinear2d-3d-input", "random_-beyond-int8",
         "randint-beyond-uint8",
         "mvlgamma-order-0", "interpolate-no-channels", "add_-of-part-of-itself", "add-out-part-of-an-input",
         "copy_-transposed-into-itself"],
)
def test_input_the_meta_kernel_judges_otherwise_raises_the_cpu_kernels_error(bad):
    """Meta kernels written in Python (torch._refs) raise ValueError where the CPU kernel raises
    RuntimeError (clamp without bounds), or accept what it rejects (a float alpha for booleans, a dimension
    out of range wrapped round, float32 against float64 in a matrix product, a view beyond its storage: meta
    storages are not bounds-checked)."""
    raises_like_cpu(bad)


def _compiled(bad):
    """`bad` compiled: neuron's graph, or the CPU's ops run by Dynamo's eager backend."""
    return lambda d: torch.compile(bad, backend="neuron" if d == "neuron" else "eager")(d)


@pytest.mark.parametrize(
    "bad",
    [
        lambda d: torch.ones(2, device=d).softmax(2),
        lambda d: torch.sort(torch.ones(3, device=d), dim=1),
        lambda d: F.smooth_l1_loss(torch.ones(2, device=d), torch.zeros(2, device=d), beta=-1.0),
        lambda d: F.conv_transpose1d(torch.ones(1, 1, 4, device=d), torch.ones(1, 1, 2, device=d), output_padding=2),
        lambda d: torch.ones(2, device=d).uniform_(2, 1),
        lambda d: torch.empty(0, 3, device=d).max(0),
        lambda d: torch.empty(0, device=d).min(),
        lambda d: torch.empty(0, 3, device=d).mode(0),
    ],
    ids=["softmax-dim", "sort-dim", "smooth_l1-negative-beta", "conv_transpose1d-output-padding", "uniform_-bounds",
         "max-over-nothing", "min-of-nothing", "mode-over-nothing"],
)
def test_a_compiled_graph_raises_the_cpu_kernels_error_its_meta_kernel_lacks(bad):
    """Fake tensors run PyTorch's meta kernels, which take these: the graph's nodes run our checks, and a
    lowering that fails (a JAX error) raises the CPU kernel's error for the node's arguments."""
    raises_like_cpu(_compiled(bad))


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("case", [
    lambda d: torch.median(torch.empty(0, device=d)),
    lambda d: torch.nanmedian(torch.empty(0, dtype=torch.float16, device=d)),
    lambda d: torch.median(torch.empty(0, dtype=torch.int64, device=d)),
    lambda d: torch.median(torch.empty(0, dtype=torch.int16, device=d)),
    lambda d: F.adaptive_avg_pool2d(torch.ones(1, 1, 4, 4, device=d), (0, 2)),
    lambda d: F.adaptive_max_pool2d(torch.ones(1, 1, 4, 4, device=d), (2, 0)),
], ids=["median-float", "nanmedian-half", "median-int64", "median-int16", "adaptive_avg_pool-to-nothing",
        "adaptive_max_pool-to-nothing"])
def test_reductions_of_nothing_give_the_cpus_values(case, compiled):
    """The median of no elements is NaN (as the CPU converts it for integers); pooling to no windows is empty."""
    run = _compiled(case) if compiled else case
    assert_same(run("neuron"), case("cpu"), equal_nan=True)


@pytest.mark.parametrize("correction", [3, 4.5])
def test_a_variance_with_more_corrections_than_elements_divides_by_zero_as_the_cpu(correction):
    """The CPU divides by max(0, count - correction): inf, or NaN for 0/0 (a complex input's imaginary part)."""
    for x in (torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.0, 2.0, 4.0]) + 0j, torch.ones(3, 2)):
        for reduce in (lambda t: t.var(correction=correction), lambda t: t.std(0, correction=correction),
                       lambda t: torch.var_mean(t, correction=correction)[0]):
            torch.testing.assert_close(reduce(x.to("neuron")).cpu(), reduce(x), equal_nan=True)


def _complex_pair(d):
    return torch.tensor([1 + 2j, 3 - 1j], device=d)


# XLA would answer each of these (it orders complex numbers lexicographically, multiplies bool matrices)
REFUSED_DTYPES = {
    "lt-complex": lambda d: _complex_pair(d) < _complex_pair(d),
    "maximum-complex": lambda d: torch.maximum(_complex_pair(d), _complex_pair(d)),
    "sort-complex": lambda d: torch.sort(_complex_pair(d)),
    "max-complex": lambda d: _complex_pair(d).max(),
    "clamp-complex": lambda d: _complex_pair(d).clamp(0, 1),
    "sign-complex": lambda d: _complex_pair(d).sign(),
    "unique-complex": lambda d: torch.unique(_complex_pair(d)),
    "mm-bool": lambda d: torch.ones(2, 2, dtype=torch.bool, device=d) @ torch.ones(2, 2, dtype=torch.bool, device=d),
    "softmax-int": lambda d: torch.arange(4, device=d).softmax(0),
    "gcd-float": lambda d: torch.gcd(torch.ones(2, device=d), torch.ones(2, device=d)),
    "ceil-bool": lambda d: torch.ones(2, dtype=torch.bool, device=d).ceil(),
    "soft_margin_loss-int": lambda d: F.soft_margin_loss(torch.ones(2, dtype=torch.long, device=d),
                                                         torch.ones(2, dtype=torch.long, device=d)),
    "sub-python-bool": lambda d: torch.ones(2, device=d) - True,
    "rsub-python-bool": lambda d: True - torch.ones(2, device=d),
    "lt-complex-compiled": lambda d: torch.compile(torch.lt, backend="neuron" if d == "neuron" else "inductor")(
        _complex_pair(d), _complex_pair(d)),
}


@pytest.mark.parametrize("bad", REFUSED_DTYPES.values(), ids=REFUSED_DTYPES.keys())
def test_dtypes_the_cpu_kernel_refuses_are_refused_with_its_error(bad):
    raises_like_cpu(bad)


def test_a_compiled_graph_raises_its_refusal_afresh_at_each_call():
    compiled = torch.compile(torch.lt, backend="neuron")
    tracebacks = []
    for _ in range(2):
        with pytest.raises(RuntimeError, match="not implemented for 'ComplexFloat'") as caught:
            compiled(_complex_pair("neuron"), _complex_pair("neuron"))
        tracebacks.append(len(traceback.extract_tb(caught.value.__traceback__)))
    assert tracebacks[1] == tracebacks[0]


@pytest.mark.parametrize("out_dtype", [torch.int64, torch.float16])
@pytest.mark.parametrize("reduce", [
    lambda x, out: torch.sum(x, 0, out=out), lambda x, out: torch.sum(x, (), out=out),
    lambda x, out: torch.prod(x + 1, 0, out=out), lambda x, out: torch.cumsum(x, 0, out=out),
    lambda x, out: torch.cumprod(x + 1, 0, out=out),
], ids=["sum", "sum-all", "prod", "cumsum", "cumprod"])
def test_sums_and_products_accumulate_in_their_out_dtype_as_the_cpu(reduce, out_dtype):
    """Without `dtype`, the CPU's kernels take the out= tensor's: 0.5 + 0.5 into int64 is 0, not 1."""
    x = torch.tensor([0.5, 0.5, 0.7])
    on_cpu = reduce(x, torch.empty(0, dtype=out_dtype))
    assert_same(reduce(x.to("neuron"), torch.empty(0, dtype=out_dtype, device="neuron")), on_cpu)


@pytest.mark.parametrize("x, out_dtype", [(torch.tensor([1, -1, 0]), torch.bool), (torch.tensor([0.5, 0.25]), torch.float64),
                                          (torch.tensor([0.5, 0.25]), torch.float16)])
def test_nansum_accumulates_in_its_out_dtype_as_the_cpu(x, out_dtype):
    """1 + (-1) summed in bool is True (it raised: int64 does not cast to bool)."""
    expected = torch.nansum(x, 0, out=torch.empty(0, dtype=out_dtype))
    assert_same(torch.nansum(x.to("neuron"), 0, out=torch.empty(0, dtype=out_dtype, device="neuron")), expected)


@pytest.mark.parametrize("power", [lambda b: b ** True, lambda b: b.pow_(True), lambda b: b.pow_(False),
                                   lambda b: torch.pow(b, False, out=torch.empty(0, dtype=torch.bool, device=b.device))],
                         ids=["pow", "pow_-true", "pow_-false", "pow-out"])
def test_a_bool_tensor_to_a_bool_power_stays_bool_as_on_the_cpu(power):
    """PyTorch's meta kernels made it int64 (and refused the in-place power)."""
    assert_same(power(torch.tensor([True, False], device="neuron")), power(torch.tensor([True, False])))


def test_nansum_of_floats_into_an_integer_out_is_refused_as_by_the_cpu():
    """Its float kernel takes no integer accumulation, though the same dtype given as `dtype` is taken."""
    raises_like_cpu(lambda d: torch.nansum(torch.ones(3, device=d), 0, out=torch.empty(0, dtype=torch.int64, device=d)))
    on_device = torch.empty(0, dtype=torch.int64, device="neuron")
    torch.nansum(torch.full((3,), 0.5, device="neuron"), 0, dtype=torch.int64, out=on_device)
    assert on_device.item() == torch.nansum(torch.full((3,), 0.5), 0, dtype=torch.int64).item()


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bilinear"])
def test_upsampling_an_empty_batch_gives_an_empty_result_as_the_cpu(mode):
    """PyTorch's meta kernels of nearest upsampling fail on it (a torch._check given an int)."""
    upsample = lambda x: F.interpolate(x, size=(4, 4), mode=mode)  # noqa: E731
    assert_same(upsample(torch.ones(0, 3, 2, 2, device="neuron")), upsample(torch.ones(0, 3, 2, 2)))


@pytest.mark.parametrize("eps", [0.2, 0.6])
def test_logit_bounds_its_input_in_the_cpu_kernels_order(eps):
    """Below eps reads eps, else above 1 - eps reads 1 - eps: with eps above 0.5 a clamp would send all to 1 - eps."""
    x = torch.tensor([-2.0, 0.5, 3.0, float("nan"), 0.1, 0.95])
    assert_same(torch.logit(x.to("neuron"), eps=eps), torch.logit(x, eps=eps), equal_nan=True)


def test_index_add_truncates_a_float_alpha_for_integers_as_the_cpu():
    """PyTorch's meta kernel refuses it; the CPU kernel converts it as C++ does."""
    for device in ("cpu", "neuron"):
        x = torch.tensor([1, 2, 3], device=device)
        results = [x.index_add(0, torch.tensor([0, 2], device=device), torch.tensor([5, 7], device=device), alpha=-1.5),
                   x.index_add_(0, torch.tensor([1], device=device), torch.tensor([5], device=device), alpha=2.7)]
        if device == "cpu":
            expected = results
    for result, on_cpu in zip(results, expected):
        assert_same(result, on_cpu)


def test_dtypes_the_cpu_kernel_accepts_still_run():
    ints, mask = torch.arange(6).reshape(2, 3), torch.tensor([[True, False, True], [False, True, True]])
    for op in (lambda i, m: i[m], lambda i, m: i.max(), lambda i, m: (i * 2).sort(descending=True).values,
               lambda i, m: torch.where(m, i, -i), lambda i, m: m & ~m, lambda i, m: i @ i.T,
               lambda i, m: _complex_pair(i.device) * 2j, lambda i, m: _complex_pair(i.device) == 1 + 2j):
        assert_same(op(ints.to("neuron"), mask.to("neuron")), op(ints, mask))


def test_dropout_of_complex_input_is_refused_as_by_cpu_and_cuda_kernels():
    with pytest.raises(NotImplementedError, match="not implemented for 'ComplexFloat'"):
        F.dropout(_complex_pair("cpu"), 0.5)
    with pytest.raises(NotImplementedError, match="not implemented for 'ComplexFloat'"):
        F.dropout(_complex_pair("neuron"), 0.5)


def test_dtypes_cuda_takes_beyond_the_cpu_run_as_on_cuda():
    """Code written for accelerators relies on them: Hugging Face's Mixtral counts experts with an int32
    histc (float32 on the CPU, which refuses integers); complex32 math is CUDA's, in complex64."""
    experts = torch.tensor([0, 3, 1, 3, 3])
    counts = torch.histc(experts.to("neuron", torch.int32), bins=4, min=0, max=4)
    assert_same(counts, torch.histc(experts.float(), bins=4, min=0, max=4).int())
    half = torch.tensor([0.5 + 1j, -2j], dtype=torch.complex32)
    assert_same(half.to("neuron").exp(), half.to(torch.complex64).exp().to(torch.complex32))


def test_uint8_masks_warn_they_are_deprecated_as_on_the_cpu():
    import warnings

    for device in ("cpu", "neuron"):
        x, mask = torch.arange(4.0, device=device), torch.tensor([1, 0, 1, 0], dtype=torch.uint8, device=device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x[mask] = x[mask] * 2
        deprecated = "indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead."
        assert [str(w.message).startswith(deprecated) for w in caught] == [True, True], device
        assert x.tolist() == [0.0, 1.0, 4.0, 3.0]


@pytest.mark.parametrize(
    "bad",
    [
        lambda d: _set(torch.ones(5, 2, dtype=torch.float64, device=d), (slice(None), [1]),
                       torch.zeros(5, 1, dtype=torch.int32, device=d)),
        lambda d: torch.ones(3, device=d).index_put_((_t([1], d),), _t([1.0], d, dtype=torch.float64)),
        lambda d: torch.ones(3, device=d).index_put((_t([1], d),), _t([1], d), accumulate=True),
    ],
    ids=["setitem", "index_put_", "index_put-accumulate"],
)
def test_index_put_of_values_of_another_dtype_raises_as_on_the_cpu(bad):
    raises_like_cpu(bad)


@pytest.mark.parametrize(
    "bad",
    [
        lambda: torch.nonzero(torch.ones(3, device="neuron"), out=torch.empty(0, dtype=torch.long)),
        lambda: torch.masked_select(_x("neuron"), _x("neuron") > 0, out=torch.empty(0)),
    ],
    ids=["nonzero", "masked_select"],
)
def test_a_cpu_out_tensor_for_a_data_dependent_op_raises(bad):
    """As on CUDA: the result is not copied to another device behind the user's back."""
    with pytest.raises(RuntimeError, match="on the same device"):
        bad()


@pytest.mark.parametrize(
    "bad",
    [
        lambda: torch.linalg.lstsq(torch.eye(3, device="neuron"), torch.ones(3, 2)),
        lambda: torch.masked_select(_x("neuron"), torch.tensor([True, False])),
    ],
    ids=["lstsq", "masked_select"],
)
def test_a_data_dependent_op_refuses_a_cpu_tensor_argument(bad):
    """As CUDA's kernels do (lstsq raised numpy's TypeError from its dtype check's message)."""
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but found at least two "
                                           "devices, neuron:0 and cpu!"):
        bad()


def test_a_data_dependent_op_takes_a_cpu_scalar_tensor_as_cuda_does():
    x = torch.tensor([1.0, -2.0, 3.0])
    assert_same(torch.masked_select(x.to("neuron"), torch.tensor(True)), torch.masked_select(x, torch.tensor(True)))


@pytest.mark.parametrize(
    "write",
    [
        lambda cpu_scalar, x: cpu_scalar.add_(x),
        lambda cpu_scalar, x: cpu_scalar.mul_(x),
        lambda cpu_scalar, x: torch.add(x, x, out=cpu_scalar),
        lambda cpu_scalar, x: torch.mul(x, 2, out=cpu_scalar),
    ],
    ids=["add_", "mul_", "add-out", "mul-out"],
)
def test_a_device_op_writing_a_cpu_scalar_raises(write):
    """A 0-dim CPU tensor may be an input of a neuron op, as of a CUDA one, but not what the op writes:
    CUDA raises, and a device copy would take the result and leave the CPU tensor unchanged."""
    cpu_scalar, x = torch.tensor(1.0), torch.full((), 2.0, device="neuron")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but found at least "
                                           "two devices, neuron:0 and cpu!"):
        write(cpu_scalar, x)
    assert cpu_scalar.item() == 1.0
    assert x.add_(cpu_scalar).item() == 3.0  # as an input it is allowed



def test_max_pool1d_refuses_integers_as_the_cpu_and_cuda_do():
    x = torch.arange(12).reshape(1, 2, 6)
    for dtype in (torch.int64, torch.int32, torch.bool):
        with pytest.raises(NotImplementedError) as cpu_error:
            F.max_pool1d(x.to(dtype), 2)
        with pytest.raises(NotImplementedError) as neuron_error:
            F.max_pool1d(x.to(dtype).to("neuron"), 2)
        assert str(neuron_error.value) == str(cpu_error.value)
    # with indices, the CPU takes integers: so does neuron
    values, indices = F.max_pool1d(x.to("neuron"), 2, return_indices=True)
    expected = F.max_pool1d(x, 2, return_indices=True)
    assert_same(values, expected[0])
    assert_same(indices, expected[1])


def test_dropout_backward_promotes_a_bool_grad_by_its_float_scale():
    grad = torch.tensor([True, True, False, True])
    mask = torch.tensor([False, True, True, True])
    expected = torch.ops.aten.native_dropout_backward(grad, mask, 2.0)
    assert expected.dtype == torch.float32 and expected.tolist() == [0.0, 2.0, 0.0, 2.0]
    assert_same(torch.ops.aten.native_dropout_backward(grad.to("neuron"), mask.to("neuron"), 2.0), expected)


def test_addbmm_inplace_resizes_a_bias_of_another_shape_as_the_cpu_does():
    torch.manual_seed(0)
    a, b = torch.randn(3, 2, 4), torch.randn(3, 4, 5)
    for bias in (torch.randn(1), torch.randn(())):
        expected = bias.clone().addbmm_(a, b, beta=0.5)
        on_neuron = bias.to("neuron")
        result = on_neuron.addbmm_(a.to("neuron"), b.to("neuron"), beta=0.5)
        assert result is on_neuron and on_neuron.shape == (2, 5)
        assert_same(on_neuron, expected)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        torch.randn(2, device="neuron").add_(torch.randn(3, 2, device="neuron"))


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_out_updates_the_running_statistics_and_writes_every_out(training):
    def run(device):
        torch.manual_seed(0)
        x, weight, bias, mean, var = (t.to(device) for t in (torch.randn(4, 3, 5), *torch.rand(4, 3)))
        results = []
        for op in (torch.ops.aten.native_batch_norm.out, torch.ops.aten._native_batch_norm_legit.out):
            outs = [torch.empty(0, device=device) for _ in range(3)]
            op(x, weight, bias, mean, var, training, 0.3, 1e-5, out=outs[0], save_mean=outs[1], save_invstd=outs[2])
            results += outs + [mean.clone(), var.clone()]
        return results

    for got, expected in zip(run("neuron"), run("cpu")):
        assert_same(got, expected)


def test_repeat_interleave_of_a_repeats_tensor_checks_and_keeps_its_dtype_as_the_cpu():
    for repeats in (torch.ones(2, 2, dtype=torch.long), torch.tensor(3), torch.ones(2), torch.ones(3, dtype=torch.int16),
                    torch.tensor([2, -1])):
        with pytest.raises(Exception) as cpu_error:
            torch.repeat_interleave(repeats)
        with pytest.raises(type(cpu_error.value), match=re.escape(str(cpu_error.value))):
            torch.repeat_interleave(repeats.to("neuron"))
    for dtype in (torch.int32, torch.int64):
        repeats = torch.tensor([2, 0, 3], dtype=dtype)
        assert_same(torch.repeat_interleave(repeats.to("neuron")), torch.repeat_interleave(repeats))
        assert_same(torch.repeat_interleave(repeats.to("neuron"), output_size=5),
                    torch.repeat_interleave(repeats, output_size=5))


@pytest.mark.parametrize("call", [
    lambda d: torch.segment_reduce(torch.ones(4, dtype=torch.int64, device=d), "sum",
                                   lengths=torch.tensor([1, 3], device=d)),
    lambda d: torch.nn.functional.grid_sample(torch.ones(1, 1, 2, 2, 2, dtype=torch.int64, device=d),
                                              torch.zeros(1, 1, 1, 1, 3, dtype=torch.int64, device=d),
                                              align_corners=False),
], ids=["segment_reduce", "grid_sampler_3d"])
def test_floating_point_kernels_refuse_other_dtypes_as_the_cpu(call):
    """Their CPU kernels' dtype refusals, which the CPU asked on zeros does not reach."""
    with pytest.raises(NotImplementedError) as on_cpu:
        call("cpu")
    with pytest.raises(NotImplementedError) as on_neuron:
        call("neuron")
    assert str(on_neuron.value) == str(on_cpu.value)
