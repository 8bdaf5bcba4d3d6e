"""Sparse COO tensors on neuron (eager/sparse.py): each op against the CPU's sparse tensors, on the device."""
import io

import pytest
import torch

from torchneuron.eager import fallback

INDICES = torch.tensor([[0, 1, 1, 0], [2, 0, 2, 2]])  # (0, 2) twice: uncoalesced
VALUES = torch.tensor([3.0, 4.0, 5.0, 1.0])


def _pair(coalesced=False):
    cpu = torch.sparse_coo_tensor(INDICES, VALUES, (2, 3), check_invariants=False)
    cpu = cpu.coalesce() if coalesced else cpu
    return cpu.to("neuron"), cpu


def _assert_same(neuron, cpu):
    """Same values, layout, dtype and coalesced flag; for a sparse pair, the same indices once coalesced."""
    assert neuron.device.type == "neuron" and neuron.layout == cpu.layout and neuron.dtype == cpu.dtype
    host = neuron.cpu()
    if cpu.is_sparse:
        assert host.is_coalesced() == cpu.is_coalesced()
        host, cpu = host.coalesce(), cpu.coalesce()
        torch.testing.assert_close(host.indices(), cpu.indices())
        host, cpu = host.values(), cpu.values()
    torch.testing.assert_close(host, cpu)


def test_made_from_neuron_indices_and_values_or_moved_from_the_cpu():
    neuron = torch.sparse_coo_tensor(INDICES.to("neuron"), VALUES.to("neuron"), (2, 3))
    assert neuron.is_sparse and neuron.device == torch.device("neuron", 0) and neuron._nnz() == 4
    assert neuron.sparse_dim() == 2 and neuron.dense_dim() == 0 and not neuron.is_coalesced()
    assert neuron._values().device.type == "neuron" and neuron._indices().device.type == "neuron"
    _assert_same(neuron, torch.sparse_coo_tensor(INDICES, VALUES, (2, 3)))
    moved, cpu = _pair()
    _assert_same(moved, cpu)
    assert repr(moved).startswith("tensor(indices=tensor([[0, 1, 1, 0],\n                       [2, 0, 2, 2]]),")
    assert "device='neuron:0', size=(2, 3), nnz=4, layout=torch.sparse_coo)" in repr(moved)


@pytest.mark.parametrize("make", [
    lambda d: torch.zeros(2, 3, layout=torch.sparse_coo, device=d),
    lambda d: torch.empty(2, 3, layout=torch.sparse_coo, device=d, dtype=torch.float64),
    lambda d: torch.sparse_coo_tensor(size=(2, 3, 4), device=d),
    lambda d: torch.sparse_coo_tensor(torch.tensor([[1], [2]]), torch.tensor([7.0]), (2, 3), device=d),
    lambda d: torch.sparse_coo_tensor(torch.tensor([[1], [2]]), torch.tensor([7.0]), (2, 3)).to(d).new(),
], ids=["zeros", "empty", "size only", "host indices and values", "new()"])
def test_factories_make_sparse_tensors_on_the_device(make):
    _assert_same(make("neuron"), make("cpu"))


def test_resizing_to_another_shape_is_refused_clearly():
    neuron, _ = _pair()
    with pytest.raises(NotImplementedError, match="keeps its shape"):
        neuron.sparse_resize_((4, 4), 2, 0)


DENSE = torch.arange(6.0).view(2, 3) - 2
RIGHT = torch.linspace(-1, 1, 12).view(3, 4)
LEFT = torch.linspace(-1, 1, 10).view(5, 2)

