"""Half-precision results are computed in float32 and rounded once, as PyTorch's CPU kernels compute them:
rounding every partial sum or the product before its bias drifts past the CPU's answer (and float16
squares overflow)."""
import pytest
import torch
import torch.nn.functional as F

from conftest import assert_same
from torchneuron.eager import fallback

HALF = [torch.bfloat16, torch.float16]


def _ulps(dtype):
    """One unit in the last place at magnitude 1, the tolerance for a single rounding's difference."""
    return {"atol": torch.finfo(dtype).eps, "rtol": torch.finfo(dtype).eps}


@pytest.mark.parametrize("dtype", HALF)
def test_cumsum_accumulates_in_float32(dtype):
    x = torch.rand(2000, dtype=dtype)
    assert_same(torch.cumsum(x.to("neuron"), 0), torch.cumsum(x, 0), **_ulps(dtype))


def test_float16_vector_norm_does_not_overflow():
    x = torch.full((10,), 300.0, dtype=torch.float16)  # 300 ** 2 is past float16's 65504
    assert_same(torch.linalg.vector_norm(x.to("neuron")), torch.linalg.vector_norm(x))
    assert_same(torch.dist(x.to("neuron"), -x.to("neuron")), torch.dist(x, -x))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("op", ["addmm", "addbmm", "baddbmm", "addr"])
def test_scaled_matrix_products_round_once(op, dtype):
    torch.manual_seed(0)
    shapes = {"addmm": ((8, 8), (8, 64), (64, 8)), "addbmm": ((8, 8), (16, 8, 64), (16, 64, 8)),
              "baddbmm": ((4, 8, 8), (4, 8, 64), (4, 64, 8)), "addr": ((8, 8), (8,), (8,))}[op]
    x, a, b = (torch.randn(s, dtype=dtype) * 4 for s in shapes)
    fn = getattr(torch, op)
    expected = fn(x.float(), a.float(), b.float(), beta=0.5, alpha=2).to(dtype)
    assert_same(fn(x.to("neuron"), a.to("neuron"), b.to("neuron"), beta=0.5, alpha=2), expected, **_ulps(dtype))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("transposed", [False, True])
def test_convolution_adds_its_bias_before_rounding(dtype, transposed):
    torch.manual_seed(0)
    x = torch.randn(2, 4, 9, 9, dtype=dtype) * 8
    w = torch.randn(4, 4, 3, 3, dtype=dtype)
    bias = torch.randn(4, dtype=dtype) * 100
    conv = F.conv_transpose2d if transposed else F.conv2d
    expected = conv(x.float(), w.float(), bias.float(), stride=2).to(dtype)
    assert_same(conv(x.to("neuron"), w.to("neuron"), bias.to("neuron"), stride=2), expected, **_ulps(dtype))


@pytest.mark.parametrize("dtype", HALF)
def test_bilinear_rounds_once(dtype):
    torch.manual_seed(0)
    x1, x2, w = torch.randn(6, 16, dtype=dtype), torch.randn(6, 16, dtype=dtype), torch.randn(3, 16, 16, dtype=dtype)
    expected = F.bilinear(x1.float(), x2.float(), w.float()).to(dtype)
    assert_same(F.bilinear(x1.to("neuron"), x2.to("neuron"), w.to("neuron")), expected, **_ulps(dtype))


@pytest.mark.parametrize("dtype", HALF)
def test_renorm_in_half_precision(dtype):
    # PyTorch's decomposition computes the norm in float32 and converts the factor with a prim
    x = torch.randn(4, 5, dtype=dtype) * 3
    with fallback.as_error():
        assert_same(torch.renorm(x.to("neuron"), 2, 0, 1.0), torch.renorm(x, 2, 0, 1.0))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("dims", [2, 3])
def test_grid_sample_rounds_once(dtype, dims):
    """Sampled positions, corner weights and their sum in float32, as CUDA's kernel computes them: rounding
    each step in half precision misses that by several units in the last place."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, *(9,) * dims, dtype=dtype) * 8
    grid = torch.rand(2, *(5,) * dims, dims, dtype=dtype) * 2.2 - 1.1
    for padding_mode in ("zeros", "border", "reflection"):
        expected = F.grid_sample(x.float(), grid.float(), padding_mode=padding_mode, align_corners=False).to(dtype)
        actual = F.grid_sample(x.to("neuron"), grid.to("neuron"), padding_mode=padding_mode, align_corners=False)
        assert_same(actual, expected, atol=8 * torch.finfo(dtype).eps, rtol=torch.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", HALF)
def test_nextafter_steps_in_its_own_dtype(dtype):
    """nextafter is the next value of the tensor's dtype: computed in float32 and rounded it was no step at all
    (x itself). One ulp is within assert_close's half-precision tolerance, hence the bits are compared."""
    x = torch.tensor([1.0, 2.0, -3.5, 0.0, float("inf"), 65504.0], dtype=dtype)
    y = torch.tensor([2.0, 1.0, 0.0, 1.0, 0.0, 0.0], dtype=dtype)
    expected = torch.nextafter(x, y)
    got = torch.nextafter(x.to("neuron"), y.to("neuron")).cpu()
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16)), (got, expected)
    assert not torch.equal(got, x)
