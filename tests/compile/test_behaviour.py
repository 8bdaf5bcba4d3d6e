"""Graph breaks, recompiles and dynamic shapes, randomness, input mutation, modes, ops without lowerings, CPU ops."""
import jax
import pytest
import torch
from jax.experimental import serialize_executable
from torch._higher_order_ops.effects import has_effects

import torchneuron.compile as neuron_compile

from .models import Block


def _neuron(t):
    return t.to("neuron")


def test_listed_as_a_backend():
    assert "neuron" in torch._dynamo.list_backends()


def test_graph_breaks_give_several_correct_graphs(capsys):
    def f(x):
        y = x.sin() * 2
        print("between graphs")
        if y.sum() > 0:  # data-dependent branch
            return y.cos()
        return y.exp()

    fast = torch.compile(f, backend="neuron")
    for x in (torch.randn(6), -torch.rand(6) - 1):
        torch.testing.assert_close(fast(_neuron(x)).cpu(), f(x))
    assert neuron_compile.report()["dynamo_graphs"] >= 3
    assert "between graphs" in capsys.readouterr().out


def test_new_shapes_recompile_and_are_counted():
    fast = torch.compile(lambda x: (x * x).sum(0), backend="neuron")
    for n in (3, 3, 4, 5, 6):
        x = torch.randn(n, 2)
        torch.testing.assert_close(fast(_neuron(x)).cpu(), (x * x).sum(0))
    report = neuron_compile.report()
    # one program per distinct shape, built either by a Dynamo recompile or by shape specialisation
    assert report["specialisations"] == 4
    assert report["dynamo_graphs"] + report["recompiles"] == 4


@pytest.mark.parametrize("how", ["dynamic", "mark_dynamic"])
def test_dynamic_shapes_specialise_per_shape(how):
    def f(x):
        return torch.nn.functional.gelu(x.view(x.shape[0], -1)).mean(1)

    fast = torch.compile(f, backend="neuron", dynamic=True if how == "dynamic" else None)
    for n in (4, 5, 7):  # no size equal to another dim's: Dynamo's duck sizing would tie them
        x = torch.randn(n, 2, 3)
        device_x = _neuron(x)
        if how == "mark_dynamic":
            torch._dynamo.mark_dynamic(device_x, 0)
        torch.testing.assert_close(fast(device_x).cpu(), f(x))
    report = neuron_compile.report()
    assert report["dynamo_graphs"] == 1
    assert report["recompiles"] == 2


def test_dropout_follows_the_device_generator():
    fast = torch.compile(lambda x: torch.nn.functional.dropout(x, 0.5, training=True), backend="neuron")
    x = _neuron(torch.ones(4000))
    torch.manual_seed(1)
    first = fast(x).cpu()
    torch.manual_seed(1)
    again = fast(x).cpu()
    following = fast(x).cpu()
    torch.testing.assert_close(first, again)
    assert not torch.equal(first, following)
    assert set(first.unique().tolist()) == {0.0, 2.0}
    assert 0.45 < (first == 0).float().mean().item() < 0.55


def test_training_with_dropout_is_reproducible():
    def losses():
        torch.manual_seed(0)
        model = Block(dropout=0.2).to("neuron")
        fast = torch.compile(model, backend="neuron")
        x = _neuron(torch.randn(2, 5, 16))
        loss = fast(x).square().mean()
        loss.backward()
        return loss.cpu(), model.fc1.weight.grad.cpu()

    first, second = losses(), losses()
    torch.testing.assert_close(first, second)


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(3))

    def forward(self, x, cache, position: int):
        self.calls.add_(1)
        cache[:, position] = x  # a KV-cache style write into an input
        return cache.sum(1)


def test_input_mutations_reach_the_neuron_tensors():
    cpu_model = Counter()
    model = Counter().to("neuron")
    fast = torch.compile(model, backend="neuron")
    cpu_cache, cache = torch.zeros(2, 4), _neuron(torch.zeros(2, 4))
    with torch.no_grad():
        for position in range(3):
            x = torch.randn(2)
            before = cache._storage.buffer
            out = fast(_neuron(x), cache, position)
            torch.testing.assert_close(out.cpu(), cpu_model(x, cpu_cache, position))
    torch.testing.assert_close(cache.cpu(), cpu_cache)
    torch.testing.assert_close(model.calls.cpu(), cpu_model.calls)
    assert before.is_deleted()  # the mutated input's old buffer was donated to the executable


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_modes(mode):
    fast = torch.compile(lambda x: x.relu() + 1, backend="neuron", mode=mode)
    x = torch.randn(5)
    torch.testing.assert_close(fast(_neuron(x)).cpu(), x.relu() + 1)


def test_unknown_mode_is_an_error():
    with pytest.raises(RuntimeError, match="Unrecognized mode"):
        torch.compile(lambda x: x + 1, backend="neuron", mode="fastest")(_neuron(torch.ones(2)))


@torch.library.custom_op("neurontest::triple", mutates_args=())
def triple(x: torch.Tensor) -> torch.Tensor:
    """An op the lowering table cannot know (no lowering, no decomposition)."""
    return (x.cpu() * 3).to(x.device)


@triple.register_fake
def _(x):
    return torch.empty_like(x)


def test_op_without_lowering_splits_the_graph():
    def f(x):
        return triple(x.sin() + 1).cos() * 2

    fast = torch.compile(f, backend="neuron")
    x = torch.randn(7)
    with pytest.warns(UserWarning, match="neurontest.triple"):
        out = fast(_neuron(x))
    torch.testing.assert_close(out.cpu(), f(x))
    report = neuron_compile.report()
    assert report["eager_ops"] == {"neurontest.triple.default": 1}
    assert report["dynamo_graphs"] == 1
    assert report["specialisations"] == 2  # the compiled pieces before and after the eager op


