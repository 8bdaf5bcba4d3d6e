"""Indexing, order statistics and data-dependent ops: edge cases the OpInfo samples leave out."""
import pytest
import torch

from conftest import assert_same, jax_compile_events

NAN = float("nan")


def on_both(fn, *tensors):
    return fn(*tensors), fn(*(t.to("neuron") for t in tensors))


def _result_pairs(actual, expected):
    """(neuron, CPU) for each result of an op that returns one tensor or a tuple of them."""
    return zip(*(r if isinstance(r, tuple) else (r,) for r in (actual, expected)))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, i, s: x.index_add(0, i, s, alpha=-2),
        lambda x, i, s: x.index_copy(0, i, s),
        lambda x, i, s: x.index_fill(0, i, 3.0),
        lambda x, i, s: x.index_select(0, i),
    ],
)
def test_index_ops_on_0dim_self(fn):
    expected, actual = on_both(fn, torch.tensor(1.5), torch.tensor([0]), torch.tensor(4.0))
    assert_same(actual, expected)


def test_unique_nan_each_distinct_with_inverse_and_counts():
    x = torch.tensor([3.0, 1.0, NAN, 1.0, NAN, 2.0])
    expected, actual = on_both(lambda t: torch.unique(t, return_inverse=True, return_counts=True), x)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.cpu(), e, equal_nan=True)


def test_unique_dim_and_consecutive():
    x = torch.tensor([[3, 1], [1, 2], [3, 1], [3, 1]])
    for fn in (lambda t: torch.unique(t, dim=0, return_counts=True), lambda t: torch.unique_consecutive(t, dim=0)):
        expected, actual = on_both(fn, x)
        for a, e in zip(actual, expected):
            assert_same(a, e)


def test_median_mode_nan_and_ties():
    x = torch.tensor([[3.0, NAN, 1.0, NAN, 2.0], [1.0, 2.0, 2.0, 1.0, 5.0], [NAN] * 5])
    for fn in (lambda t: t.median(1), lambda t: t.nanmedian(1), lambda t: t.mode(1)):
        expected, actual = on_both(fn, x)
        torch.testing.assert_close(actual.values.cpu(), expected.values, equal_nan=True)
        assert_same(actual.indices, expected.indices)



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_nans_above_infinity_and_both_zeros_equal(dtype, largest):
    x = torch.tensor([[1.0, NAN, float("inf"), -NAN, 2.0, -0.0, 0.0, -float("inf"), 3.0]], dtype=dtype)
    for k in (2, 4, 9):
        expected, actual = on_both(lambda t: t.topk(k, largest=largest), x)
        torch.testing.assert_close(actual.values.cpu(), expected.values, equal_nan=True)
        torch.testing.assert_close(x.gather(1, actual.indices.cpu()), expected.values, equal_nan=True)


@pytest.mark.parametrize("x", [torch.tensor([-2**31, 5, -3, 2**31 - 1, 0], dtype=torch.int32),
                               torch.tensor([0, 255, 7, 1], dtype=torch.uint8)])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_integers_at_their_limits(x, largest):
    expected, actual = on_both(lambda t: t.topk(2, largest=largest), x)
    assert_same(actual.values, expected.values)
    assert_same(actual.indices, expected.indices)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("fn", [lambda t: t.argmax(1), lambda t: t.argmin(0, keepdim=True), lambda t: t.argmax(),
                                lambda t: t.max(1), lambda t: t.min(0)])
def test_arg_extremes_take_the_first_nan_or_the_first_tie(dtype, fn):
    inf = float("inf")
    x = torch.tensor([[1.0, 3.0, NAN, 3.0, NAN], [2.0, -0.0, 0.0, 2.0, -inf], [inf, inf, 1.0, -inf, -inf],
                      [0.0, -0.0, 0.0, -0.0, 0.0]], dtype=dtype)
    expected, actual = on_both(fn, x)
    for a, e in _result_pairs(actual, expected):
        torch.testing.assert_close(a.cpu(), e, equal_nan=True)


def _ties_nans_and_zeros(dtype):
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(-3, 4, (4, 300), generator=generator).float()
    for value, share in ((NAN, 0.1), (-NAN, 0.05), (float("inf"), 0.05), (-0.0, 0.05)):
        x[torch.rand(x.shape, generator=generator) < share] = value
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int32])
@pytest.mark.parametrize("descending", [False, True])
def test_stable_sort_orders_nans_of_either_sign_ties_and_zeros_as_the_cpu(dtype, descending):
    x = _ties_nans_and_zeros(dtype)
    expected, actual = on_both(lambda t: torch.sort(t, stable=True, dim=1, descending=descending), x)
    torch.testing.assert_close(actual.values.cpu(), expected.values, equal_nan=True)
    assert_same(actual.indices, expected.indices)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
@pytest.mark.parametrize("fn, dim", [(lambda t: t.kthvalue(7, 1, keepdim=True), 1), (lambda t: t.kthvalue(300, 1, True), 1),
                                     (lambda t: t.median(1, True), 1), (lambda t: t.nanmedian(1, True), 1),
                                     (lambda t: t.kthvalue(2, 0, keepdim=True), 0)])
def test_order_statistics_pick_as_the_cpu_among_ties_and_nans(dtype, fn, dim):
    """The CPU's kthvalue takes any of tied values' indices (quickselect): the index must hold the value."""
    x = _ties_nans_and_zeros(dtype)
    expected, actual = on_both(fn, x)
    torch.testing.assert_close(actual.values.cpu(), expected.values, equal_nan=True)
    torch.testing.assert_close(x.gather(dim, actual.indices.cpu()), expected.values, equal_nan=True)


