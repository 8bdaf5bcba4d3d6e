"""torch.neuron.graph / NeuronGraph: torch.cuda.graph's capture and replay (device/graphs.py, eager/adaptive.py
`CapturedGraph`), checked against the same computation on the CPU."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F


@pytest.mark.parametrize("adaptive", [True, False])
def test_replay_reads_static_inputs_and_rewrites_outputs(adaptive):
    weight = torch.randn(3, 2)
    static_x, w = torch.zeros(4, 3, device="neuron"), weight.to("neuron")
    counter = torch.zeros((), device="neuron")
    graph = torch.neuron.NeuronGraph()
    with torch.neuron.adaptive_eager(adaptive), torch.neuron.graph(graph):
        assert torch.neuron.is_current_stream_capturing()
        static_y = (static_x @ w).relu() + 1
        counter.add_(1)
    assert not torch.neuron.is_current_stream_capturing()
    assert counter.item() == 0  # capturing ran nothing
    for step in range(1, 4):
        x = torch.randn(4, 3)
        static_x.copy_(x)
        graph.replay()
        torch.testing.assert_close(static_y.cpu(), (x @ weight).relu() + 1)
        assert counter.item() == step


def test_a_captured_training_step_trains_as_on_the_cpu():
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to("neuron")
    model.load_state_dict(cpu.state_dict())
    cpu_optimizer = torch.optim.Adam(cpu.parameters(), lr=0.01)
    optimizer = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01), capturable=True)
    static_x, static_y = torch.zeros(4, 8, device="neuron"), torch.zeros(4, 1, device="neuron")
    batches = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(4)]

    def cpu_step(x, y):
        loss = F.mse_loss(cpu(x), y)
        loss.backward()
        cpu_optimizer.step()
        cpu_optimizer.zero_grad(set_to_none=True)
        return loss

    # a first step outside the capture makes the optimizer's state, as CUDA graph recipes warm up
    static_x.copy_(batches[0][0]), static_y.copy_(batches[0][1])
    F.mse_loss(model(static_x), static_y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    cpu_step(*batches[0])
    graph = torch.neuron.NeuronGraph()
    with torch.neuron.graph(graph):
        static_loss = F.mse_loss(model(static_x), static_y)
        static_loss.backward()
        optimizer.step()
    for x, y in batches[1:]:
        static_x.copy_(x), static_y.copy_(y)
        graph.replay()
        torch.testing.assert_close(static_loss.cpu(), cpu_step(x, y).detach(), atol=1e-5, rtol=1e-4)
    for p, q in zip(model.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=1e-5, rtol=1e-4)


def test_compiled_graphs_are_captured_with_the_eager_ops_around_them():
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1)).to("neuron")
    model.load_state_dict(cpu.state_dict())
    compiled = torch.compile(model, backend="neuron")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    cpu_optimizer = torch.optim.SGD(cpu.parameters(), lr=0.1)
    static_x, static_y = torch.zeros(4, 8, device="neuron"), torch.zeros(4, 1, device="neuron")

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(compiled(static_x), static_y)
        loss.backward()
        optimizer.step()
        return loss

    step()  # compiles the forward and backward graphs, outside the capture
    F.mse_loss(cpu(torch.zeros(4, 8)), torch.zeros(4, 1)).backward()  # the same step on the CPU
    cpu_optimizer.step()
    cpu_optimizer.zero_grad(set_to_none=True)
    graph = torch.neuron.NeuronGraph()
    with torch.neuron.graph(graph):
        static_loss = step()
    for _ in range(3):
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        static_x.copy_(x), static_y.copy_(y)
        graph.replay()
        expected = F.mse_loss(cpu(x), y)
        expected.backward()
        cpu_optimizer.step()
        cpu_optimizer.zero_grad(set_to_none=True)
        torch.testing.assert_close(static_loss.cpu(), expected.detach(), atol=1e-5, rtol=1e-4)
    for p, q in zip(model.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=1e-5, rtol=1e-4)


def test_random_ops_draw_new_numbers_at_each_replay():
    generator = torch.Generator("neuron").manual_seed(0)
    graph = torch.neuron.NeuronGraph()
    with torch.neuron.graph(graph):
        default = torch.rand(64, device="neuron")
        own = torch.randn(64, device="neuron", generator=generator)
    draws = []
    for _ in range(2):
        graph.replay()
        draws.append((default.cpu(), own.cpu()))
    assert not torch.equal(draws[0][0], draws[1][0]) and not torch.equal(draws[0][1], draws[1][1])
    assert 0 <= draws[0][0].min() and draws[0][0].max() < 1


def test_what_would_not_replay_is_refused_and_the_capture_dropped():
    static_x = torch.ones(3, device="neuron")
    for body in (lambda: (static_x * 2).sum().item(), lambda: static_x.cpu(), lambda: static_x.to("neuron:1"),
                 lambda: static_x.nonzero(), lambda: torch.neuron.synchronize()):
        graph = torch.neuron.NeuronGraph()
        with pytest.raises(RuntimeError, match="captur"):
            with torch.neuron.graph(graph):
                static_x.mul_(3)
                body()
        assert not torch.neuron.is_current_stream_capturing()
        torch.testing.assert_close(static_x.cpu(), torch.ones(3))  # the capture changed nothing
        with pytest.raises(RuntimeError, match="without a preceding successful capture"):
            graph.replay()


def test_a_storage_freed_between_uses_reads_as_zeros_at_replay_and_a_resized_one_is_refused():
    """FSDP2's pattern: a buffer whose storage is grown, written and read, then freed (resized to 0) inside the
    step; a replay reads it as the capture did, though it is freed when replay() is called."""
    source = torch.zeros(6, device="neuron")
    full = torch.empty(6, device="neuron")
    full.untyped_storage().resize_(0)
    graph = torch.neuron.NeuronGraph()
    with torch.neuron.graph(graph):
        full.untyped_storage().resize_(24)
        full[:4].copy_(source[:4] * 2)
        out = full + 1
        full.untyped_storage().resize_(0)
    for step in range(2):
        values = torch.arange(6.0) + step
        source.copy_(values)
        graph.replay()
        torch.testing.assert_close(out.cpu(), torch.cat([values[:4] * 2, torch.zeros(2)]) + 1)
    full.untyped_storage().resize_(12)
    with pytest.raises(RuntimeError, match="held 6 elements when captured and holds 3 now"):
        graph.replay()


def test_device_checks_of_a_captured_op_fail_at_replay():
    table, static_index = torch.randn(5, 2, device="neuron"), torch.zeros(2, dtype=torch.long, device="neuron")
    graph = torch.neuron.NeuronGraph()
    with torch.neuron.graph(graph):
        rows = F.embedding(static_index, table)
    graph.replay()
    torch.testing.assert_close(rows.cpu(), table.cpu()[[0, 0]])
    static_index.copy_(torch.tensor([1, 7]))
    graph.replay()
    with pytest.raises(IndexError, match="index out of range"):
        torch.neuron.synchronize()


def test_graphed_callables_train_as_on_the_cpu():
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to("neuron")
    model.load_state_dict(cpu.state_dict())
    # torch.cuda.graphs' module path too
    model = torch.neuron.graphs.make_graphed_callables(model, (torch.randn(4, 8, device="neuron", requires_grad=True),))
    samples = (torch.randn(3, device="neuron", requires_grad=True), torch.randn(3, device="neuron"))
    product = torch.neuron.make_graphed_callables(lambda a, b: (a * b).sin(), samples)
    optimizer, cpu_optimizer = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(cpu.parameters(), lr=0.1)
    for _ in range(3):
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        x_neuron, x_cpu = x.to("neuron").requires_grad_(), x.clone().requires_grad_()
        F.mse_loss(model(x_neuron), y.to("neuron")).backward()
        F.mse_loss(cpu(x_cpu), y).backward()
        torch.testing.assert_close(x_neuron.grad.cpu(), x_cpu.grad, atol=1e-5, rtol=1e-4)
        optimizer.step(), cpu_optimizer.step()
        optimizer.zero_grad(), cpu_optimizer.zero_grad()
    for p, q in zip(model.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=1e-5, rtol=1e-4)
    a, b = torch.randn(3, requires_grad=True), torch.randn(3)
    a_neuron = a.detach().to("neuron").requires_grad_()
    product(a_neuron, b.to("neuron")).sum().backward()
    (a * b).sin().sum().backward()
    torch.testing.assert_close(a_neuron.grad.cpu(), a.grad)


def test_torch_accelerator_graph_captures_on_neuron():
    """PyTorch's device-generic graph (native/graph.cpp hands its calls to a NeuronGraph)."""
    x = torch.zeros(4, device="neuron")
    graph = torch.accelerator.Graph()
    with graph:
        assert torch.neuron.is_current_stream_capturing()
        x.add_(2)
        doubled = x * 2
    assert x.cpu().tolist() == [0.0] * 4
    graph.replay()
    graph.replay()
    assert x.cpu().tolist() == [4.0] * 4 and doubled.cpu().tolist() == [8.0] * 4
    graph.reset()
    with pytest.raises(RuntimeError, match="captur"):
        with graph:
            (x + 1).sum().item()
    assert not torch.neuron.is_current_stream_capturing()


