"""Targeted patches for gaps in PyTorch's support of Python PrivateUse1 backends, one function each.

Each names the upstream gap it covers; tests/test_patches.py checks each one.
"""
import functools
import importlib

import torch

from ..runtime.tensor import NeuronTensor


def foreach_tensor_type() -> None:
    """Optimizers and clip_grad_norm_ take their foreach/fused paths only for tensors whose exact type is in
    `_foreach_supported_types` (torch.Tensor, Parameter); neuron tensors are a subclass, so they would always
    take the per-tensor loop, and `foreach=True` would raise."""
    # by module path: this runs while `import torch` is still initialising torch.optim
    for name in ("torch.optim.optimizer", "torch.utils._foreach_utils"):
        allowlist = importlib.import_module(name)._foreach_supported_types
        if NeuronTensor not in allowlist:
            allowlist.append(NeuronTensor)


def _holds_neuron(module) -> bool:
    return any(t.device.type == "neuron" for t in module.parameters())


def _swapping(method, targets_neuron):
    @functools.wraps(method)
    def convert(self, *args, **kwargs):
        if not (targets_neuron(*args, **kwargs) or _holds_neuron(self)):
            return method(self, *args, **kwargs)
        previous = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            return method(self, *args, **kwargs)
        finally:
            torch.__future__.set_swap_module_params_on_conversion(previous)

    return convert


def _to_neuron(*args, **kwargs) -> bool:
    device = torch._C._nn._parse_to(*args, **kwargs)[0]
    return device is not None and device.type == "neuron"


def tied_parameters_on_conversion() -> None:
    """`Module.to` keeps a Parameter object (`param.data = new`) only when the old and new tensors have
    compatible TensorImpls; between the CPU and a wrapper-subclass device it makes a new Parameter per
    module instead, which unties shared weights (GPT-2's lm_head and wte). PyTorch's swap_tensors path
    keeps each object; turn it on for conversions to and from neuron only."""
    module = torch.nn.Module
    module.to = _swapping(module.to, _to_neuron)
    module.cpu = _swapping(module.cpu, lambda *a, **k: False)
    module.neuron = _swapping(module.neuron, lambda *a, **k: True)


def _neuron_location(map_location):
    return isinstance(map_location, (str, torch.device)) and torch.device(map_location).type == "neuron"


def load_onto_neuron() -> None:
    """`torch.load(map_location="neuron")` restores each storage as an UntypedStorage on the device, which a
    backend without PyTorch storages cannot hold (the process crashes); load onto the CPU and move the tensors."""
    original = torch.load

    @functools.wraps(original)
    def load(f, map_location=None, *args, **kwargs):
        if not _neuron_location(map_location):
            return original(f, map_location, *args, **kwargs)
        loaded = original(f, "cpu", *args, **kwargs)
        device = torch.device(map_location)
        return torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), loaded)

    torch.load = load


def apply() -> None:
    foreach_tensor_type()
    tied_parameters_on_conversion()
    load_onto_neuron()
