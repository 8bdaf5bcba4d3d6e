"""Linear algebra in LAPACK's conventions: pivots, info codes, errors raised at synchronisation; the precision
of float32 products."""
import re

import jax
import pytest
import torch

import torchneuron  # noqa: F401
from conftest import assert_same
from torchneuron.eager import fallback
from torchneuron.runtime.cache import eager_cache

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


LSTSQ_SHAPES = [  # input, other: as the CPU reads them
    ((5, 3), (5, 2)), ((3, 5), (3, 2)), ((5, 3), (5,)), ((2, 5, 3), (2, 5)),
    ((1, 5, 3), (2, 5, 2)),  # input's batch broadcast; its rank and singular values keep input's own
    ((1, 5, 3), (5, 2)),  # a matrix of one dimension less: solved once per row (PyTorch's quirk)
]


@pytest.mark.parametrize("driver", ["gelsy", "gelsd"])
@pytest.mark.parametrize("shapes", LSTSQ_SHAPES)
def test_lstsq_broadcasts_and_lays_out_as_the_cpu(shapes, driver):
    """The solution is LAPACK's: the first n rows of column-major max(m, n)-row matrices, as on the CPU and
    CUDA (it was row-major); `other` is a vector, batched, or broadcast by PyTorch's rules (a matrix of one
    dimension less raised a size mismatch)."""
    a, b = (torch.randn(*shape, dtype=torch.float64) for shape in shapes)
    cpu, neuron = _on_both(lambda *t: torch.linalg.lstsq(*t, driver=driver), a, b)
    for neuron_value, cpu_value in zip(neuron, cpu):
        assert_same(neuron_value, cpu_value)
    layout = lambda t: (t.stride(), t.storage_offset(), t.untyped_storage().nbytes())  # noqa: E731
    assert layout(neuron.solution) == layout(cpu.solution)


@pytest.mark.parametrize("shapes", [((2, 5, 3), (5, 5)), ((2, 5, 3), (1, 5)), ((2, 5, 3), (3, 5, 2))])
def test_lstsq_refuses_as_the_cpu(shapes):
    """Batches that do not broadcast raise the CPU's RuntimeError (a JAX ValueError escaped)."""
    a, b = (torch.randn(*shape) for shape in shapes)
    with pytest.raises(RuntimeError) as on_cpu:
        torch.linalg.lstsq(a, b)
    with pytest.raises(RuntimeError, match=re.escape(str(on_cpu.value))):
        torch.linalg.lstsq(a.to("neuron"), b.to("neuron"))


def test_singular_input_raises_linalg_error_at_synchronisation():
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        torch.linalg.inv(torch.zeros(3, 3, device="neuron")).cpu()
    with pytest.raises(torch.linalg.LinAlgError, match="positive-definite"):
        torch.linalg.cholesky(-torch.eye(3, device="neuron")).cpu()


def _singular_batch(d):
    a = torch.eye(3).repeat(3, 1, 1)
    a[2, 1, 1] = 0
    return a.to(d)


def _indefinite_batch(d):
    a = torch.eye(3).repeat(2, 3, 1, 1)
    a[1, 0, 2, 2] = -1
    return a.to(d)


@pytest.mark.parametrize("call", [
    lambda d: torch.linalg.inv(_singular_batch(d)),
    lambda d: torch.linalg.inv(_singular_batch(d)[2]),
    lambda d: torch.linalg.solve(_singular_batch(d), torch.ones(3, 3, 1, device=d)),
    lambda d: torch.linalg.lu_factor(_singular_batch(d)),
    lambda d: torch.linalg.cholesky(_indefinite_batch(d)),
    lambda d: torch.linalg.cholesky_ex(_indefinite_batch(d)[1, 0], check_errors=True),
], ids=["inv", "inv-matrix", "solve", "lu_factor", "cholesky", "cholesky_ex-matrix"])
def test_linalg_errors_name_the_batch_element_and_lapacks_code_as_the_cpu(call):
    with pytest.raises(Exception) as on_cpu:
        call("cpu")
    with pytest.raises(type(on_cpu.value)) as on_neuron:
        call("neuron")
        torch.neuron.synchronize()
    assert str(on_cpu.value) in str(on_neuron.value)


@pytest.mark.parametrize("api", ["linalg.inv", "torch.linalg.solve", "linalg.cholesky", "linalg.svd", "linalg.eigh",
                                 "torch.linalg.syevd", "torch.linalg.lstsq", "torch.linalg.lu_factor"])