def test_ops_on_cpu_tensors_run_on_the_cpu():
    """A graph's CPU part runs on the CPU, as Inductor runs it: its results stay CPU tensors, writes to CPU
    inputs land in them, and transfers in the graph are real ones."""
    @torch.compile(backend="neuron")
    def count_and_scale(count, x, host):
        count.add_(1)
        y = x.sin()
        return y * count, y.cpu() * 2, host.to("neuron") + y, count * 10

    count, x, host = torch.tensor(0.0), torch.randn(5), torch.randn(5)
    for step in range(1, 4):
        scaled, on_cpu, moved, tenfold = count_and_scale(count, _neuron(x), host)
        assert count.item() == step
        assert (scaled.device.type, on_cpu.device.type, moved.device.type, tenfold.device.type) == (
            "neuron", "cpu", "neuron", "cpu")
        torch.testing.assert_close(scaled.cpu(), x.sin() * step)
        torch.testing.assert_close(on_cpu, x.sin() * 2)
        torch.testing.assert_close(moved.cpu(), host + x.sin())
        assert tenfold.item() == 10 * step
    assert set(neuron_compile.report()["host_ops"]) >= {"aten.add.Tensor", "aten._to_copy.default"}
    assert neuron_compile.report()["eager_ops"] == {}


def test_a_function_of_cpu_tensors_runs_on_the_cpu():
    fast = torch.compile(lambda x: x.relu() + 1, backend="neuron")
    x = torch.randn(5)
    out = fast(x)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, x.relu() + 1)


_OPTIMIZERS = {
    "AdamW": lambda params: torch.optim.AdamW(params, lr=0.05),
    "NAdam": lambda params: torch.optim.NAdam(params, lr=0.05),  # a second CPU state: its momentum product
    "SGD": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
}