def test_a_hugging_face_model_is_captured():
    """transformers reads masks on the host unless a graph is being captured (patches.py
    transformers_sees_neuron_graph_captures)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100)).to("neuron").eval()
    static_ids = torch.zeros(1, 8, dtype=torch.long, device="neuron")
    graph = torch.neuron.NeuronGraph()
    with torch.no_grad():
        model(static_ids)
        with torch.neuron.graph(graph):
            logits = model(static_ids, use_cache=False).logits
        for _ in range(2):
            ids = torch.randint(0, 100, (1, 8))
            static_ids.copy_(ids)
            graph.replay()
            torch.testing.assert_close(logits.cpu(), model(ids.to("neuron"), use_cache=False).logits.cpu())


def test_replays_are_named_as_graph_replays_by_the_profilers():
    from torch.profiler import ProfilerActivity, profile

    from torchneuron.profiler.collector import Collector
    from torchneuron.profiler.report import summarize, text

    static_x = torch.zeros(5, device="neuron")
    graph = torch.neuron.NeuronGraph()
    with torch.neuron.graph(graph):
        static_y = (static_x + 1) * 2
    with profile(activities=[ProfilerActivity.CPU]) as prof, Collector() as collector:
        graph.replay()
        graph.replay()
        static_y.cpu()
    names = [e.name for e in prof.events()]
    assert names.count("neuron::graph_replay") == 2 and "neuron::adaptive_flush" not in names
    report = summarize(collector, recompile_limit=10)
    assert report["replays"] == {"replays": 2, "ops": 4, "compiles": 1}  # two ops each: the add and the mul
    assert "== Captured graphs (torch.neuron.graph)" in text(report, "test")
