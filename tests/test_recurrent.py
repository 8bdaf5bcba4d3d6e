"""LSTM and GRU layers: PyTorch runs them on the fused cell ops on every device but the CPU, and those have
no CPU kernel, so before ops/recurrent.py their CPU fallback failed ("Could not run
'aten::_thnn_fused_lstm_cell' with arguments from the 'CPU' backend")."""
import pytest
import torch

import torchneuron
from conftest import assert_same


def _pair(cls, **options):
    torch.manual_seed(0)
    cpu = cls(6, 8, num_layers=2, batch_first=True, bidirectional=True, **options)
    neuron = cls(6, 8, num_layers=2, batch_first=True, bidirectional=True, **options).to("neuron")
    neuron.load_state_dict(cpu.state_dict())
    return cpu, neuron


def _run(model, x, dtype):
    x = x.to(dtype).detach().requires_grad_()
    out, hidden = model.to(dtype)(x)
    last = hidden[1] if isinstance(model, torch.nn.LSTM) else hidden  # the cell state's gradient path too
    (out.float().sin().sum() + last.float().pow(2).sum()).backward()
    return [out, last, x.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU])
@pytest.mark.parametrize("bias", [True, False])
def test_layers_forward_and_backward_match_the_cpu(cls, bias):
    torchneuron.eager.fallback.reset()
    cpu, neuron = _pair(cls, bias=bias)
    x = torch.randn(3, 5, 6)
    for got, expected in zip(_run(neuron, x.to("neuron"), torch.float32), _run(cpu, x, torch.float32)):
        assert_same(got, expected, atol=1e-5, rtol=1e-5)
    assert torchneuron.fallback_report() == {}


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU])
def test_bfloat16_layers_are_near_the_float32_cpu(cls):
    cpu, neuron = _pair(cls)
    x = torch.randn(3, 5, 6)
    for got, expected in zip(_run(neuron, x.to("neuron"), torch.bfloat16), _run(cpu, x, torch.float32)):
        assert got.dtype == torch.bfloat16
        assert_same(got.float(), expected, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("cls", [torch.nn.LSTMCell, torch.nn.GRUCell])
def test_cells_double_backward_and_a_single_output_gradient(cls):
    torch.manual_seed(0)
    cpu = cls(4, 6)
    neuron = cls(4, 6).to("neuron")
    neuron.load_state_dict(cpu.state_dict())
    x = torch.randn(2, 4)
    results = {}
    for device, model in (("cpu", cpu), ("neuron", neuron)):
        leaf = x.to(device).detach().requires_grad_()
        out = model(leaf)
        first = out[1] if cls is torch.nn.LSTMCell else out  # the LSTM's cell state alone: no gradient of hy
        fused, = torch.autograd.grad(first.pow(2).sum(), leaf, retain_graph=True)
        differentiable, = torch.autograd.grad(first.pow(2).sum(), leaf, create_graph=True)
        differentiable.sum().backward()
        results[device] = (fused, differentiable, leaf.grad)
    for got, expected in zip(results["neuron"], results["cpu"]):
        assert_same(got, expected, atol=1e-5, rtol=1e-5)


def test_packed_sequences_through_an_lstm_match_the_cpu():
    """pack_padded_sequence keeps `batch_sizes` on the host, as CUDA's does (the CPU fallback moved them to the
    device and PackedSequence refused them); the packed LSTM and pad_packed_sequence read them there."""
    cpu, neuron = _pair(torch.nn.LSTM)
    x, lengths = torch.randn(3, 5, 6), torch.tensor([2, 5, 3])
    results = {}
    for device, model in (("cpu", cpu), ("neuron", neuron)):
        leaf = x.to(device).detach().requires_grad_()
        packed = torch.nn.utils.rnn.pack_padded_sequence(leaf, lengths, batch_first=True, enforce_sorted=False)
        assert packed.batch_sizes.device.type == "cpu"
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(model(packed)[0], batch_first=True)
        out.pow(2).sum().backward()
        results[device] = (packed.data, out, leaf.grad, model.weight_hh_l0.grad)
    for got, expected in zip(results["neuron"], results["cpu"]):
        assert_same(got, expected, atol=1e-5, rtol=1e-5)