@pytest.mark.parametrize("name", _OPTIMIZERS)
def test_a_compiled_optimizer_step_trains_as_eager(name):
    """torch.compile(optimizer.step): each step must count (a lost count changes the bias correction and every
    update after the first two); as on CUDA, the state lives on the device and no op of the step runs on the CPU."""
    def train(device, compiled):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(device)
        optimizer = _OPTIMIZERS[name](model.parameters())
        step = torch.compile(optimizer.step, backend="neuron") if compiled else optimizer.step
        inputs, targets = torch.randn(32, 8).to(device), torch.randn(32, 1).to(device)
        for _ in range(4):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(inputs), targets).backward()
            step()
        state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        assert all(v.device.type == device for v in state)
        counts = [s["step"].item() for s in optimizer.state.values() if "step" in s]
        return [p.detach().cpu() for p in model.parameters()], counts

    expected, expected_counts = train("cpu", compiled=False)
    params, counts = train("neuron", compiled=True)
    assert counts == expected_counts
    assert neuron_compile.report()["host_ops"] == {}
    for got, want in zip(params, expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def _training_peak(fn, inputs, grad):
    torch.neuron.synchronize()
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.memory_allocated()
    fn(*inputs).backward(grad)
    torch.neuron.synchronize()
    return torch.neuron.max_memory_allocated() - base, torch.neuron.memory_allocated() - base


def test_compiled_training_holds_no_more_memory_than_eager():
    """A forward output the backward saves (AOTAutograd returns it twice, once detached) is one buffer, and
    a compiled graph keeps none of its callers' tensors alive."""
    def attention(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    compiled = torch.compile(attention, backend="neuron")
    shape = (1, 4, 512, 32)
    inputs = [torch.randn(shape).to("neuron").requires_grad_() for _ in range(3)]
    grad = torch.randn(shape).to("neuron")
    eager_peak, _ = _training_peak(attention, inputs, grad)
    for _ in range(2):
        for t in inputs:
            t.grad = None
        peak, held = _training_peak(compiled, inputs, grad)
        assert peak <= eager_peak
        assert held == 3 * inputs[0].nbytes  # the gradients, nothing else

    base = torch.neuron.memory_allocated()
    fresh = [torch.randn(shape).to("neuron").requires_grad_() for _ in range(3)]
    compiled(*fresh).backward(grad)
    del fresh
    assert torch.neuron.memory_allocated() == base


def test_a_compiled_linear_layer_saves_its_weight_not_a_copy():
    """AOTAutograd's forward saves `t(weight)` for the backward: a view of the weight, as eager autograd saves
    the weight itself (it was a copy of each weight, held from the forward to the backward)."""
    weight = torch.randn(256, 256).to("neuron").requires_grad_()
    x = torch.randn(2, 256).to("neuron").requires_grad_()

    def layer(x):
        return torch.nn.functional.linear(x, weight).relu()

    growth, grads = {}, {}
    for name, f in (("eager", layer), ("compiled", torch.compile(layer, backend="neuron"))):
        f(x).sum().backward()  # compiles
        weight.grad = x.grad = None
        base = torch.neuron.memory_allocated()
        y = f(x)
        growth[name] = torch.neuron.memory_allocated() - base
        y.sum().backward()
        grads[name] = weight.grad.cpu(), x.grad.cpu()
        weight.grad = x.grad = None
    assert growth["compiled"] <= growth["eager"] < weight.nbytes
    for got, expected in zip(grads["compiled"], grads["eager"]):
        torch.testing.assert_close(got, expected)


def test_a_weight_written_between_forward_and_backward_raises_as_in_eager():
    """The saved `t(weight)` counts versions with the weight (from the second run on it is made directly as the
    detached alias AOTAutograd keeps, not through the view op): writing the weight in place before the
    backward raises PyTorch's error, as eager does, at every run, not a gradient from the written weight."""
    weight = torch.randn(8, 8).to("neuron").requires_grad_()
    x = torch.randn(2, 8).to("neuron").requires_grad_()  # its gradient reads the weight
    layer = torch.compile(lambda x: torch.nn.functional.linear(x, weight).relu(), backend="neuron")
    for _ in range(3):
        y = layer(x)
        with torch.no_grad():
            weight.mul_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
    y = layer(x)
    y.sum().backward()
    mask = (torch.nn.functional.linear(x.detach().cpu(), weight.detach().cpu()) > 0).float()
    torch.testing.assert_close(weight.grad.cpu(), mask.t() @ x.detach().cpu())
    torch.testing.assert_close(x.grad.cpu(), mask @ weight.detach().cpu())


def _cat_to_empty(x):
    return torch.cat([torch.tensor([], device=x.device), x]) * 2


def _scaled_by_a_table(x):
    return x * torch.tensor([1.0, 2.0, 3.0], device=x.device)


@pytest.mark.parametrize("backend", ["neuron", "aot_eager"])
@pytest.mark.parametrize("f", [_cat_to_empty, _scaled_by_a_table])
def test_tensors_made_from_data_inside_a_compiled_function(f, backend):
    """`torch.tensor(data, device=x.device)` inside the function (a KV cache's first, empty keys; a constant
    table) is made for real while tracing: taken as a plain tensor is, it is the graph's constant. Before,
    Dynamo failed (a real neuron tensor met fake ones), and past Dynamo the graph held its fake value."""
    fast = torch.compile(f, backend=backend, fullgraph=True)
    x = torch.randn(3)
    for _ in range(2):
        torch.testing.assert_close(fast(_neuron(x)).cpu(), f(x))


def _eager_and_compiled_against_the_cpu(f, inputs, loss, **tolerance):
    """`f`'s outputs and its inputs' gradients of `loss(outputs)`, on neuron eagerly and compiled whole, as on
    the CPU."""
    results = {}
    for name, device, run in (("cpu", "cpu", f), ("eager", "neuron", f),
                              ("compiled", "neuron", torch.compile(f, backend="neuron", fullgraph=True))):
        leaves = [t.detach().to(device).requires_grad_() for t in inputs]
        out = run(*leaves)
        loss(out).backward()
        results[name] = [o.detach() for o in torch.utils._pytree.tree_leaves(out)] + [leaf.grad for leaf in leaves]
    for name in ("eager", "compiled"):
        for got, expected in zip(results[name], results["cpu"], strict=True):
            torch.testing.assert_close(got.cpu(), expected, **tolerance)


def _branching(x, w):
    y = x * w
    return torch.cond(y.sum() > 0, lambda t: (t.sin() * w,), lambda t: (t.cos() + w,), (y,))[0].sum()


def _doubling(x):
    return torch._higher_order_ops.while_loop(
        lambda i, t: i < 3, lambda i, t: (i + 1, t * 2), (torch.tensor(0, device=x.device), x))[1]


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_torch_cond_eager_and_compiled_into_the_program_with_gradients(sign):
    """`torch.cond` on neuron runs eagerly (PyTorch's dense rule, registered for neuron tensors) and compiles
    into the graph's own program (lax.cond): one graph each way, nothing eager. Before, eager refused a
    neuron predicate ("improper predicate") and the compiled graph called the op on JAX values."""
    _eager_and_compiled_against_the_cpu(_branching, [torch.full((4,), sign), torch.randn(4)], lambda out: out)
    report = neuron_compile.report()
    assert report["graphs"] == 2 and report["eager_ops"] == {}  # forward and backward, each one program


def test_while_loop_eager_and_compiled():
    x = torch.randn(4)
    expected = _doubling(x)
    torch.testing.assert_close(_doubling(_neuron(x)).cpu(), expected)
    compiled = torch.compile(_doubling, backend="neuron", fullgraph=True)
    torch.testing.assert_close(compiled(_neuron(x)).cpu(), expected)
    assert neuron_compile.report()["eager_ops"] == {}


def _recurrence(h0, xs, w):
    from torch._higher_order_ops.scan import scan

    def step(h, x):
        h = torch.tanh(h @ w + x)
        return h, h.sum(-1)

    return scan(step, h0, xs, dim=1)


def _two_carries_in_reverse(init, xs):
    from torch._higher_order_ops.scan import scan

    def step(carry, x):
        return {"sum": carry["sum"] + x["a"], "product": carry["product"] * x["b"]}, (carry["sum"] * 2, x["a"] - x["b"])

    return scan(step, init, xs, reverse=True)


def test_scan_eager_and_compiled_into_the_program_with_gradients():
    """`scan` runs eagerly on neuron (PyTorch's dense rule, as on the CPU; before: "no rule registered for HOP
    scan and subclass") and compiles into the graph's program as one lax.scan, its backward (a reverse scan)
    too: two programs, nothing run between pieces (before, the graph was split around it and the scan ran op
    by op)."""
    _eager_and_compiled_against_the_cpu(_recurrence, [torch.randn(2, 4), torch.randn(2, 6, 4), torch.randn(4, 4) * 0.5],
                                        lambda out: out[0].sum() + (out[1] * out[1]).sum(), rtol=1e-4, atol=1e-5)
    report = neuron_compile.report()
    assert report["graphs"] == 2 and report["eager_ops"] == {}


def test_scan_of_pytrees_in_reverse_eager_and_compiled():
    init = {"sum": torch.zeros(3), "product": torch.ones(3)}
    xs = {"a": torch.randn(5, 3), "b": torch.rand(5, 3) + 0.5}
    expected = _two_carries_in_reverse(init, xs)
    on_neuron = [{k: v.to("neuron") for k, v in tree.items()} for tree in (init, xs)]
    for f in (_two_carries_in_reverse, torch.compile(_two_carries_in_reverse, backend="neuron", fullgraph=True)):
        got = torch.utils._pytree.tree_map(lambda t: t.cpu(), f(*on_neuron))
        torch.testing.assert_close(got, expected)
    assert neuron_compile.report()["eager_ops"] == {}


def _rows_in_a_scan(x, i):
    from torch._higher_order_ops.scan import scan

    return scan(lambda total, k: (total + x[(i + k).reshape(1)].sum(), total * 2),
                torch.zeros((), device=x.device), torch.arange(3, device=x.device))[0]


def test_indexing_inside_a_compiled_scan_is_checked():
    """The combine graph's checks are carried through lax.scan, the first failure kept: x[5] raises."""
    compiled = torch.compile(_rows_in_a_scan, backend="neuron", fullgraph=True)
    x = torch.randn(5, 3)
    torch.testing.assert_close(compiled(_neuron(x), _neuron(torch.tensor(2))).cpu(),
                               _rows_in_a_scan(x, torch.tensor(2)))
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        compiled(_neuron(x), _neuron(torch.tensor(3))).cpu()


def test_map_eager_and_compiled_into_the_program_with_gradients():
    """`map` runs eagerly (PyTorch's dense rule) and compiles into the program as a scan without a carry,
    forward and backward (before, the graph split around it)."""
    _eager_and_compiled_against_the_cpu(_mapped, [torch.randn(4, 3), torch.randn(3)],
                                        lambda out: out[0].sum() + (out[1] * out[1]).sum())
    report = neuron_compile.report()
    assert report["graphs"] == 2 and report["eager_ops"] == {}


def _printed_and_added(x):
    from torch._higher_order_ops.print import print as print_op

    print_op("printed {x}", x=x)
    return x + 1


def test_print_runs_eagerly_and_between_compiled_pieces(capsys):
    """The `print` higher-order op prints neuron tensors eagerly (PyTorch's dense rule, registered for neuron)
    and, compiled, runs between the pieces (it has no lowering: an effect with no lowering splits the graph).
    Before, eager raised "no rule registered for HOP print" and the compiled graph "'NoneType' object is not
    callable" while tracing its program."""
    x = torch.tensor([1.0, 2.0])
    torch.testing.assert_close(_printed_and_added(_neuron(x)).cpu(), x + 1)
    assert "printed tensor([1., 2.], device='neuron:0')" in capsys.readouterr().out
    compiled = torch.compile(_printed_and_added, backend="neuron", fullgraph=True)
    torch.testing.assert_close(compiled(_neuron(x)).cpu(), x + 1)
    assert "printed tensor([1., 2.], device='neuron:0')" in capsys.readouterr().out
    assert list(neuron_compile.report()["eager_ops"]) == ["with_effects"]


@pytest.mark.parametrize("dtype, out", [(torch.int8, torch.int32), (torch.bfloat16, torch.float32)])
def test_out_dtype_eager_and_compiled(dtype, out):
    """`out_dtype` (torch.ao's int8 products into int32): eagerly PyTorch's dense rule, compiled a lowering in
    the program computing as that rule does off CUDA (before: eager refused it, compile split the graph)."""
    from torch._higher_order_ops.out_dtype import out_dtype

    def product(a, b):
        return out_dtype(torch.ops.aten.mm.default, out, a, b)

    a, b = (torch.randint(-100, 100, shape).to(dtype) for shape in ((3, 8), (8, 2)))
    expected = product(a, b)
    assert expected.dtype == out
    for f in (product, torch.compile(product, backend="neuron", fullgraph=True)):
        torch.testing.assert_close(f(_neuron(a), _neuron(b)).cpu(), expected)
    assert neuron_compile.report()["eager_ops"] == {}


def test_hints_wrapper_and_foreach_map_compile_into_the_program():
    from torch._higher_order_ops.foreach_map import foreach_map
    from torch._higher_order_ops.hints_wrap import hints_wrapper

    def f(x, y):
        hinted = hints_wrapper(lambda v: v.sin() + 1, (x,), {}, hints={"outer_domain": True})
        return foreach_map(lambda a, b: a * b + 1, [hinted, x], [y, y])

    x, y = torch.randn(3), torch.randn(3)
    got = torch.compile(f, backend="neuron", fullgraph=True)(_neuron(x), _neuron(y))
    torch.testing.assert_close([t.cpu() for t in got], list(f(x, y)))
    assert neuron_compile.report()["eager_ops"] == {}


def test_generic_associative_scan_runs_eagerly():
    from torch._higher_order_ops.associative_scan import associative_scan

    x = torch.rand(6, 3) + 0.5
    products = associative_scan(lambda a, b: a * b, _neuron(x), dim=0, combine_mode="generic")
    torch.testing.assert_close(products.cpu(), torch.cumprod(x, 0))


def _shift_right(ids):
    shifted = ids.new_zeros(ids.shape)
    shifted[:, 1:] = ids[:, :-1].clone()
    shifted[:, 0] = 1
    return shifted


def test_integer_ops_on_symbolic_strides_compile():
    """The CPU's dtype checks of a graph's integer ops run on zeros, which symbolic strides cannot size (a
    column of a dynamic-length batch, as Whisper's shift_tokens_right writes): such ops are not asked. Before,
    PyTorch's "SymIntArrayRef expected to contain only concrete integers" was taken for a refusal."""
    fast = torch.compile(_shift_right, backend="neuron", dynamic=True)
    for length in (6, 5):
        ids = torch.randint(2, 100, (2, length))
        torch.testing.assert_close(fast(_neuron(ids)).cpu(), _shift_right(ids))


def test_compiled_activation_checkpointing_replays_dropout():
    """Checkpointed random ops in a compiled graph save the generator's state and replay it in backward
    (run_and_save_rng_state / run_with_rng_state, run between the compiled pieces): the gradients equal eager
    ones without checkpointing for the same seed. Before, the graph called them on JAX values and failed."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 8)).to("neuron")
    x = torch.randn(4, 8, device="neuron")
    compiled = torch.compile(lambda t: checkpoint(model, t, use_reentrant=False).sum(), backend="neuron")
    grads = []
    for run in (compiled, lambda t: model(t).sum()):
        leaf = x.detach().requires_grad_()
        torch.manual_seed(1)
        run(leaf).backward()
        grads.append(leaf.grad.cpu())
    torch.testing.assert_close(grads[0], grads[1])


def test_compiled_autograd_compiles_the_backward_graph_with_the_neuron_backend():
    """Compiled autograd hands the whole backward to the backend as one graph taking its tensors boxed in a list;
    it is flattened as AOTAutograd's own backends flatten it (AOTAutograd refused the list: "all flat_args must
    be KNOWN_TYPES"). Gradients equal the CPU's."""
    from torch._dynamo import compiled_autograd

    grads = {}
    for device in ("cpu", "neuron"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(device)
        x = torch.randn(4, 8).to(device)
        if device == "neuron":
            graphs = neuron_compile.report()["dynamo_graphs"]
            with compiled_autograd._enable(torch.compile(backend="neuron")):
                torch.compile(model, backend="neuron")(x).square().sum().backward()
            assert neuron_compile.report()["dynamo_graphs"] >= graphs + 2  # the forward's and compiled autograd's
        else:
            model(x).square().sum().backward()
        grads[device] = [p.grad.cpu() for p in model.parameters()]
    for neuron, cpu in zip(grads["neuron"], grads["cpu"]):
        torch.testing.assert_close(neuron, cpu, rtol=1e-5, atol=1e-5)


@torch.compiler.nested_compile_region
def _block(x, w):
    return (x @ w).relu()


@torch.library.custom_op("torchneuron_tests::scale_", mutates_args=("x",))
def _scale_(x: torch.Tensor, s: float) -> None:
    x.mul_(s)


def _mutates_through_a_custom_op(x):
    y = x * 2
    _scale_(y, 3.0)
    return y + 1


def _mapped(xs, y):
    from functorch.experimental.control_flow import map as control_flow_map

    return control_flow_map(lambda x, y: (x.sin() * y + 1, x.sum()), xs, y)


def test_nested_compile_regions_are_part_of_the_program():
    def f(x, w):
        return _block(_block(x, w), w).sum()

    x, w = torch.randn(4, 4), torch.randn(4, 4)
    torch.testing.assert_close(torch.compile(f, backend="neuron", fullgraph=True)(_neuron(x), _neuron(w)).cpu(),
                               f(x, w))
    assert neuron_compile.report()["eager_ops"] == {}


def test_higher_order_ops_without_a_lowering_run_between_compiled_pieces():
    """A higher-order op the table cannot lower (a mutating custom op's auto_functionalized) runs eagerly
    between the graph's compiled pieces with PyTorch's dense rule, registered for neuron tensors when the
    graph is compiled. Before, the graph called it on JAX values, or PyTorch had no rule for neuron."""
    x = torch.randn(3)
    got = torch.compile(_mutates_through_a_custom_op, backend="neuron")(_neuron(x))
    torch.testing.assert_close(got.cpu(), _mutates_through_a_custom_op(x))
    assert neuron_compile.report()["eager_ops"]


def _dropout_in_a_branch(x):
    return torch.cond(x.sum() > 0, lambda t: torch.nn.functional.dropout(t, 0.5, True), lambda t: t * 2, (x,))


def test_a_random_op_inside_control_flow_runs_the_op_between_pieces():
    """A lowered higher-order op's subgraphs get no random key, so one holding a random op runs eagerly with
    PyTorch's dense rule, drawing from the generator as eager code does (before: "unexpected PRNG key type")."""
    x = torch.ones(64, device="neuron")
    torch.manual_seed(3)
    expected = _dropout_in_a_branch(x).cpu()
    torch.manual_seed(3)
    got = torch.compile(_dropout_in_a_branch, backend="neuron", fullgraph=True)(x).cpu()
    torch.testing.assert_close(got, expected)
    assert set(got.tolist()) == {0.0, 2.0}
    assert "cond" in str(neuron_compile.report()["eager_ops"])


def _relu_of_a_convolution(x, w):
    return torch.relu(torch.nn.functional.conv2d(x, w, padding=1))


def _channels_last(t):
    return t.contiguous(memory_format=torch.channels_last)


LAID_OUT = [  # a function, its inputs: an output eager lays out densely but not row-major
    (_relu_of_a_convolution, lambda: (_channels_last(torch.randn(2, 3, 6, 6)), torch.randn(8, 3, 3, 3))),
    (lambda a: (a * 2).t(), lambda: (torch.randn(3, 4),)),
    (lambda a: (a * 2).permute(1, 0, 2), lambda: (torch.randn(3, 4, 5),)),
]


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("f, inputs", LAID_OUT)
def test_outputs_are_laid_out_as_eager_lays_them_out(f, inputs, training):
    """A compiled function's outputs have the strides eager gives them (and Inductor's programs), as the graph's
    fake tensors say: channels-last after a channels-last convolution, transposed after a transpose. They were
    row-major, so channels-last code doing `y.permute(0, 2, 3, 1).view(...)` raised only when compiled."""
    torch.manual_seed(0)
    cpu_inputs = [t.requires_grad_(training) for t in inputs()]
    device_inputs = [t.detach().to("neuron").requires_grad_(training) for t in cpu_inputs]
    expected, got = f(*cpu_inputs), torch.compile(f, backend="neuron")(*device_inputs)
    assert got.stride() == expected.stride() != torch.empty(expected.shape).stride()
    torch.testing.assert_close(got.detach().cpu(), expected.detach(), rtol=1e-4, atol=1e-4)
    if training:
        weights = torch.linspace(-1, 1, expected.numel()).reshape(expected.shape)
        expected.backward(weights)
        got.backward(weights.to("neuron"))
        for device_input, cpu_input in zip(device_inputs, cpu_inputs):
            torch.testing.assert_close(device_input.grad.cpu(), cpu_input.grad, rtol=1e-4, atol=1e-4)


def _one_row_more(t):
    """`t` with its first row repeated at its end, in its memory format."""
    channels_last = t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)
    grown = torch.cat([t, t[:1]])
    return _channels_last(grown) if channels_last else grown


@pytest.mark.parametrize("f, inputs", LAID_OUT)
def test_outputs_of_symbolic_sizes_are_laid_out_as_eager_lays_them_out(f, inputs):
    """Under `dynamic=True` too, for the sizes the graph was traced with and for others (they were row-major,
    their strides being symbolic)."""
    compiled = torch.compile(f, backend="neuron", dynamic=True)
    neuron_compile.reset()
    for cpu_inputs in (inputs(), [_one_row_more(t) for t in inputs()[:1]] + list(inputs()[1:])):
        expected, got = f(*cpu_inputs), compiled(*[t.to("neuron") for t in cpu_inputs])
        assert got.stride() == expected.stride() != torch.empty(expected.shape).stride()
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-4)
    assert neuron_compile.report()["dynamo_graphs"] == 1


VIEWS_OF_INTERMEDIATES = [  # a function, its input: an output eager makes as a view of an intermediate
    lambda a: (a * 2).expand(3, 4, 6),
    lambda a: a.sum(0, keepdim=True).expand_as(a),
    lambda a: (a + 1)[:, ::2],
    lambda a: (a + 1)[1:],
    lambda a: (a + 1).diagonal(),
]


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("f", VIEWS_OF_INTERMEDIATES)
def test_views_of_intermediates_are_views_as_in_eager(f, training, dynamic):
    """An output viewing an intermediate has eager's strides and storage offset, and its storage eager's size
    (an expand holds its base's elements only), as Inductor's programs return it; it was a row-major copy (and
    under `dynamic=True`, a copy still, its sizes being symbolic)."""
    torch.manual_seed(0)
    cpu_input = torch.randn(4, 6).requires_grad_(training)
    device_input = cpu_input.detach().to("neuron").requires_grad_(training)
    expected, got = f(cpu_input), torch.compile(f, backend="neuron", dynamic=dynamic)(device_input)
    assert (got.stride(), got.storage_offset()) == (expected.stride(), expected.storage_offset())
    assert got.untyped_storage().nbytes() == expected.untyped_storage().nbytes()
    torch.testing.assert_close(got.detach().cpu(), expected.detach())
    if training:
        weights = torch.linspace(-1, 1, expected.numel()).reshape(expected.shape)
        expected.backward(weights)
        got.backward(weights.to("neuron"))
        torch.testing.assert_close(device_input.grad.cpu(), cpu_input.grad)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("f", [lambda a: torch.chunk(a, 2), lambda a: torch.chunk(a * 2, 2, 1),
                               lambda a: torch.chunk(a, 2)[1].unbind(1)], ids=["input", "intermediate", "unbind"])
def test_views_from_a_list_of_views_keep_their_storage_offsets(f, dynamic):
    """chunk's second piece starts at its offset under `dynamic=True` too, as in eager: its split size being
    symbolic, AOTAutograd rebuilt it from the graph's output, a buffer of its own at offset 0 (wrong values)."""
    x = torch.randn(5, 4, 3)
    expected, got = f(x), torch.compile(f, backend="neuron", dynamic=dynamic)(x.to("neuron"))
    assert [(g.stride(), g.storage_offset()) for g in got] == [(e.stride(), e.storage_offset()) for e in expected]
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.cpu(), e)


