"""The patches of torchneuron/patches.py that reshape PyTorch behaviour, one test each."""
import io
import os
import subprocess
import sys

import pytest
import torch

from torchneuron import NeuronTensor


def test_foreach_allowlists_take_neuron_tensors():
    from torch.optim.optimizer import _foreach_supported_types as optimizer_types
    from torch.utils._foreach_utils import _foreach_supported_types as utils_types

    assert NeuronTensor in optimizer_types and NeuronTensor in utils_types


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(4, 3)
        self.head = torch.nn.Linear(3, 4, bias=False)
        self.head.weight = self.embed.weight


def test_tied_parameters_stay_tied_across_devices():
    model = _Tied()
    parameter = model.embed.weight
    for move in (lambda m: m.to("neuron"), lambda m: m.cpu(), lambda m: m.neuron(), lambda m: m.to("cpu")):
        move(model)
        assert model.head.weight is model.embed.weight is parameter
    assert not torch.__future__.get_swap_module_params_on_conversion()


def test_attributes_set_on_parameters_survive_moves():
    """As `param.data = new` keeps them on CUDA: vLLM keeps its weight loaders there."""
    model = torch.nn.Linear(3, 4)
    model.weight.weight_loader = loader = object()
    for move in (lambda m: m.to("neuron"), lambda m: m.cpu(), lambda m: m.neuron(), lambda m: m.to(torch.float64)):
        move(model)
        assert model.weight.weight_loader is loader


class _TiedScripted(_Tied):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(3)

    def forward(self, ids):
        return self.head(self.norm(self.embed(ids)))


def test_script_modules_load_onto_neuron_as_saved_or_mapped():
    model = torch.jit.script(_TiedScripted().eval())
    ids = torch.tensor([0, 3, 1])
    expected = model(ids)
    saved_on_the_cpu, saved_on_neuron_1 = io.BytesIO(), io.BytesIO()
    torch.jit.save(model, saved_on_the_cpu)
    torch.jit.save(torch.jit.script(_TiedScripted().eval()).to("neuron:1"), saved_on_neuron_1)
    cases = ((saved_on_the_cpu, "neuron", "neuron:0"), (saved_on_the_cpu, "neuron:1", "neuron:1"),
             (saved_on_neuron_1, None, "neuron:1"))
    for archive, map_location, device in cases:
        archive.seek(0)
        loaded = torch.jit.load(archive, map_location=map_location)
        tensors = [loaded.embed.weight, loaded.head.weight, loaded.norm.running_var]
        assert all(t.device == torch.device(device) for t in tensors)
        assert loaded.head.weight is loaded.embed.weight and loaded.embed.weight.is_leaf
        assert not loaded.norm.running_var.requires_grad
        if archive is saved_on_the_cpu:
            out = loaded(ids.to(device))
            torch.testing.assert_close(out.detach().cpu(), expected)
            out.sum().backward()
            assert loaded.embed.weight.grad.device == torch.device(device)


def test_traced_modules_run_on_neuron():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU()).to("neuron")
    x = torch.randn(2, 4, device="neuron")
    traced = torch.jit.trace(model, x)
    y = torch.randn(2, 4, device="neuron")
    torch.testing.assert_close(traced(y).cpu(), model(y).cpu())


TORCH_COMPILE_WITHOUT_THE_NEURON_BACKEND = """
import sys, torch
import torchneuron
from torch.nn.attention.flex_attention import flex_attention
x = torch.arange(3.0).to("neuron")
results = [torch.compile(lambda t: t * 2 + 1, backend=backend)(x).cpu().tolist()
           for backend in ("inductor", "aot_eager", "eager")]
q, k, v = (torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
out = flex_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), score_mod=lambda s, b, h, m, n: s + (m - n) / 8)
expected = flex_attention(q, k, v, score_mod=lambda s, b, h, m, n: s + (m - n) / 8)
torch.testing.assert_close(out.cpu(), expected)
linear = torch.nn.Linear(3, 2).to("neuron")
exported = torch.export.export(linear, (x[None],), strict=True).module()
torch.testing.assert_close(exported(x[None]).cpu(), linear(x[None]).cpu())
print(results)
"""


def test_torch_compile_with_any_backend_traces_neuron_tensors_in_a_fresh_process():
    """Dynamo wraps neuron tensors as tensors once the compile patches are in: `torch.compile` and
    `torch.export.export` apply them, so a process that never imported the neuron backend compiles with
    Inductor, "eager" or "aot_eager", runs eager flex_attention (which compiles its op with "eager") and
    exports strictly. Before, each raised ("Unsupported method call", "UserDefinedObjectVariable")."""
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", TORCH_COMPILE_WITHOUT_THE_NEURON_BACKEND], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == str([[1.0, 3.0, 5.0]] * 3)


