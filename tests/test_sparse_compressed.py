"""Sparse CSR, CSC, BSR and BSC tensors on neuron (eager/sparse_compressed.py), against the CPU's, with the
CPU fallback made an error unless a test says otherwise."""
import io
import warnings

import pytest
import torch

from torchneuron.device import registration
from torchneuron.eager import fallback

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")

DENSE = torch.tensor([[1.0, 0, 2, 0], [0, 0, 0, 0], [3, 4, 0, 5], [0, 6, 0, 0]])
# two batches with as many entries each, and a dense dimension
BATCHED = torch.stack([DENSE, DENSE.flip(0)])
HYBRID = torch.stack([DENSE, -DENSE], -1)
LAYOUTS = {"csr": (torch.Tensor.to_sparse_csr, ()), "csc": (torch.Tensor.to_sparse_csc, ()),
           "bsr": (torch.Tensor.to_sparse_bsr, ((2, 2),)), "bsc": (torch.Tensor.to_sparse_bsc, ((2, 1),))}


@pytest.fixture(autouse=True)
def strict():
    with fallback.as_error():
        yield


def _convert(dense, layout, **kwargs):
    convert, blocksize = LAYOUTS[layout]
    return convert(dense, *blocksize, **kwargs)


def _assert_same(neuron, cpu):
    """The same layout, dtype, shape, indices and values."""
    assert neuron.device.type == "neuron" and neuron.layout == cpu.layout
    torch.testing.assert_close(neuron.cpu(), cpu)  # compares the layouts' indices and values


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dense", [DENSE, BATCHED], ids=["matrix", "batched"])
def test_moved_converted_from_dense_and_back(layout, dense):
    cpu = _convert(dense, layout)
    _assert_same(cpu.to("neuron"), cpu)
    _assert_same(_convert(dense.to("neuron"), layout), cpu)
    torch.testing.assert_close(cpu.to("neuron").to_dense().cpu(), dense)
    assert cpu.to("neuron").to(torch.float64).values().dtype == torch.float64


@pytest.mark.parametrize("layout", ["csr", "csc"])
def test_dense_dimensions(layout):
    cpu = _convert(HYBRID, layout, dense_dim=1)
    _assert_same(_convert(HYBRID.to("neuron"), layout, dense_dim=1), cpu)
    torch.testing.assert_close(cpu.to("neuron").to_dense().cpu(), HYBRID)


@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc])
def test_to_sparse_with_a_layout(layout):
    blocksize = (2, 2) if layout in (torch.sparse_bsr, torch.sparse_bsc) else None
    _assert_same(DENSE.to("neuron").to_sparse(layout=layout, blocksize=blocksize),
                 DENSE.to_sparse(layout=layout, blocksize=blocksize))


@pytest.mark.parametrize("convert", [
    lambda d: d.to_sparse_csr() + 1,  # a number
    lambda d: d.to_sparse_csr().add_(1),
    lambda d: d.to_sparse_bsr((3, 3)),  # blocks that do not tile the matrix
    lambda d: d.to_sparse(layout=torch.sparse_bsr),  # no block size
    lambda d: d[0].to_sparse_csr(),  # one dimension
    lambda d: torch.stack([d, torch.eye(4, device=d.device)]).to_sparse_csr(),  # batches of unequal entries
], ids=["plus a number", "plus a number in place", "blocks", "no blocksize", "vector", "unequal batches"])
def test_bad_input_raises_the_cpus_error(convert):
    with pytest.raises(Exception) as on_cpu:
        convert(DENSE)
    with pytest.raises(on_cpu.type) as on_neuron:
        convert(DENSE.to("neuron"))
    assert str(on_neuron.value) == str(on_cpu.value)


def test_made_from_parts():
    crow, col, values = torch.tensor([0, 1, 1]), torch.tensor([1]), torch.tensor([7.0])
    expected = torch.sparse_csr_tensor(crow, col, values, (2, 2))
    on_device = [t.to("neuron") for t in (crow, col, values)]
    _assert_same(torch.sparse_csr_tensor(*on_device, (2, 2)), expected)
    _assert_same(torch.sparse_csr_tensor(crow, col, values, (2, 2), device="neuron"), expected)
    _assert_same(torch.sparse_csr_tensor([0, 1, 1], [1], [7.0], (2, 2), device="neuron"), expected)
    _assert_same(torch.sparse_csr_tensor(*on_device), torch.sparse_csr_tensor(crow, col, values))  # size inferred
    _assert_same(torch.sparse_compressed_tensor(*on_device, (2, 2), layout=torch.sparse_csc),
                 torch.sparse_compressed_tensor(crow, col, values, (2, 2), layout=torch.sparse_csc))