def test_outputs_viewing_another_output_alias_it():
    """`y, y[1:]` returned by a compiled function share one storage, as in eager: a write through one shows in
    the other (they were two buffers)."""
    def f(x):
        y = x + 1
        return y, y[1:], y.t()

    y, rows, transposed = torch.compile(f, backend="neuron")(torch.randn(4, 5).to("neuron"))
    assert rows.untyped_storage().data_ptr() == transposed.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    y.add_(100)
    torch.testing.assert_close(rows.cpu(), y.cpu()[1:])
    torch.testing.assert_close(transposed.cpu(), y.cpu().t())


def test_outputs_viewing_another_output_by_symbolic_sizes_alias_it():
    """Under `dynamic=True`, `y[:n], y[n:]` with `n` from an input's size alias `y` as in eager, in each
    signature the one graph runs with (they were buffers of their own: a write through one did not show)."""
    def f(x, like):
        y = x * 2
        return y, y[: like.shape[0]], y[like.shape[0]:]

    compiled = torch.compile(f, backend="neuron", dynamic=True)
    neuron_compile.reset()
    for n in (3, 4, 5):
        x = torch.arange(8.0)
        y, head, tail = compiled(x.to("neuron"), torch.empty(n))
        expected, expected_head, expected_tail = f(x, torch.empty(n))
        assert head.untyped_storage().data_ptr() == tail.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
        assert (tail.shape, tail.storage_offset()) == (expected_tail.shape, expected_tail.storage_offset())
        head.add_(100)
        expected_head.add_(100)
        torch.testing.assert_close(y.cpu(), expected)
        torch.testing.assert_close(tail.cpu(), expected_tail)
    assert neuron_compile.report()["dynamo_graphs"] == 1