def test_ctc_loss_takes_lengths_as_host_tensors():
    """The usual call: lengths as CPU tensors with device log-probabilities (the composite kernel's path for
    tensor subclasses failed: "Expected all tensors to be on the same device")."""
    log_probs = torch.randn(10, 2, 5).log_softmax(-1)
    targets = torch.randint(1, 5, (2, 4))
    lengths = (torch.tensor([10, 9]), torch.tensor([4, 3]))
    results = {}
    for device in ("cpu", "neuron"):
        leaf = log_probs.to(device).detach().requires_grad_()
        loss = torch.nn.CTCLoss()(leaf, targets.to(device), *lengths)
        loss.backward()
        results[device] = (loss, leaf.grad)
    for got, expected in zip(results["neuron"], results["cpu"]):
        assert got.device.type == "neuron"
        torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)
    try:
        torch.nn.functional.ctc_loss(log_probs.to("neuron"), targets.to("neuron"), lengths[0].float(), lengths[1])
    except RuntimeError as error:
        assert str(error) == "input_lengths must be integral"
    else:
        raise AssertionError("float lengths were accepted")


def test_lazy_modules_move_once_initialized_and_are_refused_before():
    """An uninitialized parameter cannot become a neuron tensor of its class: moving a lazy module before its
    first forward is refused with the remedy (before, it became an empty ordinary parameter and the first
    forward failed on its size)."""
    import pytest

    model = torch.nn.Sequential(torch.nn.LazyLinear(3), torch.nn.LazyBatchNorm1d())
    with pytest.raises(NotImplementedError, match="run one forward on the CPU first"):
        model.to("neuron")
    x = torch.randn(4, 5)
    with torch.no_grad():
        model(x)
    model.to("neuron").eval()
    with torch.no_grad():
        got = model(x.to("neuron")).cpu()
        torch.testing.assert_close(got, model.cpu()(x))


def test_modules_whose_parameters_a_live_graph_holds_still_move():
    """Moving swaps each parameter in place, which PyTorch refuses for a tensor a live autograd graph holds:
    the old nn.utils.weight_norm keeps its computed weight (and that graph) on the module, and a loss may not
    be backpropagated yet. Those parameters move as new objects instead (before: "Couldn't swap")."""
    torch.manual_seed(0)
    cpu = torch.nn.utils.weight_norm(torch.nn.Linear(4, 3))
    neuron = torch.nn.utils.weight_norm(torch.nn.Linear(4, 3)).to("neuron")
    neuron.load_state_dict(cpu.state_dict())
    x = torch.randn(2, 4)
    cpu(x).pow(2).sum().backward()
    neuron(x.to("neuron")).pow(2).sum().backward()
    for expected, got in zip(cpu.parameters(), neuron.parameters()):
        assert got.device.type == "neuron"
        torch.testing.assert_close(got.grad.cpu(), expected.grad, atol=1e-5, rtol=1e-5)
    model = torch.nn.Linear(3, 3).to("neuron")
    pending_loss = model(torch.randn(2, 3, device="neuron")).sum()
    assert model.cpu().weight.device.type == "cpu" and pending_loss.requires_grad


def test_parameter_data_moves_between_the_cpu_and_neuron_in_place():
    """`param.data = tensor` across the CPU and neuron (FSDP1 moves its parameters so) keeps the object, its
    Parameter class, requires_grad and attributes, as between the CPU and CUDA."""
    from torch.utils._mode_utils import no_dispatch

    linear = torch.nn.Linear(3, 2)
    weight = linear.weight
    weight.marked = True
    for parameter in linear.parameters():
        parameter.data = parameter.data.to("neuron")
    assert linear.weight is weight and weight.device.type == "neuron" and weight.marked
    assert isinstance(weight, torch.nn.Parameter) and weight.requires_grad
    linear(torch.ones(1, 3, device="neuron")).sum().backward()
    torch.testing.assert_close(weight.grad.cpu(), torch.ones(2, 3))
    weight.data = torch.zeros(2, 3)
    assert weight.device.type == "cpu" and isinstance(weight, torch.nn.Parameter) and weight.marked
    on_neuron = torch.ones(4, device="neuron")
    on_neuron.data = torch.zeros(4, device="neuron")  # same device: PyTorch's own set_data
    assert on_neuron.cpu().tolist() == [0.0] * 4
    viewed = torch.ones(4, device="neuron")
    view = viewed[:2]
    with pytest.raises(NotImplementedError, match="held by others"):
        viewed.data = torch.zeros(4)
    assert view.device.type == "neuron"
    with no_dispatch():  # FSDP records its streams with Python dispatch off
        on_neuron.record_stream(torch.neuron.current_stream())


def test_checkpoint_staging_copies_neuron_tensors_to_the_host_with_their_attributes():
    """Distributed checkpoint's async staging (StateDictStager) copies each tensor to host memory with its Python
    attributes: views of one neuron storage share one host storage, user attributes come along, the neuron
    tensor's own view of its device storage does not (its deep copy failed: "cannot pickle 'PyCapsule'")."""
    from torch.distributed.checkpoint._state_dict_stager import StateDictStager

    base = torch.arange(12.0).to("neuron")
    view = base.view(3, 4)[:, 1:]
    view.note = "kept"
    staged = StateDictStager(pin_memory=False, share_memory=False).stage({"view": view, "base": base, "step": 3})
    assert staged["view"].device.type == "cpu" and staged["view"].__dict__ == {"note": "kept"}
    assert torch.equal(staged["view"], torch.arange(12.0).view(3, 4)[:, 1:]) and staged["step"] == 3
    assert staged["view"].untyped_storage().data_ptr() == staged["base"].untyped_storage().data_ptr()
