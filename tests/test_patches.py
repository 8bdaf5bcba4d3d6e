"""The patches of torchneuron/patches.py that reshape PyTorch behaviour, one test each."""
import io

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


def test_load_with_map_location_neuron():
    buffer = io.BytesIO()
    torch.save({"x": torch.arange(3.0), "nested": [torch.ones(2)]}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location="neuron")
    assert loaded["x"].device.type == "neuron" and loaded["nested"][0].device.type == "neuron"
    torch.testing.assert_close(loaded["x"].cpu(), torch.arange(3.0))