def test_writing_to_an_output_the_backward_saved_raises_as_in_eager():
    """AOTAutograd's forward returns `exp(x)` and, detached, the same value saved for the backward: the two
    share a version counter, so an in-place write to the output raises PyTorch's error, as eager and Inductor
    raise it; the saved alias counted its versions apart, and the backward used the written values (a wrong
    gradient, silently)."""
    x = torch.randn(4).to("neuron").requires_grad_()
    y = torch.compile(torch.exp, backend="neuron")(x)
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("source, target", [
    (torch.float32, torch.int32), (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32),
    (torch.float32, torch.complex64), (torch.complex64, torch.float32), (torch.uint8, torch.bool),
    (torch.int16, torch.int8),
])
def test_view_as_another_dtype_in_a_compiled_graph(source, target):
    """`x.view(dtype)` of an intermediate reinterprets its bytes in the program (the reshape lowering took
    the dtype for a size: TypeError)."""
    def f(x):
        return (x * 1).view(target) * 1

    x = torch.arange(1, 13, dtype=torch.float32).reshape(3, 4).to(source)
    expected = f(x)
    got = torch.compile(f, backend="neuron")(x.to("neuron"))
    assert got.shape == expected.shape and got.dtype == expected.dtype
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True)


@pytest.mark.parametrize("solver", [torch.linalg.inv, torch.linalg.cholesky, lambda a: torch.linalg.solve(a, a[:, :1])])
def test_linalg_solvers_compile_whole_and_check_their_input(solver):
    """torch 2.13 orders linalg's error check after a factorization with AOTAutograd's `with_effects`, whose effect
    token is an empty CPU tensor while tracing: the graph split there and its eager piece had no rule for neuron
    tensors (NotImplementedError). It is one program now, and a singular input raises LinAlgError as in eager
    (compiled programs dropped their checks and returned NaNs)."""
    a = torch.randn(4, 4)
    a = a @ a.T + 4 * torch.eye(4)
    compiled = torch.compile(solver, backend="neuron")
    torch.testing.assert_close(compiled(a.to("neuron")).cpu(), solver(a), rtol=1e-4, atol=1e-4)
    assert neuron_compile.report()["host_ops"] == {}
    if has_effects(torch.ops.aten._linalg_check_errors.default):
        with pytest.raises(torch.linalg.LinAlgError):
            compiled(torch.zeros(4, 4).to("neuron")).cpu()
    # else (torch 2.11) AOTAutograd drops the check, which returns nothing, from the graph: Inductor's programs
    # return NaNs alike