@pytest.mark.parametrize("fn", [
    lambda x: x.nonzero(), lambda x: torch.nonzero_static(x, size=5000, fill_value=-7), lambda x: x[x > 0.5],
    lambda x: torch.zeros_like(x).masked_scatter(x > 0, x.flip(0)), lambda x: torch.unique(x.round(decimals=1), return_inverse=True)])
def test_running_count_ops_on_many_elements(fn):
    x = torch.randn(60, 50, 40, generator=torch.Generator().manual_seed(0))
    expected, actual = on_both(fn, x)
    for a, e in _result_pairs(actual, expected):
        assert_same(a, e)

def test_segment_reduce_empty_segments_and_initial():
    data, lengths = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([2, 0, 2])
    for reduce in ("max", "min", "sum", "mean", "prod"):
        for initial in (None, 7.0):
            fn = lambda d, n: torch.segment_reduce(d, reduce, lengths=n, initial=initial)  # noqa: E731
            expected, actual = on_both(fn, data, lengths)
            torch.testing.assert_close(actual.cpu(), expected, equal_nan=True)


def test_masked_scatter_grad_reaches_source():
    x, mask = torch.zeros(2, 3), torch.tensor([[True, False, True], [False, True, False]])
    grads = []
    for device in ("cpu", "neuron"):
        source = torch.arange(6.0, device=device).requires_grad_()
        out = x.to(device).masked_scatter(mask.to(device), source)
        (out * torch.arange(6.0, device=device).reshape(2, 3)).sum().backward()
        grads.append(source.grad)
    assert_same(grads[1], grads[0].cpu())


def test_histogram_with_weights_and_density():
    x, w = torch.tensor([0.0, 1.0, 1.0, 2.5, 4.0, NAN]), torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    fn = lambda t, v: torch.histogram(t, 4, range=(0.0, 4.0), weight=v, density=True)  # noqa: E731
    expected, actual = on_both(fn, x, w)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.cpu(), e)


def test_accumulating_boolean_index_put_is_a_logical_or():
    x = torch.tensor([False, True, False, False])
    index, values = torch.tensor([0, 0, 1, 2]), torch.tensor([True, True, False, False])
    expected, got = on_both(lambda x, i, v: x.index_put((i,), v, accumulate=True), x, index, values)
    assert_same(got, expected)


def test_normal_and_linspace_out_forms_run_on_neuron():
    from torchneuron.eager import fallback

    with fallback.as_error():
        drawn = torch.empty(20_000, device="neuron")
        torch.normal(2.0, 3.0, (20_000,), out=drawn)
        assert abs(drawn.mean().item() - 2) < 0.1 and abs(drawn.std().item() - 3) < 0.1
        spaced = torch.empty(5, device="neuron")
        torch.linspace(torch.tensor(1.0, device="neuron"), torch.tensor(3.0, device="neuron"), 5, out=spaced)
    assert_same(spaced, torch.linspace(1.0, 3.0, 5))


# name -> (op of a tensor of 4096 elements and a mask, the mask's length)
_DATA_DEPENDENT = {
    "nonzero": (lambda x, mask: mask.nonzero(), 4096),
    "masked_select": (torch.masked_select, 4096),
    "boolean index": (lambda x, mask: x[mask], 4096),
    "boolean index of rows": (lambda x, mask: x.reshape(1024, 4)[mask], 1024),
    "boolean index_put": (lambda x, mask: x.clone().index_put_((mask,), torch.tensor(0.0, device=x.device)), 4096),
    "boolean index_put of rows": (lambda x, mask: x.reshape(1024, 4).clone().index_put_(
        (mask,), torch.arange(4.0, device=x.device), accumulate=True), 1024),
    "repeat_interleave": (lambda x, mask: torch.repeat_interleave(mask.long()), 4096),
    "bincount": (lambda x, mask: torch.bincount(mask.long().cumsum(0)), 4096),
    "unique": (lambda x, mask: torch.unique(torch.where(mask, torch.arange(4096, device=x.device), 0),
                                            return_inverse=True, return_counts=True), 4096),
}


@pytest.mark.parametrize("fn, length", _DATA_DEPENDENT.values(), ids=_DATA_DEPENDENT.keys())
def test_data_dependent_results_compile_per_input_shape_not_per_length(fn, length):
    """Their lengths change with the data at every call: XLA compiles nothing for a new length (results are
    computed at the input's size and cut to a power of two of rows, here half the mask's length)."""
    torch.manual_seed(0)
    x = torch.randn(4096)
    masks = [torch.randperm(length) < int(length * share) for share in (0.27, 0.37, 0.44, 0.4998)]
    expected = [fn(x, mask) for mask in masks]
    on_neuron = x.to("neuron")
    # compiles (and cuts to half); four times, the runs adaptive eager takes to settle on one fused program
    # for the ops around it (compiled ahead at the structure's second sighting, run from its third)
    results = [fn(on_neuron, masks[0].to("neuron")) for _ in range(4)][3:]
    with jax_compile_events() as compiles:
        results += [fn(on_neuron, mask.to("neuron")) for mask in masks[1:]]
    assert compiles == []
    for got, want in zip(results, expected):
        for got_tensor, wanted_tensor in _result_pairs(got, want):
            assert_same(got_tensor, wanted_tensor)
