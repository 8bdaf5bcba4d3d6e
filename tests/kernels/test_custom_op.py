"""torchneuron.kernels.custom_op: a kernel (and its backward kernel) as a PyTorch op in eager, adaptive eager,
torch.compile (one node of the program, no graph break) and autograd, on neuron and on the CPU."""
import pytest
import torch

import torchneuron.kernels as nk
from torchneuron import compile as neuron_compile
from torchneuron.eager import adaptive, fallback


@nk.kernel
def softmax_kernel(x: torch.Tensor) -> torch.Tensor:
    out = nk.ndarray(x.shape, x.dtype, buffer=nk.hbm)
    rows = nk.ds(nk.program_id(0) * 128, 128)
    t = nk.load(x[rows, :], dtype=nk.float32)
    e = nk.exp(t - nk.max(t))
    nk.store(out[rows, :], e / nk.sum(e))
    return out


@nk.kernel
def softmax_backward_kernel(x: torch.Tensor, y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    dx = nk.ndarray(x.shape, x.dtype, buffer=nk.hbm)
    rows = nk.ds(nk.program_id(0) * 128, 128)
    p = nk.load(y[rows, :], dtype=nk.float32)
    g = nk.load(dy[rows, :], dtype=nk.float32)
    nk.store(dx[rows, :], p * (g - nk.sum(p * g)))
    return dx


def rows_grid(x, *rest):
    return (-(-x.shape[0] // 128),)


softmax = nk.custom_op("nk_test::softmax", softmax_kernel, grid=rows_grid, backward=softmax_backward_kernel,
                       backward_grid=rows_grid)


def _reference(x, weight):
    x = x.detach().cpu().requires_grad_()
    (torch.softmax(x.float(), -1).to(x.dtype) * weight).sum().backward()
    return torch.softmax(x.float(), -1).to(x.dtype), x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["eager", "adaptive", "compile"])
def test_kernel_op_trains_as_the_cpu_reference(mode, dtype):
    x, weight = torch.randn(256, 64, dtype=dtype), torch.randn(256, 64, dtype=dtype)
    expected, expected_grad = _reference(x, weight)
    xn = x.to("neuron").requires_grad_()
    weight_n = weight.to("neuron")
    fn = (lambda a: (softmax(a) * weight_n).sum())
    if mode == "compile":
        torch._dynamo.reset()
        neuron_compile.reset()
        fn = torch.compile(fn, backend="neuron")
    # work queued before (this test's transfers, an earlier test's ops) runs now, not when the mode is set, where
    # it would count: a queue an earlier process or test stored runs fused at its first sighting
    torch.neuron.synchronize()
    fused_before = adaptive.stats()["ops_fused"]
    with fallback.as_error(), torch.neuron.adaptive_eager(mode == "adaptive"):
        # adaptive: queued once its executables have run, fused from the queue's second sighting
        for _ in range(3 if mode == "adaptive" else 1):
            xn.grad = None
            fn(xn).backward()
            y = softmax(xn.detach())
    tol = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(y.cpu(), expected, **tol)
    torch.testing.assert_close(xn.grad.cpu(), expected_grad, **tol)
    assert (adaptive.stats()["ops_fused"] > fused_before) == (mode == "adaptive")
    if mode == "compile":
        report = neuron_compile.report()
        assert report["dynamo_graphs"] == 1 and report["graphs"] == 2 and not report["eager_ops"]


def test_compiled_graph_holds_the_kernel_as_one_node():
    seen = []

    def spy(gm, inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    torch.compile(lambda a: softmax(a) + 1, backend=spy)(torch.randn(128, 8, device="neuron"))
    assert seen.count("nk_test.softmax.default") == 1


def test_kernel_op_on_cpu_tensors_runs_the_lowering_on_the_host():
    x, weight = torch.randn(256, 16), torch.randn(256, 16)
    expected, expected_grad = _reference(x, weight)
    x.requires_grad_()
    y = softmax(x)
    (y * weight).sum().backward()
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(x.grad, expected_grad)


def test_wrong_shape_is_an_error_naming_the_argument():
    with pytest.raises(nk.KernelError, match="argument 'x'.*partitions|argument 'x'") as info:
        softmax(torch.randn(100, 8, device="neuron"))
    assert info.value.rule == "out-of-bounds" and info.value.filename == __file__


def test_custom_op_needs_a_kernel():
    with pytest.raises(TypeError, match="@kernel"):
        nk.custom_op("nk_test::bad", lambda x: x)
