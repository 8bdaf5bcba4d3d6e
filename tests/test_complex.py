"""Complex results against the CPU: where a lowering once dropped a conjugate or an imaginary part, and signed
zeros on branch cuts."""
import math

import pytest
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


def test_conj_is_a_view_that_aliases_its_input():
    """x.conj() flags a bit, as on the CPU: writes to either tensor show in the other."""
    for device in ("cpu", "neuron"):
        x = torch.tensor([1 + 2j, 3 - 4j], device=device)
        c = x.conj()
        assert c.is_conj() and c.imag.is_neg() and not c.clone().is_conj()
        x.mul_(2)
        c[0] = 5 + 1j
        c.add_(1j)
        results = {
            "x": x, "c": c, "imag": c.imag, "clone": c.clone(), "item": c[1].item(),
            "matmul": c.view(1, 2) @ x.view(2, 1), "resolved": c.resolve_conj(), "neg": (-c.imag).clone(),
        }
        if device == "cpu":
            expected = results
        else:
            for name, value in results.items():
                assert_same(value, expected[name]) if isinstance(value, torch.Tensor) else None
                assert not isinstance(value, torch.Tensor) or value.is_conj() == expected[name].is_conj(), name
            assert results["item"] == expected["item"]


def test_view_as_real_of_a_conjugate_view_raises_as_on_the_cpu():
    c = torch.tensor([1 + 2j], device="neuron").conj()
    try:
        torch.view_as_real(c)
    except RuntimeError as error:
        assert "unresolved conjugated tensors" in str(error)
    else:
        raise AssertionError("view_as_real accepted a conjugate view")


def test_gradient_through_conj_views():
    x, y = _complex(5), _complex(5)
    grads = []
    for device in ("cpu", "neuron"):
        a = x.detach().to(device).requires_grad_()
        (a.conj() * y.to(device)).imag.sum().backward()
        grads.append(a.grad)
    assert_same(grads[1], grads[0])


def _chalf(*shape):
    return _complex(*shape).to(torch.complex32)


def test_complex32_rounds_each_part_to_float16_as_the_cpu_does():
    x, y = _chalf(6), _chalf(6)
    for result in (lambda a, b: a * b, lambda a, b: a + b * 3, lambda a, b: a - b.conj()):
        assert_same(result(x.to("neuron"), y.to("neuron")), result(x, y), rtol=0, atol=0)
    half = torch.randn(4, dtype=torch.float16)
    assert_same(half.to("neuron") + (1 - 2j), half + (1 - 2j), rtol=0, atol=0)
    assert_same(torch.complex(half.to("neuron"), half.to("neuron")), torch.complex(half, half))
    assert_same(x.to("neuron").to(torch.complex64), x.to(torch.complex64))
    assert_same(torch.ones(3, device="neuron").to(torch.complex32), torch.ones(3).to(torch.complex32))


def test_complex32_is_float16_pairs_in_memory():
    x = _chalf(5)
    on_neuron = x.to("neuron")
    for dtype in (torch.float16, torch.int16, torch.float32):
        assert_same(on_neuron.view(dtype), x.view(dtype))
    for tensor in (x, on_neuron):
        torch.view_as_real(tensor)[2, 1] = 7.0
    assert_same(on_neuron, x)
    assert on_neuron[2].item() == complex(x[2].real.item(), 7.0)
    assert_same(torch.view_as_complex(torch.view_as_real(on_neuron)), torch.view_as_complex(torch.view_as_real(x)))


def test_complex32_results_of_compiled_and_adaptive_programs_keep_their_dtype():
    x = _chalf(5)

    def step(a):
        return (a * a + 1) * 3, torch.view_as_real(a * a)

    expected = step(x)
    with torch.neuron.adaptive_eager(True):
        queued = step(x.to("neuron"))
    compiled = torch.compile(step, backend="neuron")(x.to("neuron"))
    for got in (queued, compiled):
        for g, e in zip(got, expected):
            assert_same(g, e)


def test_complex32_results_of_data_dependent_ops_keep_their_dtype():
    x, mask = _chalf(6), torch.tensor([True, False, True, True, False, True])
    assert_same(torch.masked_select(x.to("neuron"), mask.to("neuron")), torch.masked_select(x, mask))
    assert_same(torch.masked_select(x.to("neuron").to(torch.complex64), mask.to("neuron")),
                torch.masked_select(x.to(torch.complex64), mask))