OPS = {
    "coalesce": lambda s, d: s.coalesce(),
    "to_dense": lambda s, d: s.to_dense(),
    "sparse + sparse": lambda s, d: s + s * 2,
    "dense + sparse": lambda s, d: d(DENSE) + s,
    "dense - sparse": lambda s, d: d(DENSE) - s,
    "dense.add_(sparse, alpha)": lambda s, d: d(DENSE).add_(s, alpha=-0.5),
    "sparse.add_(sparse)": lambda s, d: s.clone().add_(s),
    "sparse * number": lambda s, d: s * 2.5,
    "sparse / number": lambda s, d: s / 4,
    "-sparse": lambda s, d: -s,
    "sparse.mul_": lambda s, d: s.clone().mul_(3),
    "sparse @ dense": lambda s, d: s @ d(RIGHT),
    "dense @ sparse": lambda s, d: d(LEFT) @ s,
    "torch.sparse.mm": lambda s, d: torch.sparse.mm(s, d(RIGHT)),
    "addmm": lambda s, d: torch.addmm(d(torch.ones(2, 4)), s, d(RIGHT), beta=0.5, alpha=2),
    "t": lambda s, d: s.t(),
    "abs": lambda s, d: (s * -1).abs(),
    "sqrt": lambda s, d: s.sqrt(),
    "sgn": lambda s, d: (s - s * 3).sgn(),
    "pow": lambda s, d: s.pow(3),
    "sum": lambda s, d: s.sum(),
    "torch.sparse.sum": lambda s, d: torch.sparse.sum(s),
    "double": lambda s, d: s.double(),
    "zeros_like": lambda s, d: torch.zeros_like(s),
    "sparse_mask": lambda s, d: d(DENSE).sparse_mask(s),
    "sparse.sparse_mask(sparse)": lambda s, d: (s * 2).sparse_mask(d(DENSE).to_sparse()),
    "sparse.sparse_mask(empty)": lambda s, d: torch.zeros_like(s).sparse_mask(s),
    "to_sparse": lambda s, d: d(DENSE).to_sparse(),
    "to_sparse(sparse_dim=1)": lambda s, d: d(DENSE).to_sparse(1),
    "zero_": lambda s, d: s.clone().zero_(),
    "torch.sparse.sum(dim=0)": lambda s, d: torch.sparse.sum(s, 0),
    "torch.sparse.sum(dim=(0, 1))": lambda s, d: torch.sparse.sum(s, (0, -1)),
    "index_select(0)": lambda s, d: s.index_select(0, d(torch.tensor([1, 1, 0]))),
    "index_select(1)": lambda s, d: s.index_select(1, d(torch.tensor([2, -3, 2]))),
    "index_select(none)": lambda s, d: s.index_select(1, d(torch.tensor([], dtype=torch.int64))),
    "index_select(1, from the start)": lambda s, d: s.index_select(1, d(torch.tensor([2, 0, 2]))),
}


@pytest.mark.parametrize("coalesced", [False, True], ids=["uncoalesced", "coalesced"])
@pytest.mark.parametrize("name", OPS)
def test_op_runs_on_the_device_as_on_the_cpu(name, coalesced):
    neuron, cpu = _pair(coalesced)
    with fallback.as_error():
        result = OPS[name](neuron, lambda t: t.to("neuron"))
    _assert_same(result, OPS[name](cpu, lambda t: t))


HYBRID_OPS = ["coalesce", "to_dense", "sparse + sparse", "dense + sparse", "dense.add_(sparse, alpha)", "sparse * number",
              "-sparse", "abs", "pow", "sum", "double", "zeros_like", "sparse_mask", "zero_", "torch.sparse.sum(dim=0)",
              "torch.sparse.sum(dim=(0, 1))", "index_select(0)", "index_select(1, from the start)"]


@pytest.mark.parametrize("name", HYBRID_OPS)
def test_op_of_a_hybrid_tensor_runs_on_the_device_as_on_the_cpu(name):
    """One sparse dimension and one dense: each entry a row of values."""
    cpu = torch.sparse_coo_tensor(torch.tensor([[1, 0, 1]]), torch.arange(9.0).view(3, 3) - 4, (2, 3))
    with fallback.as_error():
        result = OPS[name](cpu.to("neuron"), lambda t: t.to("neuron"))
    _assert_same(result, OPS[name](cpu, lambda t: t))


