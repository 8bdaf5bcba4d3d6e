"""Complex results against the CPU where a lowering once dropped a conjugate or an imaginary part."""
import math

import torch

from conftest import assert_same


def _complex(*shape):
    return torch.randn(*shape, dtype=torch.complex64)


def test_vdot_conjugates_its_first_argument():
    a, b = _complex(7), _complex(7)
    assert_same(torch.vdot(a.to("neuron"), b.to("neuron")), torch.vdot(a, b))
    assert_same(torch.linalg.vecdot(a.to("neuron"), b.to("neuron")), torch.linalg.vecdot(a, b))
    assert_same(torch.dot(a.to("neuron"), b.to("neuron")), torch.dot(a, b))


def test_complex_logsumexp_keeps_the_imaginary_part():
    x = _complex(4, 6)
    for dim, keepdim in ((1, False), (0, True), ((0, 1), False)):
        assert_same(torch.logsumexp(x.to("neuron"), dim, keepdim), torch.logsumexp(x, dim, keepdim))


def test_complex_logcumsumexp_accumulates_phase_as_the_cpu_does():
    # the CPU's running sum carries the imaginary part past (-pi, pi]
    torch.manual_seed(0)
    x = _complex(3, 9) * 3
    expected = torch.logcumsumexp(x, 1)
    assert expected.imag.abs().max() > math.pi
    assert_same(torch.logcumsumexp(x.to("neuron"), 1), expected)