_BRANCH_CUTS = {"sqrt": torch.sqrt, "asin": torch.asin, "acos": torch.acos, "atan": torch.atan,
                "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh}


@pytest.mark.parametrize("f", list(_BRANCH_CUTS.values()), ids=list(_BRANCH_CUTS))
def test_signed_zeros_pick_the_side_of_a_branch_cut_as_the_cpu(f):
    """C99 (and the CPU) let the sign of a zero part choose the side of a branch cut: sqrt(-1 - 0j) = -1j,
    asin(2.5 - 0j) has a negative imaginary part. XLA's complex functions ignored the sign."""
    parts = [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.5, -2.5, 1e30]
    z = torch.complex(torch.tensor(parts).repeat_interleave(len(parts)), torch.tensor(parts).repeat(len(parts)))
    got, expected = f(z.to("neuron")).cpu(), f(z)
    torch.testing.assert_close(got, expected)
    assert torch.equal(got.imag.signbit() | (got.imag == 0), expected.imag.signbit() | (expected.imag == 0))
    assert torch.equal(got.real.signbit() | (got.real == 0), expected.real.signbit() | (expected.real == 0))


def test_abs_of_an_infinite_part_beside_nan_is_inf():
    z = torch.tensor([complex(float("inf"), float("nan")), complex(float("nan"), -float("inf")), complex(3, 4)])
    assert torch.equal(torch.abs(z.to("neuron")).cpu(), torch.abs(z))


@pytest.mark.parametrize("exponent", [None, 2.0, 0.5, 0, -1.0, -2, 1j, 0.5 + 1j])
def test_powers_of_complex_zero_are_the_cpus(exponent):
    """exp(y log 0) is nan: 0 ** y was nan where the CPU gives 0 (Re(y) > 0) or inf + nan j (Re(y) < 0); a tensor y
    with Re(y) = 0 gives nan there, a number 0 gives 1."""
    z = torch.tensor([0j, -0j, complex(0, -0.0), complex(-0.0, -0.0), 1 + 1j] * 5)
    y = torch.tensor([2, 0.5 + 1j, -1 + 1j, 1j, 0j]).repeat_interleave(5) if exponent is None else exponent
    on_neuron = y.to("neuron") if exponent is None else y
    torch.testing.assert_close((z.to("neuron") ** on_neuron).cpu(), z ** y, equal_nan=True)


@pytest.mark.parametrize("f", [torch.atanh, torch.atan, torch.log1p, torch.sinh, torch.cosh])
def test_complex_functions_next_to_their_singularities(f):
    """Within 1e-19 of atanh's singularity at 1 (atan's at i, log1p's at -1) |1 - z|^2 underflowed and the result
    was infinite (atanh(1 + 1e-20j) = 23.37 + 0.785j); sinh and cosh of a tiny real part lost it (sinh(1e-20 + 1j)
    had a real part of 0, not 5.4e-21)."""
    tiny = [1e-20, -1e-20, 1e-30, 3e-10]
    points = {torch.atanh: [complex(s, t) for s in (1, -1) for t in tiny],
              torch.atan: [complex(t, s) for s in (1, -1) for t in tiny],
              torch.log1p: [complex(-1, t) for t in tiny] + [complex(-1 + 1e-7, 1e-20)],
              torch.sinh: [complex(t, y) for y in (1, 0.5, -2.5) for t in tiny],
              torch.cosh: [complex(t, y) for y in (1, 0.5, -2.5) for t in tiny]}[f]
    z = torch.tensor(points, dtype=torch.complex64)
    torch.testing.assert_close(f(z.to("neuron")).cpu(), f(z.to(torch.complex128)).to(torch.complex64))


def test_complex_rsqrt_is_the_reciprocal_of_sqrt():
    z = torch.tensor([-1 + 0j, complex(-1, -0.0), -4 + 0j, 1j, 2 + 0j], dtype=torch.complex64)
    assert torch.equal(torch.rsqrt(z.to("neuron")).cpu(), torch.rsqrt(z))
