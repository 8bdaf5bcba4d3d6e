"""Running sums, products and extremes along axes longer than the OpInfo samples reach (XLA:CPU runs them as
log-depth scans), and the extremes' indices where NaNs and ties are."""
import pytest
import torch

from conftest import assert_same

NAN = float("nan")


def _order_tolerance(dtype, length):
    """A log-depth scan adds in another order than the CPU's loop: single-precision sums of `length` terms of
    unit scale differ by up to about sqrt(length) of their rounding unit (PyTorch's CUDA cumsum differs so too)."""
    if dtype in (torch.float32, torch.complex64):
        return {"atol": 2e-6 * length**0.5, "rtol": 1e-5}
    return {}


def _randn(*shape, dtype=torch.float32):
    return torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.complex64, torch.int64])
@pytest.mark.parametrize("shape, dim", [((3, 100), 1), ((100, 3), 0), ((2, 33, 4), -2), ((1000,), 0), ((4, 32), 1)])
def test_cumsum_along_long_axes(dtype, shape, dim):
    x = (_randn(*shape, dtype=torch.complex64 if dtype.is_complex else torch.float32) * 4).to(dtype)
    tolerance = _order_tolerance(dtype, 4 * shape[dim])
    assert_same(torch.cumsum(x.to("neuron"), dim), torch.cumsum(x, dim), **tolerance)


def test_cumsum_gradient_along_a_long_axis():
    x = _randn(5, 200).requires_grad_()
    weights = _randn(5, 200) * 2
    (torch.cumsum(x, 1) * weights).sum().backward()
    on_device = x.detach().to("neuron").requires_grad_()
    (torch.cumsum(on_device, 1) * weights.to("neuron")).sum().backward()
    assert_same(on_device.grad, x.grad, **_order_tolerance(torch.float32, 2 * 200))


def test_cumsum_keeps_infinities_and_nans_where_the_cpu_has_them():
    x = torch.ones(2, 70)
    x[0, 40] = float("inf")
    x[1, 10] = float("nan")
    assert_same(torch.cumsum(x.to("neuron"), 1), torch.cumsum(x, 1), equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64, torch.int64])
def test_cumprod_along_a_long_axis(dtype):
    if dtype == torch.int64:
        x = torch.randint(-3, 4, (3, 150))  # overflows and wraps around, as on the CPU
    else:
        x = (1 + _randn(3, 150, dtype=torch.complex64 if dtype.is_complex else torch.float32) / 50).to(dtype)
    assert_same(torch.cumprod(x.to("neuron"), 1), torch.cumprod(x, 1), **_order_tolerance(dtype, 150))


@pytest.mark.parametrize("op", [torch.cummax, torch.cummin])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
def test_running_extremes_take_the_index_of_each_nan_and_the_later_tie(op, dtype):
    x = torch.tensor([[1.0, NAN, 3.0, NAN, 0.5, 0.5], [2.0, 1.0, 2.0, 3.0, 3.0, 1.0]] * 20)
    x = x.nan_to_num(7.0).to(dtype) if not dtype.is_floating_point else x.to(dtype)
    x = torch.cat([x, x.flip(1)] * 10, 1)  # a long axis: 120 positions
    for dim in (0, 1):
        expected, actual = op(x, dim), op(x.to("neuron"), dim)
        torch.testing.assert_close(actual.values.cpu(), expected.values, equal_nan=True)
        assert_same(actual.indices, expected.indices)
