"""PyTorch's ModuleInfo database (`module_db`) on neuron against the CPU, with CPU fallback made an error.

OpInfo reaches ops one by one; modules take paths of their own off the CPU (LSTM's fused cells, the
inference fast paths of attention and transformer layers). Each module's first sample inputs run forward
and backward in training mode and forward under no_grad in eval mode, on the CPU and on a copy moved to
neuron; outputs, input gradients and parameter gradients must agree. A lazy module runs one forward on the
CPU before it is moved, as neuron requires. Slow (about 5 minutes on 2 cores): `pytest -m slow
tests/conformance/test_modules.py`.
"""
import copy

import pytest
import torch
from torch.testing._internal.common_modules import module_db
from torch.utils._pytree import tree_leaves, tree_map

from torchneuron.eager import fallback

# modules that draw random numbers, which differ between devices: they must run, not agree
_RANDOM = {torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d, torch.nn.AlphaDropout,
           torch.nn.FeatureAlphaDropout, torch.nn.RReLU, torch.nn.FractionalMaxPool2d, torch.nn.FractionalMaxPool3d}
_TOLERANCE = dict(atol=1e-4, rtol=1e-4, equal_nan=True)


def _to(device, value):
    return tree_map(lambda t: t.detach().to(device).requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor)
                    else t, value)


def _moved(module):
    """The module on neuron, with the tensors it holds outside parameters and buffers (FractionalMaxPool's
    samples)."""
    module.to("neuron")
    for submodule in module.modules():
        for name, value in list(vars(submodule).items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                setattr(submodule, name, value.to("neuron"))
    return module


def _floats(value) -> list:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _run(module, args, kwargs, training):
    module.train(training)
    with torch.set_grad_enabled(training):
        out = module(*args, **kwargs)
    outputs = _floats(out)
    if not training:
        return outputs, []
    loss = sum(o.float().sum() for o in outputs if o.requires_grad)
    if torch.is_tensor(loss):
        loss.backward()
    grads = [t.grad for t in _floats((args, kwargs)) if t.requires_grad and t.grad is not None]
    return outputs, grads + [p.grad for p in module.parameters() if p.grad is not None]


def _compare(got, expected, what):
    assert len(got) == len(expected), f"{what}: {len(got)} values on neuron, {len(expected)} on the CPU"
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.detach().cpu(), e.detach(), msg=lambda m: f"{what}: {m}", **_TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("info", module_db, ids=lambda info: info.module_cls.__name__)
def test_module(info):
    samples = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=True, training=True)
    for sample in list(samples)[:3]:
        if sample.forward_input is None:
            continue
        constructor, forward = sample.constructor_input, sample.forward_input
        torch.manual_seed(0)
        reference = info.module_cls(*constructor.args, **constructor.kwargs)
        if isinstance(reference, torch.nn.modules.lazy.LazyModuleMixin):
            with torch.no_grad():
                reference(*forward.args, **forward.kwargs)  # it learns its shapes
        for training in (True, False):
            cpu = copy.deepcopy(reference)
            neuron = _moved(copy.deepcopy(reference))
            try:
                expected = _run(cpu, *_to("cpu", (forward.args, forward.kwargs)), training)
            except Exception as error:
                # a sample the CPU refuses (FractionalMaxPool's float64 samples with float32 input): so must neuron
                with pytest.raises(type(error)), fallback.as_error():
                    _run(neuron, *_to("neuron", (forward.args, forward.kwargs)), training)
                continue
            with fallback.as_error():
                got = _run(neuron, *_to("neuron", (forward.args, forward.kwargs)), training)
            if info.module_cls not in _RANDOM:
                mode = "training" if training else "eval, no_grad"
                _compare(got[0], expected[0], f"{info.module_cls.__name__} outputs ({mode})")
                _compare(got[1], expected[1], f"{info.module_cls.__name__} gradients ({mode})")
