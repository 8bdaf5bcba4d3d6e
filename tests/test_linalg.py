"""Linear algebra in LAPACK's conventions: pivots, info codes, errors raised at synchronisation."""
import pytest
import torch

import torchneuron  # noqa: F401
from conftest import assert_same

TOLERANCE = dict(atol=1e-4, rtol=1e-4)


def _on_both(fn, *inputs):
    return fn(*inputs), fn(*(t.to("neuron") for t in inputs))


def test_lu_factor_pivots_and_info_match_lapack():
    a = torch.randn(2, 4, 4)
    a[1, :, 0] = 0  # singular: getrf reports the first zero pivot
    (lu, pivots, info), (neuron_lu, neuron_pivots, neuron_info) = _on_both(torch.linalg.lu_factor_ex, a)
    assert_same(neuron_lu, lu, **TOLERANCE)
    assert_same(neuron_pivots, pivots)
    assert_same(neuron_info, info)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [True, False])
def test_lu_solve(left, adjoint):
    a, b = torch.randn(3, 4, 4), torch.randn(3, 4, 2)
    b = b if left else b.mT
    lu, pivots = torch.linalg.lu_factor(a)
    cpu, neuron = _on_both(lambda *t: torch.linalg.lu_solve(*t, left=left, adjoint=adjoint), lu, pivots, b)
    assert_same(neuron, cpu, **TOLERANCE)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("determinant", [torch.linalg.det, lambda m: torch.linalg.slogdet(m).logabsdet])
def test_determinant_gradient_reads_lu_as_the_cpu_does(determinant, layout):
    """PyTorch factors contiguous real matrices through their transpose and others directly."""
    a = torch.randn(3, 5, 5) + 4 * torch.eye(5)
    grads = []
    for device in ["cpu", "neuron"]:
        leaf = a.detach().to(device).requires_grad_()
        determinant(leaf if layout == "contiguous" else leaf.mT).sum().backward()
        grads.append(leaf.grad)
    assert_same(grads[1], grads[0], **TOLERANCE)


@pytest.mark.parametrize("driver", ["gels", "gelsy", "gelsd", "gelss"])
def test_lstsq_outputs_per_driver(driver):
    a, b = torch.randn(2, 5, 3), torch.randn(2, 5, 2)
    cpu, neuron = _on_both(lambda *t: torch.linalg.lstsq(*t, driver=driver), a, b)
    for neuron_value, cpu_value in zip(neuron, cpu):
        assert_same(neuron_value, cpu_value, **TOLERANCE)


def test_singular_input_raises_linalg_error_at_synchronisation():
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        torch.linalg.inv(torch.zeros(3, 3, device="neuron")).cpu()
    with pytest.raises(torch.linalg.LinAlgError, match="positive-definite"):
        torch.linalg.cholesky(-torch.eye(3, device="neuron")).cpu()


def test_addr_beta_zero_ignores_nan_input():
    x = torch.tensor([[float("nan")]])
    cpu, neuron = _on_both(lambda *t: torch.addr(*t, beta=0.0, alpha=0.5), x, torch.ones(1), torch.ones(1))
    assert_same(neuron, cpu)