def _gather_rows(x, i):
    return x[i] * 2


def _embed(x, i):
    return torch.nn.functional.embedding(i, x)


@pytest.mark.parametrize("f", [_gather_rows, _embed])
def test_compiled_indexing_out_of_range_raises_as_in_eager(f):
    """An index out of range raises IndexError at the next synchronisation, as eager's device checks raise it
    (and CUDA's device asserts): a compiled program clamped it and returned another row."""
    compiled = torch.compile(f, backend="neuron")
    x = torch.randn(4, 3)
    torch.testing.assert_close(compiled(x.to("neuron"), torch.tensor([3, 0]).to("neuron")).cpu(),
                               f(x, torch.tensor([3, 0])))
    with pytest.raises(IndexError):
        compiled(x.to("neuron"), torch.tensor([4]).to("neuron")).cpu()


def _rows_in_a_branch(x, i):
    return torch.cond(x.sum() > 0, lambda x, i: x[i] * 2, lambda x, i: x[i.clamp(max=3)] - 1, (x, i))


def test_indexing_inside_a_compiled_cond_branch_is_checked_where_the_branch_runs():
    """A branch's checks are values of lax.cond's trace: they come out of the cond as results (the branch
    that did not run reports none), where they were dropped and the index clamped."""
    compiled = torch.compile(_rows_in_a_branch, backend="neuron")
    x = torch.randn(4, 3).abs()
    for sign, i in ((1, [2, 0]), (-1, [2, 0]), (-1, [9, 0])):
        got = compiled(sign * x.to("neuron"), torch.tensor(i).to("neuron"))
        torch.testing.assert_close(got.cpu(), _rows_in_a_branch(sign * x, torch.tensor(i)))
    with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 4"):
        compiled(x.to("neuron"), torch.tensor([9, 0]).to("neuron")).cpu()