WITHOUT_SPARSE_DIMENSIONS = {
    "coalesce": lambda s, d: s.coalesce(),
    "to_dense": lambda s, d: s.to_dense(),
    "dense + sparse": lambda s, d: d(torch.ones(2)) + s,
    "sparse + sparse": lambda s, d: s + s,
    "sum": lambda s, d: s.sum(),
}


@pytest.mark.parametrize("name", WITHOUT_SPARSE_DIMENSIONS)
def test_a_tensor_without_sparse_dimensions(name):
    """sparse_dim 0: every entry is at the one position, its values rows of the dense part."""
    cpu = torch.sparse_coo_tensor(torch.empty(0, 3, dtype=torch.long), torch.arange(6.0).view(3, 2), (2,))
    with fallback.as_error():
        result = WITHOUT_SPARSE_DIMENSIONS[name](cpu.to("neuron"), lambda t: t.to("neuron"))
    _assert_same(result, WITHOUT_SPARSE_DIMENSIONS[name](cpu, lambda t: t))


@pytest.mark.parametrize("call", [
    lambda s, d: s + d(DENSE),  # add(sparse, dense): the CPU's own refusal
    lambda s, d: s.indices(),  # of an uncoalesced tensor
    lambda s, d: s.index_select(0, d(torch.tensor([0, 2]))),  # out of range
    lambda s, d: s.to_dense().to_sparse(1).index_select(1, d(torch.tensor([-1]))),  # from the end, dense dim
    lambda s, d: torch.sparse_coo_tensor(s._indices(), d(torch.ones(3)), (2, 3)),  # 3 values, 4 indices
    lambda s, d: s.to_dense().to_sparse(3),  # more sparse dimensions than it has
], ids=["sparse + dense", "indices of uncoalesced", "index_select out of range",
    "index_select of a dense dimension from the end", "values and indices disagree", "to_sparse(3) of a matrix"])
def test_bad_input_raises_the_cpus_error(call):
    """The CPU's error, with fallback made an error too: bad input is not a fallback."""
    neuron, cpu = _pair()
    with pytest.raises((RuntimeError, IndexError)) as on_cpu:
        call(cpu, lambda t: t)
    fallback.reset()
    with fallback.as_error(), pytest.raises(on_cpu.type) as on_neuron:
        call(neuron, lambda t: t.to("neuron"))
    assert str(on_neuron.value) == str(on_cpu.value) and not fallback.counts


def test_an_op_without_a_sparse_form_runs_on_the_cpu_visibly():
    neuron, cpu = _pair()
    fallback.reset()
    result = neuron.narrow_copy(1, 0, 2)
    assert fallback.counts["aten.narrow_copy.default"] == 1
    _assert_same(result, cpu.narrow_copy(1, 0, 2))


def _train_embedding(device, make_optimizer, bag):
    torch.manual_seed(0)
    embedding = (torch.nn.EmbeddingBag(10, 4, mode="mean", sparse=True) if bag
                 else torch.nn.Embedding(10, 4, sparse=True)).to(device)
    head = torch.nn.Linear(4, 1).to(device)
    optimizer, head_optimizer = make_optimizer(embedding.parameters()), torch.optim.SGD(head.parameters(), lr=0.1)
    batches = torch.randint(0, 10, (3, 6), generator=torch.Generator().manual_seed(1))
    for batch in batches.to(device):
        rows = embedding(batch, torch.tensor([0, 2], device=device)) if bag else embedding(batch)
        head(rows).pow(2).mean().backward()
        assert embedding.weight.grad.is_sparse and embedding.weight.grad.device.type == device
        optimizer.step()
        head_optimizer.step()
        optimizer.zero_grad()
        head_optimizer.zero_grad()
    return embedding.weight.detach().cpu()


