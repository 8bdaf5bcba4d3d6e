"""Quantization-aware training: fake quantization on neuron equals the CPU's bit for bit."""
import copy

import pytest
import torch

from conftest import assert_same
from torchneuron.eager import fallback

aten = torch.ops.aten
# values on the grid's half steps too, where rounding (half to even) decides
X = torch.cat([torch.randn(200, generator=torch.Generator().manual_seed(0)) * 3, torch.arange(-20, 20) * 0.05 + 0.025])


def _on(device, args):
    return [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]


def _both(op, *args):
    for got, expected in zip(op(*_on("neuron", args)), op(*args)):
        assert_same(got, expected, atol=0, rtol=0)


def test_per_tensor():
    _both(aten.fake_quantize_per_tensor_affine_cachemask, X, 0.1, 2, 0, 15)
    assert_same(torch.fake_quantize_per_tensor_affine(X.to("neuron"), 0.05, 3, -128, 127),
                torch.fake_quantize_per_tensor_affine(X, 0.05, 3, -128, 127), atol=0, rtol=0)


@pytest.mark.parametrize("enabled", [1, 0])
def test_per_tensor_with_tensor_qparams(enabled):
    _both(aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams, X, torch.tensor([0.07]),
          torch.tensor([5], dtype=torch.int32), torch.tensor([enabled]), -10, 20)


@pytest.mark.parametrize("zero_point", [torch.tensor([0, 1, -2, 3], dtype=torch.int32),
                                        torch.tensor([0.0, 1.5, -2.0, 3.0])])
def test_per_channel(zero_point):
    _both(aten.fake_quantize_per_channel_affine_cachemask, X[:24].reshape(4, 6) * 2,
          torch.tensor([0.1, 0.2, 0.05, 0.3]), zero_point, 0, -8, 7)


def test_bad_arguments_raise_the_cpus_errors():
    x = X[:4].reshape(2, 2).to("neuron")
    scale = torch.tensor([0.1, 0.2], device="neuron")
    with pytest.raises(RuntimeError, match="`zero_point` must be between `quant_min` and `quant_max`"):
        aten.fake_quantize_per_tensor_affine_cachemask(x, 0.1, -2, 0, 15)
    with pytest.raises(RuntimeError, match="Scale must be Float or BFloat16, found Double"):
        aten.fake_quantize_per_channel_affine_cachemask(x, scale.double(), torch.zeros(2, dtype=torch.int32,
                                                                                       device="neuron"), 0, 0, 15)
    # a zero point out of range in a tensor is a value: raised at the next synchronisation
    with pytest.raises(RuntimeError, match="`zero_point` must be between `quant_min` and `quant_max`"):
        zero_point = torch.tensor([0, 40], dtype=torch.int32, device="neuron")
        aten.fake_quantize_per_channel_affine_cachemask(x, scale, zero_point, 0, 0, 15)
        torch.neuron.synchronize()


def _fused_observer(kind: str):
    import torch.ao.quantization as quantization

    if kind == "per-channel symmetric":  # the default QAT configuration's weights
        return quantization.default_fused_per_channel_wt_fake_quant()
    scheme = torch.per_tensor_symmetric if kind == "per-tensor symmetric" else torch.per_tensor_affine
    return quantization.FusedMovingAvgObsFakeQuantize(quant_min=0, quant_max=255, dtype=torch.quint8, qscheme=scheme)


def _observe(device: str, kind: str):
    """Outputs, input gradients and final state of a fused observer over steps that turn its observer and its
    fake quantization off and on."""
    torch.manual_seed(0)
    observer = _fused_observer(kind).to(device)
    seen = []
    for step in range(4):
        x = (torch.randn(6, 5, 3) * (step + 1) + 0.3 * step).to(device).requires_grad_()
        if step == 2:
            observer.disable_observer()
        if step == 3:
            observer.enable_observer()
            observer.disable_fake_quant()
        y = observer(x)
        y.sum().backward()
        seen += [y.detach(), x.grad]
    return seen, observer.state_dict()


@pytest.mark.parametrize("kind", ["per-tensor affine", "per-tensor symmetric", "per-channel symmetric"])
def test_the_fused_moving_average_observer_equals_the_cpus_bit_for_bit(kind):
    """torch.ao's fused observer (moving min/max, quantization parameters chosen as quant_utils chooses them in
    float and double arithmetic, fake quantization) on the device; the per-channel one sizes its state at its
    first call, as the CPU kernel does."""
    with fallback.as_error():
        got, got_state = _observe("neuron", kind)
    expected, expected_state = _observe("cpu", kind)
    for g, e in zip(got, expected):
        assert_same(g, e, atol=0, rtol=0)
    assert got_state.keys() == expected_state.keys()
    for name, e in expected_state.items():
        assert_same(got_state[name], e, atol=0, rtol=0)


def test_a_qat_module_trains_as_on_the_cpu():
    """torch.ao's default QAT configuration: fake-quantized weights and activations, on the device."""
    import torch.ao.quantization as quantization

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU())
    model.qconfig = quantization.get_default_qat_qconfig("fbgemm")
    cpu = quantization.prepare_qat(model.train())
    neuron = copy.deepcopy(cpu).to("neuron")
    x = torch.randn(8, 6)
    for _ in range(2):
        expected = cpu(x)
        with fallback.as_error():
            got = neuron(x.to("neuron"))
        assert_same(got.detach(), expected.detach(), atol=1e-6, rtol=1e-5)
        expected.sum().backward()
        got.sum().backward()
    assert_same(neuron[0].weight.grad, cpu[0].weight.grad, atol=1e-5, rtol=1e-5)
