"""No silent wrong answers: results keep the CPU's dtype whatever ran before, and input the CPU rejects
raises the CPU's exception type on neuron (value checks at the next synchronisation, as on CUDA)."""
import pytest
import torch


def test_python_scalar_type_decides_the_result_dtype_not_a_cached_executable():
    """1, 1.0, True and 1+0j are equal and hash alike; each promotes differently."""
    for device in ("cpu", "neuron"):
        u = torch.tensor((0, 1), dtype=torch.uint8, device=device)
        b = torch.tensor((False, True), device=device)
        results = [u + (1 + 0j), u + 1, u + 1.0, u + True, b + True, b + 1, b.add(1.0)]
        if device == "cpu":
            expected = results
    assert [r.dtype for r in results] == [e.dtype for e in expected]
    for r, e in zip(results, expected):
        torch.testing.assert_close(r.cpu(), e)


def test_the_default_dtype_decides_the_result_dtype_not_a_cached_executable():
    u = torch.tensor((0, 1), dtype=torch.uint8, device="neuron")
    ops = [lambda: u + 5.5, lambda: u / u, lambda: torch.sqrt(u), lambda: torch.arange(3.0, device="neuron")]
    assert [op().dtype for op in ops] == [torch.float32] * 4
    torch.set_default_dtype(torch.float64)
    try:
        assert [op().dtype for op in ops] == [torch.float64] * 4
        assert (u + 5.5).cpu().tolist() == [5.5, 6.5]
    finally:
        torch.set_default_dtype(torch.float32)
    assert [op().dtype for op in ops] == [torch.float32] * 4