def test_empty_has_no_entries():
    neuron = torch.empty(2, 3, 4, layout=torch.sparse_csc, device="neuron", dtype=torch.float64)
    assert neuron.layout == torch.sparse_csc and neuron.shape == (2, 3, 4) and neuron.dtype == torch.float64
    assert neuron._nnz() == 0 and neuron.ccol_indices().shape == (2, 5) and neuron.device.type == "neuron"


@pytest.mark.parametrize("make", [
    lambda d: torch.zeros(3, 4, layout=torch.sparse_csr, device=d, dtype=torch.float64),
    lambda d: torch.zeros_like(DENSE.to_sparse_csr().to(d)),
    lambda d: torch.empty_like(DENSE.to_sparse_csr(), device=d).zero_(),
], ids=["zeros", "zeros_like", "empty_like of a host tensor"])
def test_factories(make):
    """The last is made by the CPU's kernel for neuron, below the Python key: it works as any other."""
    neuron, cpu = make("neuron"), make("cpu")
    _assert_same(neuron, cpu)
    torch.testing.assert_close(neuron.to_dense().cpu(), cpu.to_dense())


def test_parts_printing_and_pickling():
    neuron = DENSE.to_sparse_csr().to("neuron")
    assert neuron.is_sparse_csr and neuron._nnz() == 6 and neuron.sparse_dim() == 2 and neuron.dense_dim() == 0
    assert [t.device.type for t in (neuron.crow_indices(), neuron.col_indices(), neuron.values())] == ["neuron"] * 3
    assert repr(neuron).startswith("tensor(crow_indices=tensor([0, 2, 2, 5, 6]),")
    assert "device='neuron:0'" in repr(neuron) and "layout=torch.sparse_csr)" in repr(neuron)
    buffer = io.BytesIO()
    torch.save(neuron, buffer)
    buffer.seek(0)
    _assert_same(torch.load(buffer, weights_only=False), DENSE.to_sparse_csr())
    neuron.values().mul_(2)  # its parts are the tensor's own
    torch.testing.assert_close(neuron.to_dense().cpu(), 2 * DENSE)


def test_clone_copy_and_detach():
    neuron = DENSE.to_sparse_csr().to("neuron")
    clone = neuron.clone()
    clone.values().zero_()
    torch.testing.assert_close(neuron.to_dense().cpu(), DENSE)
    target = (DENSE * 2).to_sparse_csr().to("neuron")
    target.copy_(neuron)
    _assert_same(target, DENSE.to_sparse_csr())
    assert not neuron.requires_grad_().detach().requires_grad


@pytest.mark.parametrize("layout", ["csr", "csc"])
def test_to_coo_and_from_coo(layout):
    """The CPU gives a CSR tensor's entries coalesced and a CSC tensor's in column order, uncoalesced."""
    cpu = _convert(DENSE, layout).to_sparse()
    neuron = _convert(DENSE.to("neuron"), layout).to_sparse()
    assert neuron.is_coalesced() == cpu.is_coalesced()
    torch.testing.assert_close(neuron._indices().cpu(), cpu._indices())
    torch.testing.assert_close(neuron._values().cpu(), cpu._values())
    coo = DENSE.to_sparse()
    _assert_same(_convert(coo.to("neuron"), layout), _convert(coo, layout))


def test_csr_to_csc_and_back():
    _assert_same(DENSE.to_sparse_csr().to("neuron").to_sparse_csc(), DENSE.to_sparse_csr().to_sparse_csc())
    _assert_same(DENSE.to_sparse_csc().to("neuron").to_sparse_csr(), DENSE.to_sparse_csc().to_sparse_csr())


def test_batched_to_coo():
    cpu = BATCHED.to_sparse_csr().to_sparse()
    neuron = BATCHED.to("neuron").to_sparse_csr().to_sparse()
    torch.testing.assert_close(neuron.cpu(), cpu)


