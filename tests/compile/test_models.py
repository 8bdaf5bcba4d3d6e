"""MLP, CNN with BatchNorm and a transformer block compiled with backend="neuron": inference and training
match eager neuron and the CPU."""
import copy

import pytest
import torch

import torchneuron.compile as neuron_compile

from .models import CNN, MLP, Block

CASES = {
    "mlp": (MLP, (4, 8)),
    "cnn": (CNN, (2, 3, 8, 8)),
    # dropout=0: masks cannot match across devices; test_random covers compiled dropout
    "block": (lambda: Block(dropout=0.0), (2, 5, 16)),
}


def _close(a, b):
    torch.testing.assert_close(a.cpu(), b.cpu(), atol=1e-5, rtol=1e-4)


def _three(name):
    torch.manual_seed(0)
    make, shape = CASES[name]
    cpu = make()
    return cpu, copy.deepcopy(cpu).to("neuron"), copy.deepcopy(cpu).to("neuron"), torch.randn(shape)


@pytest.mark.parametrize("name", CASES)
def test_inference(name):
    cpu, eager, compiled, x = _three(name)
    for m in (cpu, eager, compiled):
        m.eval()
    fast = torch.compile(compiled, backend="neuron")
    with torch.no_grad():
        for _ in range(2):  # the second call replays the cached executable
            out = fast(x.to("neuron"))
            _close(out, eager(x.to("neuron")))
            _close(out, cpu(x))
    assert neuron_compile.report()["eager_ops"] == {}


@pytest.mark.parametrize("name", CASES)
def test_training(name):
    cpu, eager, compiled, x = _three(name)
    fast = torch.compile(compiled, backend="neuron")
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (cpu, eager, compiled)]
    for _ in range(2):
        losses, input_grads = [], []
        for model, step, opt in zip((cpu, eager, compiled), (cpu, eager, fast), optimizers):
            inp = (x if model is cpu else x.to("neuron")).detach().requires_grad_()
            loss = step(inp).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss)
            input_grads.append(inp.grad)
        for values in (losses, input_grads):
            _close(values[2], values[0])
            _close(values[2], values[1])
    for p, q in zip(compiled.parameters(), cpu.parameters()):
        _close(p, q)
    for b, c in zip(compiled.buffers(), cpu.buffers()):  # BatchNorm running stats
        _close(b, c)