@pytest.mark.parametrize("bag", [False, True], ids=["Embedding", "EmbeddingBag"])
@pytest.mark.parametrize("make_optimizer", [
    lambda p: torch.optim.SGD(p, lr=0.5),
    lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9),
    lambda p: torch.optim.Adagrad(p, lr=0.5),
    lambda p: torch.optim.SparseAdam(p, lr=0.1),
], ids=["SGD", "SGD-momentum", "Adagrad", "SparseAdam"])
def test_sparse_embedding_gradients_train_as_on_the_cpu(make_optimizer, bag):
    """nn.Embedding/EmbeddingBag(sparse=True): sparse weight gradients, stepped by the optimizers that take them,
    all on the device."""
    with fallback.as_error():
        trained = _train_embedding("neuron", make_optimizer, bag)
    torch.testing.assert_close(trained, _train_embedding("cpu", make_optimizer, bag), rtol=1e-4, atol=1e-5)


def test_sparse_gradients_accumulate_over_two_backwards():
    gradients = []
    for device in ("neuron", "cpu"):
        torch.manual_seed(0)
        embedding = torch.nn.Embedding(10, 4, sparse=True).to(device)
        embedding(torch.tensor([1, 2, 2], device=device)).sum().backward()
        embedding(torch.tensor([2, 5], device=device)).sum().backward()
        gradients.append(embedding.weight.grad)
    _assert_same(*gradients)


def test_gradients_through_sparse_products_and_values():
    """torch.sparse.mm's gradient for its dense operand, and a sparse tensor's values' gradient through to_dense."""
    grads = {}
    for device in ("neuron", "cpu"):
        values = VALUES.to(device, copy=True).requires_grad_()  # not the shared CPU tensor itself
        sparse = torch.sparse_coo_tensor(INDICES.to(device), values, (2, 3))
        weight = RIGHT.to(device, copy=True).requires_grad_()
        with fallback.as_error():
            (torch.sparse.mm(sparse, weight).pow(2).sum() + (sparse.to_dense() * DENSE.to(device)).sum()).backward()
        grads[device] = (values.grad.cpu(), weight.grad.cpu())
    torch.testing.assert_close(grads["neuron"], grads["cpu"])


def test_a_sparse_leaf_gets_a_sparse_gradient():
    gradients = []
    for device in ("neuron", "cpu"):
        sparse = _pair(coalesced=True)[device == "cpu"].requires_grad_()
        with fallback.as_error():
            (torch.sparse.mm(sparse, RIGHT.to(device)).pow(2).sum() + torch.sparse.sum(sparse * 2)).backward()
        gradients.append(sparse.grad)
    _assert_same(*gradients)


def test_saved_and_loaded_as_a_sparse_neuron_tensor():
    neuron, cpu = _pair()
    buffer = io.BytesIO()
    torch.save({"s": neuron}, buffer)
    buffer.seek(0)
    _assert_same(torch.load(buffer)["s"], cpu)



def test_a_compiled_model_with_a_sparse_embedding_gets_its_sparse_gradient():
    results = {}
    for device in ("neuron", "cpu"):
        torch.manual_seed(0)
        embedding, head = torch.nn.Embedding(10, 4, sparse=True).to(device), torch.nn.Linear(4, 1).to(device)

        def step(i):
            return head(embedding(i)).pow(2).mean()
        if device == "neuron":
            step = torch.compile(step, backend="neuron")
        with fallback.as_error():
            loss = step(torch.tensor([1, 2, 2], device=device))
            loss.backward()
        assert embedding.weight.grad.is_sparse
        results[device] = (loss.detach().cpu(), embedding.weight.grad.cpu().to_dense())
    torch.testing.assert_close(results["neuron"], results["cpu"])


JOIN_A = torch.tensor([[1.0, 0], [0, 2]]).to_sparse()
JOIN_B = torch.tensor([[0.0, 3], [4, 0]]).to_sparse()
HYBRID = torch.arange(12.0).view(2, 2, 3).to_sparse(1)  # one sparse dimension, two dense
JOINS = {
    "cat along a sparse dim": lambda a, b, h: torch.cat([a, b], 0),
    "cat along the last sparse dim": lambda a, b, h: torch.cat([a, b], 1),
    "cat along a dense dim": lambda a, b, h: torch.cat([h, h], 2),
    "cat of two dtypes": lambda a, b, h: torch.cat([a, b.double()]),
    "stack": lambda a, b, h: torch.stack([a, b]),
    "stack after the sparse dims": lambda a, b, h: torch.stack([a, b], 2),
    "stack among the dense dims": lambda a, b, h: torch.stack([h, h], -1),
    "unsqueeze": lambda a, b, h: torch.unsqueeze(a, 1),
    "unsqueeze of a dense dim": lambda a, b, h: torch.unsqueeze(h, 3),
}