def _sum_of_rows_in_a_loop(x, i):
    from torch._higher_order_ops.while_loop import while_loop

    return while_loop(lambda k, total: k < 3, lambda k, total: (k + 1, total + x[(i + k).reshape(1)].sum()),
                      (torch.zeros((), dtype=torch.int64, device=x.device), torch.zeros((), device=x.device)))[1]


def _sum_while_rows_are_finite(x, i):
    from torch._higher_order_ops.while_loop import while_loop

    return while_loop(lambda k, total: (x[(i + k).reshape(1)].sum() > -1e9) & (k < 3),
                      lambda k, total: (k + 1, total + x[k.reshape(1)].sum()),
                      (torch.zeros((), dtype=torch.int64, device=x.device), torch.zeros((), device=x.device)))[1]


def test_indexing_inside_a_compiled_while_predicate_is_checked():
    """The predicate's checks, which lax's loop condition cannot return, are made again before the loop and
    at the end of each iteration, and carried: x[5] in the fourth test raises."""
    compiled = torch.compile(_sum_while_rows_are_finite, backend="neuron", fullgraph=True)
    x = torch.randn(5, 3)
    torch.testing.assert_close(compiled(x.to("neuron"), torch.tensor(1).to("neuron")).cpu(),
                               _sum_while_rows_are_finite(x, torch.tensor(1)))
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        _sum_while_rows_are_finite(x, torch.tensor(2))
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        compiled(x.to("neuron"), torch.tensor(2).to("neuron")).cpu()


def test_indexing_inside_a_compiled_while_loop_is_checked():
    """The body's checks are carried through lax.while_loop, the first failure kept."""
    compiled = torch.compile(_sum_of_rows_in_a_loop, backend="neuron", fullgraph=True)
    x = torch.randn(5, 3)
    torch.testing.assert_close(compiled(x.to("neuron"), torch.tensor(2).to("neuron")).cpu(),
                               _sum_of_rows_in_a_loop(x, torch.tensor(2)))
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        compiled(x.to("neuron"), torch.tensor(3).to("neuron")).cpu()


def _put_rows(x, mask, values):
    return torch.index_put(x, (mask,), values)


def _add_rows(x, mask, values):
    return torch.index_put(x, (mask,), values, accumulate=True)


def _put_columns(x, mask, values):
    x = x.clone()
    x[:, mask] = values
    return x


_MASK = torch.tensor([True, False, True])


@pytest.mark.parametrize("f, mask, values", [
    (_put_rows, _MASK, torch.randn(2, 4)), (_put_rows, _MASK, torch.randn(1, 4)), (_add_rows, _MASK, torch.randn(2, 4)),
    (_put_rows, torch.tensor([[True, False, True, True]] * 3), torch.randn(9)),
    (_put_columns, torch.tensor([True, False, False, True]), torch.randn(3, 2)),
])
def test_index_put_through_a_boolean_mask_in_a_compiled_graph(f, mask, values):
    """Eager turns a mask into indices; a graph keeps it (index_put's result has self's shape), and its
    lowering failed with JAX's NonConcreteBooleanIndexError, as the number of selected elements is data."""
    x = torch.randn(3, 4)
    got = torch.compile(f, backend="neuron")(*(t.to("neuron") for t in (x, mask, values)))
    torch.testing.assert_close(got.cpu(), f(x, mask, values))


def test_index_put_through_a_mask_selecting_other_than_the_values_rows_raises():
    with pytest.raises(RuntimeError, match=r"value tensor of shape \[2, 4\] cannot be broadcast to indexing result "
                                           r"of shape \[1, 4\]"):
        torch.compile(_put_rows, backend="neuron")(*(t.to("neuron") for t in (
            torch.randn(3, 4), torch.tensor([True, False, False]), torch.randn(2, 4)))).cpu()


def test_batch_norm_in_eval_mode_saves_empty_statistics_as_the_cpu_does():
    x, mean, var = torch.randn(2, 3, 4), torch.randn(3), torch.rand(3) + 0.5
    f = lambda x, mean, var: torch.native_batch_norm(x, None, None, mean, var, False, 0.1, 1e-5)  # noqa: E731
    got = torch.compile(f, backend="neuron")(*(t.to("neuron") for t in (x, mean, var)))
    for g, e in zip(got, f(x, mean, var)):
        torch.testing.assert_close(g.cpu(), e)