@pytest.mark.parametrize("name", ["abs", "neg", "sgn", "sign", "sqrt", "sin", "sinh", "tan", "tanh", "asin",
                                  "asinh", "atan", "atanh", "erf", "erfinv", "expm1", "log1p", "trunc", "floor",
                                  "ceil", "round", "frac", "deg2rad", "rad2deg", "relu"])
def test_elementwise_ops_that_keep_zeros(name):
    cpu = (DENSE / 7).to_sparse_csr()
    op = getattr(torch, name)
    _assert_same(op(cpu.to("neuron")), op(cpu))
    if hasattr(torch.Tensor, name + "_"):
        neuron = cpu.to("neuron")
        getattr(neuron, name + "_")()
        _assert_same(neuron, op(cpu))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_numbers_and_sums(layout):
    cpu = _convert(DENSE, layout)
    neuron = cpu.to("neuron")
    _assert_same(neuron * 2.5, cpu * 2.5)
    _assert_same(neuron * torch.tensor(4.0, device="neuron"), cpu * torch.tensor(4.0))
    torch.testing.assert_close(neuron.sum().cpu(), cpu.sum())
    neuron.mul_(3)
    _assert_same(neuron, cpu * 3)
    neuron.zero_()
    _assert_same(neuron, cpu.clone().zero_())


def test_sums_with_dense_and_sparse_tensors():
    """alpha scales the sparse operand in either order, as on the CPU."""
    a, b = DENSE.to_sparse_csr(), (DENSE.t() - DENSE).to_sparse_csr()
    dense = torch.randn(4, 4)
    for x, y in [(a, b), (dense, a), (a, dense), (dense, a.to_sparse_csc()), (a.to_sparse_csc(), dense)]:
        expected = torch.add(x, y, alpha=3)
        actual = torch.add(x.to("neuron"), y.to("neuron"), alpha=3)
        (_assert_same if expected.layout != torch.strided else _assert_close_dense)(actual, expected)
    accumulated = a.to("neuron")
    accumulated.add_(b.to("neuron"))  # takes the sum's entries
    _assert_same(accumulated, a + b)
    into = dense.to("neuron")
    into.add_(a.to("neuron"), alpha=2)
    torch.testing.assert_close(into.cpu(), dense + 2 * DENSE)


def _assert_close_dense(neuron, cpu):
    assert neuron.layout == torch.strided
    torch.testing.assert_close(neuron.cpu(), cpu)


@pytest.mark.parametrize("layout", ["csr", "csc"])
def test_products_with_dense_matrices(layout):
    cpu = _convert(DENSE, layout)
    neuron = cpu.to("neuron")
    right, left, bias = torch.randn(4, 3), torch.randn(5, 4), torch.randn(4, 3)
    _assert_close_dense(neuron @ right.to("neuron"), cpu @ right)
    _assert_close_dense(torch.mm(left.to("neuron"), neuron), left @ cpu)
    _assert_close_dense(torch.addmm(bias.to("neuron"), neuron, right.to("neuron"), beta=0.5, alpha=2),
                        torch.addmm(bias, cpu, right, beta=0.5, alpha=2))


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
def test_sparse_mm_with_reductions_and_gradients(reduce):
    """torch.sparse.mm(csr, dense, reduce): rows without entries give zeros; gradients of both operands."""
    weights = torch.randn(4, 3)

    def run(device):
        a = DENSE.to_sparse_csr().to(device).requires_grad_()
        b = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)).to(device).requires_grad_()
        out = torch.sparse.mm(a, b, reduce)
        (out * weights.to(device)).sum().backward()
        return out, a.grad, b.grad

    for neuron, cpu in zip(run("neuron"), run("cpu")):
        torch.testing.assert_close(neuron.cpu(), cpu)