@pytest.mark.parametrize("info", [[3], [0, 0, 5]], ids=["matrix", "batch"])
def test_linalg_check_errors_words_every_code_as_the_cpu(api, info):
    is_matrix = len(info) == 1
    with pytest.raises(Exception) as on_cpu:
        torch._linalg_check_errors(torch.tensor(info, dtype=torch.int32).reshape(-1 if not is_matrix else ()), api,
                                   is_matrix=is_matrix)
    with pytest.raises(type(on_cpu.value)) as on_neuron:
        torch._linalg_check_errors(torch.tensor(info, dtype=torch.int32, device="neuron").reshape(
            -1 if not is_matrix else ()), api, is_matrix=is_matrix)
        torch.neuron.synchronize()
    assert str(on_cpu.value) in str(on_neuron.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_ex_of_a_matrix_that_is_not_positive_definite_gives_lapacks_info_and_factor(upper, dtype):
    """XLA fills a failed factor with NaNs; LAPACK stops at the first pivot that is not positive, which info
    names (a zero pivot too), leaving the columns before it factored and the rest as they were."""
    indefinite = torch.tensor([[4.0, 2, 2], [2, -1, 1], [2, 1, 5]])
    a = torch.stack([indefinite, torch.eye(3) * 2, indefinite.flip(0, 1), torch.ones(3, 3)]).to(dtype)
    on_cpu, on_neuron = _on_both(lambda m: torch.linalg.cholesky_ex(m, upper=upper), a)
    assert on_neuron.info.tolist() == on_cpu.info.tolist() == [2, 0, 2, 2]
    torch.testing.assert_close(on_neuron.L.cpu(), on_cpu.L)


@pytest.mark.parametrize("call", [
    lambda z: torch.linalg.inv_ex(z, check_errors=True),
    lambda z: torch.linalg.solve_ex(z, torch.ones(3, device=z.device), check_errors=True),
    lambda z: torch.linalg.lu_factor_ex(z, check_errors=True),
    lambda z: torch.linalg.cholesky_ex(z - torch.eye(3, device=z.device), check_errors=True),
])
def test_ex_functions_honour_check_errors(call):
    """The *_ex functions return info, but check_errors=True raises what the CPU raises."""
    with pytest.raises(Exception) as cpu_error:
        call(torch.zeros(3, 3))
    with pytest.raises(type(cpu_error.value)):
        call(torch.zeros(3, 3, device="neuron"))
        torch.neuron.synchronize()


def _symmetric(n, *batch, dtype=torch.float32, hermitian=False):
    a = torch.randn(*batch, n, n, dtype=dtype)
    return a + (a.mH if hermitian else a.mT)


def _swap_blocks(n):
    """[[0, 1], [1, 0]] blocks, shuffled and nudged: zero diagonals that Bunch-Kaufman pivots in pairs."""
    order = torch.randperm(n)
    blocks = torch.block_diag(*[torch.tensor([[0.0, 1.0], [1.0, 0.0]])] * (n // 2))
    return blocks[order][:, order] + 0.01 * torch.ones(n, n)


_LDL_INPUTS = {
    "2x2 pivots": lambda: (_swap_blocks(6), False),
    "indefinite batch": lambda: (_symmetric(5, 3), False),
    "complex symmetric": lambda: (_symmetric(5, 2, dtype=torch.complex64), False),
    "hermitian": lambda: (_symmetric(5, 2, dtype=torch.complex64, hermitian=True), True),
    # LAPACK reads the lower triangle only, and only the real part of a Hermitian diagonal
    "upper ignored": lambda: (torch.randn(4, 4, dtype=torch.complex64), True),
    "singular": lambda: (torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [3.0, 6.0, 9.0]]), False),
    "zero column": lambda: (torch.diag(torch.tensor([2.0, 0.0, -1.0])), False),
}


@pytest.mark.parametrize("case", list(_LDL_INPUTS))
def test_ldl_factor_matches_lapack(case):
    torch.manual_seed(0)
    a, hermitian = _LDL_INPUTS[case]()
    with fallback.as_error():
        cpu, neuron = _on_both(lambda t: torch.linalg.ldl_factor_ex(t, hermitian=hermitian), a)
    assert_same(neuron.LD, cpu.LD, **TOLERANCE)
    assert_same(neuron.pivots, cpu.pivots)
    assert_same(neuron.info, cpu.info)
    if case == "2x2 pivots":
        assert (cpu.pivots < 0).any()


@pytest.mark.parametrize("case", ["2x2 pivots", "indefinite batch", "complex symmetric", "hermitian"])
def test_ldl_solve(case):
    torch.manual_seed(0)
    a, hermitian = _LDL_INPUTS[case]()
    ld, pivots = torch.linalg.ldl_factor(a, hermitian=hermitian)
    b = torch.randn(*a.shape[:-1], 2, dtype=a.dtype)
    with fallback.as_error():
        cpu, neuron = _on_both(lambda *t: torch.linalg.ldl_solve(*t, hermitian=hermitian), ld, pivots, b)
    assert_same(neuron, cpu, **TOLERANCE)


def test_ldl_factor_of_singular_input_raises_as_the_cpu():
    """PyTorch has no message for sytrf's info: an internal assert, a RuntimeError, not a LinAlgError."""
    singular = torch.zeros(3, 3, device="neuron")
    with fallback.as_error(), pytest.raises(RuntimeError, match="Unknown error code") as raised:
        torch.linalg.ldl_factor(singular)[0].cpu()
    assert not isinstance(raised.value, torch.linalg.LinAlgError)


def test_addr_beta_zero_ignores_nan_input():
    x = torch.tensor([[float("nan")]])
    cpu, neuron = _on_both(lambda *t: torch.addr(*t, beta=0.0, alpha=0.5), x, torch.ones(1), torch.ones(1))
    assert_same(neuron, cpu)


@pytest.mark.parametrize("tolerances", [{}, {"atol": 0.5, "rtol": 0.1}, {"hermitian": True}])
def test_matrix_rank_writes_its_out(tolerances):
    """PyTorch's composite out= kernel rebinds its result when its ops run through Python: out stayed 0."""
    torch.manual_seed(0)
    a = torch.randn(5, 5) * 4
    a = a + a.mT
    a[4] = a[3] = 0
    a[:, 4] = a[:, 3] = 0
    results = []
    for device in ("cpu", "neuron"):
        out = torch.empty((), dtype=torch.int64, device=device)
        assert torch.linalg.matrix_rank(a.to(device), out=out, **tolerances) is out
        results.append(out)
    assert results[1].item() == results[0].item() and results[0].item() > 0


@pytest.fixture
def set_matmul_precision():
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


def _product_precisions(op, setting) -> set:
    """The precisions of the products in the eager programs of `op` made under `setting`."""
    texts = [jax.jit(entry.program.function).lower(*entry.program.storage_avals).as_text()
             for key, entry in eager_cache.entries.items() if key[0] is op and key[-1] == setting]
    assert texts
    return {p for text in texts for p in re.findall(r"precision[ =\[]+(\w+)", text)}


@pytest.mark.parametrize("setting, precision", [("highest", "HIGHEST"), ("high", "HIGH"), ("medium", "DEFAULT")])
def test_float32_products_follow_pytorchs_matmul_precision(set_matmul_precision, setting, precision):
    # PyTorch's default, "highest", keeps float32 products in float32 on any device, where JAX's default lets
    # XLA:GPU round their operands to TF32; "high" allows TF32 as on CUDA
    set_matmul_precision(setting)
    a = torch.randn(8, 8, device="neuron")
    (a @ a).cpu()
    torch.nn.functional.conv2d(a[None, None], a[None, None, :3, :3]).cpu()
    assert _product_precisions(torch.ops.aten.mm.default, setting) == {precision}
    assert _product_precisions(torch.ops.aten.convolution.default, setting) == {precision}


def test_int8_products_sum_exactly_in_int32():
    """torch._int_mm (torchao's int8 dynamic quantization) on the device, with the CPU's errors."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (32, 64), dtype=torch.int8, generator=generator)
    b = torch.randint(-128, 128, (64, 24), dtype=torch.int8, generator=generator)
    with fallback.as_error():
        assert_same(torch._int_mm(a.to("neuron"), b.to("neuron")), torch._int_mm(a, b))
        with pytest.raises(RuntimeError, match="int_mm_out_cpu: Expected mat2 dtype to be of type int8"):
            torch._int_mm(a.to("neuron"), b.float().to("neuron"))