@pytest.mark.parametrize("flag", [torch.conj, torch._neg_view, lambda z: z.conj().imag])
def test_lazily_conjugated_or_negated_inputs_are_read_as_they_show(flag):
    """`x.conj()` is a view with a bit set, not new values: a compiled graph read its storage as it is (the
    unconjugated values), and so did the compiled piece after a split hfft2's `_conj`."""
    z = torch.randn(3, 4, dtype=torch.complex64)
    got = torch.compile(lambda a: a * 2, backend="neuron")(flag(z.to("neuron")))
    torch.testing.assert_close(got.cpu(), flag(z) * 2)


def test_a_lazily_conjugated_input_written_in_place():
    def scale(a):
        a.mul_(2)
        return a * 1

    z = torch.randn(3, dtype=torch.complex64)
    base = z.to("neuron")
    got = torch.compile(scale, backend="neuron")(base.conj())
    expected_base = z.clone()
    expected = scale(expected_base.conj())
    torch.testing.assert_close(got.cpu(), expected)
    torch.testing.assert_close(base.cpu(), expected_base)


def test_hfft2_compiles_whole():
    """Its decomposition conjugates lazily (`_conj`), which splits no graph now."""
    x = torch.randn(5, 6, 7)
    got = torch.compile(lambda t: torch.fft.hfft2(t, norm="ortho"), backend="neuron")(x.to("neuron"))
    torch.testing.assert_close(got.cpu(), torch.fft.hfft2(x, norm="ortho"), rtol=1e-4, atol=1e-4)
    assert neuron_compile.report()["eager_ops"] == {}


def _transformer_encoder():
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 2), torch.randn(2, 5, 16)


def _flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return lambda q: flex_attention(q, q, q), torch.randn(1, 2, 16, 8)


@pytest.mark.parametrize("device, backend", [("cpu", "eager"), ("neuron", "neuron")])
@pytest.mark.parametrize("make", [_transformer_encoder, _flex_attention])
def test_pytorch_code_torchneuron_wraps_compiles_into_one_graph(make, device, backend):
    """torchneuron wraps nn.TransformerEncoder.forward and flex attention's device check (runtime patches), and
    Dynamo skips torchneuron's code: every compiled model with either broke its graph at the wrapper, on any
    device once torchneuron was imported, so `fullgraph=True` and precompiling failed. Dynamo traces them."""
    torch.manual_seed(0)
    f, x = make()
    expected = f(x)
    if isinstance(f, torch.nn.Module):
        f = f.to(device)
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(x.to(device)).cpu(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.complex64, torch.bool])
def test_graphs_with_constants_numpy_cannot_hold_are_cached(dtype):
    """A graph's constants are part of its disk-cache key; hashing them through numpy failed on bfloat16
    ("Got unsupported ScalarType"), so every graph holding one (masked reductions' fill values) failed."""
    def f(x):
        return x * torch.tensor([1, 0], dtype=dtype, device=x.device)

    x = torch.randn(3, 2).to(dtype)
    torch.testing.assert_close(torch.compile(f, backend="neuron")(x.to("neuron")).cpu(), f(x))


def _arange_and_softmax(x):
    return torch.softmax(x * torch.arange(x.shape[-1], device=x.device), -1).cumsum(-1)


def test_a_graph_found_on_disk_loads_its_executable_without_lowering_its_program(monkeypatch):
    """A disk-cache hit loads the executable stored with the graph: the exported program is neither read nor
    lowered again (half of a warm start's load), and the loaded executable computes what the compiled one did,
    beside it in one process."""
    x = torch.randn(3, 5)
    compiled = torch.compile(_arange_and_softmax, backend="neuron")(x.to("neuron")).cpu()
    torch._dynamo.reset()
    neuron_compile.reset()

    def refuse(*args):
        raise AssertionError("the exported program was read")

    monkeypatch.setattr(jax.export, "deserialize", refuse)
    loaded = torch.compile(_arange_and_softmax, backend="neuron")(x.to("neuron")).cpu()
    assert neuron_compile.report()["disk_cache_hits"] == 1 and neuron_compile.report()["xla_compiles"] == 0
    torch.testing.assert_close(loaded, compiled, rtol=0, atol=0)
    torch.testing.assert_close(loaded, _arange_and_softmax(x))


def test_a_graph_whose_stored_executable_cannot_run_is_compiled_again(unrunnable_stored_executables):
    """An executable that loads from disk but fails at its first run (consuming nothing) is replaced by the graph's
    program compiled afresh, once. (Shapes of its own: an executable JAX's cache gave is not stored.)"""
    x = torch.randn(4, 11)
    torch.compile(_arange_and_softmax, backend="neuron")(x.to("neuron"))
    torch._dynamo.reset()
    neuron_compile.reset()
    loaded = torch.compile(_arange_and_softmax, backend="neuron")
    torch.testing.assert_close(loaded(x.to("neuron")).cpu(), _arange_and_softmax(x))
    torch.testing.assert_close(loaded(x.to("neuron") * 2).cpu(), _arange_and_softmax(x * 2))
    assert neuron_compile.report()["disk_cache_hits"] == 1 and len(unrunnable_stored_executables) == 1


def test_a_graph_whose_stored_executable_cannot_load_is_compiled_from_its_exported_program(monkeypatch):
    x = torch.randn(3, 5)
    torch.compile(_arange_and_softmax, backend="neuron")(x.to("neuron"))
    torch._dynamo.reset()
    neuron_compile.reset()

    def refuse(*args, **kwargs):
        raise RuntimeError("built for another runtime")

    monkeypatch.setattr(serialize_executable, "deserialize_and_load", refuse)
    loaded = torch.compile(_arange_and_softmax, backend="neuron")(x.to("neuron")).cpu()
    assert neuron_compile.report()["disk_cache_hits"] == 1 and neuron_compile.report()["xla_compiles"] == 0
    torch.testing.assert_close(loaded, _arange_and_softmax(x))
