"""Max pooling (strided slices per window offset) and convolution weight gradients (contractions per kernel
offset on XLA:CPU) against the CPU, over the geometry their index arithmetic handles."""
import pytest
import torch
import torch.nn.functional as F

from conftest import assert_same

POOLS = [  # kernel, stride, padding, dilation, ceil_mode
    (2, 2, 0, 1, False),
    (3, 1, 1, 1, False),
    (3, 2, 1, 2, True),
    (2, 3, 1, 1, True),
    ((2, 3), (1, 2), (1, 0), (2, 1), False),
]


@pytest.mark.parametrize("geometry", POOLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_max_pool2d_values_indices_and_gradient(geometry, dtype):
    torch.manual_seed(0)
    kernel, stride, padding, dilation, ceil_mode = geometry
    x = torch.randn(2, 3, 9, 8) if dtype.is_floating_point else torch.randint(-2, 2, (2, 3, 9, 8))  # ties
    if dtype.is_floating_point:  # PyTorch keeps the last nan of a window, and the first of tied maxima
        x.view(-1)[::7] = float("nan")
        x.view(-1)[::5] = float("-inf")
    pool = lambda t: F.max_pool2d(t, kernel, stride, padding, dilation, ceil_mode, return_indices=True)  # noqa: E731
    values, indices = pool(x)
    got_values, got_indices = pool(x.to("neuron"))
    assert_same(got_values, values, equal_nan=True)
    assert_same(got_indices, indices)
    if dtype.is_floating_point:
        grad = torch.randn(values.shape)
        leaf, neuron_leaf = x.clone().requires_grad_(), x.to("neuron").requires_grad_()
        pool(leaf)[0].backward(grad)
        pool(neuron_leaf)[0].backward(grad.to("neuron"))
        assert_same(neuron_leaf.grad, leaf.grad)


def test_max_pool3d_unbatched():
    torch.manual_seed(0)
    x = torch.randn(2, 7, 6, 5)
    values, indices = F.max_pool3d(x, 3, 2, 1, return_indices=True)
    got_values, got_indices = F.max_pool3d(x.to("neuron"), 3, 2, 1, return_indices=True)
    assert_same(got_values, values)
    assert_same(got_indices, indices)


@pytest.mark.parametrize("dims, kernel, stride, padding, dilation, groups", [
    (1, 3, 2, 1, 1, 1),
    (2, 3, 1, 1, 1, 1),
    (2, (2, 3), (2, 1), (1, 0), (1, 2), 4),
    (3, 2, 1, 1, 2, 2),
])
def test_convolution_gradients(dims, kernel, stride, padding, dilation, groups):
    torch.manual_seed(0)
    conv = (F.conv1d, F.conv2d, F.conv3d)[dims - 1]
    x = torch.randn(3, 8, *(9, 8, 7)[:dims])
    kernel_size = kernel if isinstance(kernel, tuple) else (kernel,) * dims
    w = torch.randn(8, 8 // groups, *kernel_size)
    grads = {}
    for device in ("cpu", "neuron"):
        leaves = x.to(device).detach().requires_grad_(), w.to(device).detach().requires_grad_()
        out = conv(*leaves, None, stride, padding, dilation, groups)
        out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device))
        grads[device] = [leaf.grad for leaf in leaves]
    for got, want in zip(grads["neuron"], grads["cpu"]):
        assert_same(got, want, rtol=1e-4, atol=1e-4)
