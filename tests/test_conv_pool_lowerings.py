"""Max pooling (strided slices per window offset) and convolutions and their weight gradients (on XLA:CPU
contractions per kernel offset, products of the input's patches, or XLA's own) against the CPU, over the
geometry their index arithmetic handles."""
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


@pytest.mark.parametrize("spatial, channels, kernel, stride, padding, dilation, groups", [
    ((9,), 8, 3, 2, 1, 1, 1),
    ((9, 8), 8, 3, 1, 1, 1, 1),
    ((9, 8), 8, (2, 3), (2, 1), (1, 0), (1, 2), 4),
    ((9, 8, 7), 8, 2, 1, 1, 2, 2),
    # few input channels: on XLA:CPU products of the input's patches
    ((9,), 2, 3, 2, 1, 1, 1),
    ((9, 8), 3, 3, 1, 1, 1, 1),
    ((9, 8), 4, (2, 3), (2, 1), (1, 0), (1, 2), 1),
    ((9, 8, 7), 1, 2, 1, 1, 2, 1),
    # many output positions: on XLA:CPU the weight gradient is the vjp's, as on other platforms
    ((20, 18), 8, 3, 1, 1, 1, 2),
])
def test_convolution_and_its_gradients(spatial, channels, kernel, stride, padding, dilation, groups):
    torch.manual_seed(0)
    dims = len(spatial)
    conv = (F.conv1d, F.conv2d, F.conv3d)[dims - 1]
    x = torch.randn(3, channels, *spatial)
    kernel_size = kernel if isinstance(kernel, tuple) else (kernel,) * dims
    w = torch.randn(8, channels // groups, *kernel_size)
    results = {}
    for device in ("cpu", "neuron"):
        leaves = x.to(device).detach().requires_grad_(), w.to(device).detach().requires_grad_()
        out = conv(*leaves, None, stride, padding, dilation, groups)
        out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device))
        results[device] = [out.detach()] + [leaf.grad for leaf in leaves]
    for got, want in zip(results["neuron"], results["cpu"]):
        assert_same(got, want, rtol=1e-4, atol=1e-4)


CHANNELS_LAST = [  # conv, input shape, weight shape, memory format, which of input/weight is in it
    (F.conv2d, (2, 3, 8, 8), (8, 3, 3, 3), torch.channels_last, "input"),
    (F.conv2d, (2, 3, 8, 8), (8, 3, 3, 3), torch.channels_last, "weight"),
    (F.conv_transpose2d, (2, 3, 8, 8), (3, 4, 3, 3), torch.channels_last, "input"),
    (F.conv3d, (2, 3, 4, 6, 6), (4, 3, 3, 3, 3), torch.channels_last_3d, "input"),
]


@pytest.mark.parametrize("conv, input_shape, weight_shape, memory_format, which", CHANNELS_LAST)
def test_channels_last_convolutions_keep_the_layout_as_the_cpu_and_cuda(conv, input_shape, weight_shape,
                                                                       memory_format, which):
    """A channels-last input or weight gives a channels-last result and gradients, with the CPU's strides:
    code written for channels-last models (`y.permute(0, 2, 3, 1).view(...)`) relies on them. A compiled
    graph's fake convolution agrees."""
    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(input_shape, generator=generator), torch.randn(weight_shape, generator=generator)
    x, w = (t.to(memory_format=memory_format) if which == name else t for t, name in ((x, "input"), (w, "weight")))
    leaves = [t.clone().requires_grad_() for t in (x, w)]
    device_leaves = [t.to("neuron").requires_grad_() for t in (x, w)]
    expected, got = conv(*leaves), conv(*device_leaves)
    assert got.stride() == expected.stride() and got.is_contiguous(memory_format=memory_format)
    assert_same(got, expected.detach(), atol=1e-4, rtol=1e-4)
    expected.sum().backward()
    got.sum().backward()
    for device_leaf, leaf in zip(device_leaves, leaves):
        assert device_leaf.grad.stride() == leaf.grad.stride()
        assert_same(device_leaf.grad, leaf.grad, atol=1e-4, rtol=1e-4)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = conv(mode.from_tensor(device_leaves[0].detach()), mode.from_tensor(device_leaves[1].detach()))
    assert fake.stride() == expected.stride()