def test_sampled_addmm_and_its_gradients():
    weights = torch.randn(4, 4)

    def run(device):
        a = DENSE.to_sparse_csr().to(device).requires_grad_()
        m1 = torch.randn(4, 2, generator=torch.Generator().manual_seed(1)).to(device).requires_grad_()
        m2 = torch.randn(2, 4, generator=torch.Generator().manual_seed(2)).to(device).requires_grad_()
        out = torch.sparse.sampled_addmm(a, m1, m2, beta=0.5, alpha=2)
        torch.autograd.backward(out, weights.to(device))
        return out, a.grad, m1.grad, m2.grad

    for neuron, cpu in zip(run("neuron"), run("cpu")):
        torch.testing.assert_close(neuron.cpu(), cpu)
    a, m1, m2 = DENSE.to_sparse_csr(), torch.randn(4, 2), torch.randn(2, 4)
    out = torch.empty_like(a).to("neuron")
    result = torch.sparse.sampled_addmm(a.to("neuron"), m1.to("neuron"), m2.to("neuron"), out=out)
    assert result is out
    _assert_same(out, torch.sparse.sampled_addmm(a, m1, m2))


def test_sparse_mm_refuses_what_the_cpu_refuses():
    a, b = DENSE.long().to_sparse_csr(), torch.ones(4, 2, dtype=torch.long)
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        torch.sparse.mm(a, b, "sum")
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        torch.sparse.mm(a.to("neuron"), b.to("neuron"), "sum")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_transpose_swaps_row_and_column_compression(layout):
    cpu = _convert(DENSE, layout)
    _assert_same(cpu.to("neuron").t(), cpu.t())


def test_sparse_mask_takes_the_mask_entries():
    source = torch.randn(4, 4)
    for mask in (DENSE.to_sparse_csr(), DENSE.to_sparse_csc()):
        _assert_same(source.to("neuron").sparse_mask(mask.to("neuron")), source.sparse_mask(mask))


def test_an_sgd_step_on_a_sparse_parameter():
    def step(device):
        weight = torch.nn.Parameter(DENSE.to_sparse_csr().to(device))
        features = torch.randn(4, 3, generator=torch.Generator().manual_seed(3)).to(device)
        optimizer = torch.optim.SGD([weight], lr=0.1)
        for _ in range(2):
            torch.sparse.mm(weight, features, "sum").pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        return weight.detach()

    _assert_same(step("neuron"), step("cpu"))


def test_other_ops_run_on_the_cpu_counted(monkeypatch):
    monkeypatch.delenv("TORCHNEURON_FALLBACK")
    neuron = DENSE.to_sparse_csr().to("neuron")
    fallback.reset()
    _assert_same(neuron.to_sparse_bsr((2, 2)), DENSE.to_sparse_csr().to_sparse_bsr((2, 2)))
    assert fallback.counts == {"aten._to_sparse_bsr.default": 1}


def test_compiled_functions_take_them():
    """Dynamo runs the sparse ops eagerly (as for CPU and CUDA sparse tensors) and compiles the rest."""
    a, b = DENSE.to_sparse_csr(), torch.randn(4, 3)

    def f(a, b):
        return torch.sparse.mm(a, b, "amax").relu() * 2 + 1

    compiled = torch.compile(f, backend="neuron")
    torch.testing.assert_close(compiled(a.to("neuron"), b.to("neuron")).cpu(), f(a, b))


def test_kernels_overriding_composites_are_all_registered():
    """Ops with a generic kernel that the CPU's compressed-layout kernel overrides (device/registration.py's list,
    made for torch 2.13) must reach neuron's; a torch release adding one needs it listed."""
    names = {name.removeprefix("aten::") for name in torch._C._dispatch_get_all_op_names()
             if name.startswith("aten::")
             and torch._C._dispatch_has_kernel_for_dispatch_key(name, "SparseCsrCPU")
             and torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeExplicitAutograd")}
    assert names <= set(registration.COMPRESSED_OVERRIDES)


def test_rounding_in_place_refused_where_the_cpu_refuses_it():
    """The CPU rounds a CSR tensor in place, not a CSC one."""
    csc = (DENSE / 7).to_sparse_csc()
    with pytest.raises(RuntimeError) as on_cpu:
        csc.clone().round_()
    with pytest.raises(RuntimeError) as on_neuron:
        csc.to("neuron").round_()
    assert str(on_neuron.value) == str(on_cpu.value)


def test_collectives_refuse_them_clearly():
    """No collective takes a compressed tensor (gloo's and NCCL's neither): refused before any process group work."""
    from torchneuron.distributed import buffers

    with pytest.raises(NotImplementedError, match="sparse_csr tensors none is supported"):
        buffers.check_neuron(DENSE.to_sparse_csr().to("neuron"))