@pytest.mark.parametrize("join", JOINS.values(), ids=JOINS.keys())
def test_joined_as_on_the_cpu(join):
    """The same entries in the same order (uncoalesced, as the CPU's)."""
    expected = join(JOIN_A, JOIN_B, HYBRID)
    with fallback.as_error():
        actual = join(JOIN_A.to("neuron"), JOIN_B.to("neuron"), HYBRID.to("neuron"))
    _assert_same(actual, expected)
    torch.testing.assert_close(actual._indices().cpu(), expected._indices())


@pytest.mark.parametrize("join", [
    lambda a, d: torch.cat([a, d(torch.ones(2, 2))]),  # a dense tensor among them
    lambda a, d: torch.cat([a, d(torch.ones(2, 3)).to_sparse()]),  # other sizes
], ids=["dense among sparse", "other sizes"])
def test_bad_joins_raise_the_cpus_error(join):
    with pytest.raises(RuntimeError) as on_cpu:
        join(JOIN_A, lambda t: t)
    with fallback.as_error(), pytest.raises(RuntimeError) as on_neuron:
        join(JOIN_A.to("neuron"), lambda t: t.to("neuron"))
    assert str(on_neuron.value) == str(on_cpu.value)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [0, 1, 2], ids=["sparse dim 0", "sparse dim 1", "dense dim"])
def test_softmax_over_the_entries_and_its_gradient(log, dim):
    """Over the entries sharing the other sparse indices (a missing one counts as minus infinity), of an
    uncoalesced tensor with a dense dimension; the gradient through it. (Not with dim=-1: the CPU's gradient
    then differs from its own with dim=2, a PyTorch 2.13 bug; neuron gives the dim=2 one for both.)"""
    indices = torch.tensor([[0, 1, 1, 0, 2], [2, 0, 2, 2, 1]])
    values = torch.tensor([[3.0, -1], [4, 0], [5, 2], [1, 1], [-1, 3]])
    softmax = torch.sparse.log_softmax if log else torch.sparse.softmax

    def run(device):
        s = torch.sparse_coo_tensor(indices, values, (3, 3, 2)).to(device).requires_grad_()
        out = softmax(s, dim)
        out.backward(torch.sparse_coo_tensor(indices, torch.arange(10.0).view(5, 2), (3, 3, 2)).to(device))
        return out, s.grad

    with fallback.as_error():
        on_neuron = run("neuron")
    for neuron, cpu in zip(on_neuron, run("cpu")):
        _assert_same(neuron, cpu)


@pytest.mark.parametrize("product", [torch.sparse.mm, torch.mm, torch.matmul], ids=["sparse.mm", "mm", "matmul"])
def test_sparse_times_sparse_and_its_gradients(product):
    """A coalesced sparse result, as the CPU's; gradients of both (kept where each has entries). The CPU marks
    its gradients uncoalesced only outside a dispatch mode (inside one, coalesced, as neuron's), so their values
    are compared."""
    right = torch.tensor([[0.0, 3], [4, 0], [1, 1]]).to_sparse()

    def run(device):
        a = torch.sparse_coo_tensor(INDICES, VALUES, (2, 3)).to(device).requires_grad_()
        b = right.to(device).requires_grad_()
        out = product(a, b)
        out.backward(torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([2.0, -1]), (2, 2))
                     .to(device))
        return out, a.grad, b.grad

    with fallback.as_error():
        out, *grads = run("neuron")
    expected_out, *expected_grads = run("cpu")
    _assert_same(out, expected_out)
    for grad, expected in zip(grads, expected_grads):
        torch.testing.assert_close(grad.cpu().to_dense(), expected.to_dense())
