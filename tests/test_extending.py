"""torchneuron.library: JAX lowerings for custom ops in eager, adaptive eager and torch.compile."""
import jax
import jax.numpy as jnp
import pytest
import torch

import torchneuron
from torchneuron import compile as neuron_compile
from torchneuron.eager import adaptive, fallback
from torchneuron.library import force_cpu, lowering


# device_types="cpu": on neuron only the lowering can run it (no device-generic PyTorch kernel)
@torch.library.custom_op("torchneuron_ext::softclip", mutates_args=(), device_types="cpu")
def softclip(x: torch.Tensor, key: torch.Tensor, scale: float) -> torch.Tensor:
    return scale * torch.tanh(x / scale) + key


@softclip.register_fake
def _(x, key, scale):
    return torch.empty_like(x)


def _softclip_backward(ctx, grad):
    (t,) = ctx.saved_tensors
    return grad * (1 - t * t), grad, None


def _softclip_context(ctx, inputs, output):
    x, _, scale = inputs
    ctx.save_for_backward(torch.tanh(x / scale))


softclip.register_autograd(_softclip_backward, setup_context=_softclip_context)

traced = {"softclip": 0}


@lowering(torch.ops.torchneuron_ext.softclip.default)
def softclip_lowering(x, key, scale):  # an argument named key: the PRNG key of random ops cannot collide
    traced["softclip"] += 1
    return scale * jnp.tanh(x / scale) + key


@torch.library.custom_op("torchneuron_ext::jitter", mutates_args=(), device_types="cpu")
def jitter(x: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    return x + key * torch.randn_like(x)


@jitter.register_fake
def _(x, key):
    return torch.empty_like(x)


@lowering(torch.ops.torchneuron_ext.jitter.default, random=True)
def _(prng, x, key):
    return x + key * jax.random.normal(prng, x.shape, x.dtype)


@torch.library.custom_op("torchneuron_ext::wrong_shape", mutates_args=(), device_types="cpu")
def wrong_shape(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@wrong_shape.register_fake
def _(x):
    return torch.empty_like(x)


@lowering(torch.ops.torchneuron_ext.wrong_shape.default)
def _(x):
    return x.sum(0)


@torch.library.custom_op("torchneuron_ext::wrong_dtype", mutates_args=(), device_types="cpu")
def wrong_dtype(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@wrong_dtype.register_fake
def _(x):
    return torch.empty_like(x)


@lowering(torch.ops.torchneuron_ext.wrong_dtype.default)
def _(x):
    return x.astype(jnp.int32)


class Clipped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.shift = torch.nn.Parameter(torch.full((8,), 0.1))

    def forward(self, x):
        return softclip(self.linear(x), self.shift.expand(x.shape[0], 8), 2.0).square().sum()


def _forward_backward(model, x):
    loss = model(x)
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("mode", ["eager", "adaptive", "compile"])
def test_custom_op_lowering_trains_as_on_the_cpu(mode, tmp_path, monkeypatch):
    # a fresh graph cache: a graph cached by an earlier run on this machine would not trace the lowering
    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    cpu_model, x = Clipped(), torch.randn(4, 8) * 3
    model = Clipped().to("neuron")
    model.load_state_dict(cpu_model.state_dict())
    expected_loss, expected_grads = _forward_backward(cpu_model, x)
    run = torch.compile(model, backend="neuron") if mode == "compile" else model
    neuron_compile.reset()
    torch.neuron.synchronize()  # earlier queued work runs now, not counted below (tests/kernels/test_custom_op.py)
    before, fused_before = traced["softclip"], adaptive.stats()["ops_fused"]
    with fallback.as_error(), torch.neuron.adaptive_eager(mode == "adaptive"):
        # adaptive: queued once its executables have run, fused from the queue's second sighting
        for _ in range(3 if mode == "adaptive" else 1):
            model.zero_grad()
            loss, grads = _forward_backward(run, x.to("neuron"))
        torch.testing.assert_close(loss.cpu(), expected_loss)
    assert (adaptive.stats()["ops_fused"] > fused_before) == (mode == "adaptive")
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got.cpu(), want)
    assert traced["softclip"] > before or mode != "compile"  # eager executables may be cached already
    if mode == "compile":
        report = neuron_compile.report()
        assert not report["eager_ops"] and report["graphs"] == 2  # one forward and one backward program


def test_random_lowering_draws_from_the_device_generator():
    x, scale = torch.zeros(4096, device="neuron"), torch.full((4096,), 2.0, device="neuron")
    compiled = torch.compile(jitter, backend="neuron")
    for run in (jitter, compiled):
        torch.manual_seed(1)
        first = run(x, scale).cpu()
        second = run(x, scale).cpu()
        torch.manual_seed(1)
        again = run(x, scale).cpu()
        torch.testing.assert_close(first, again)
        assert not torch.equal(first, second)
        assert abs(first.std().item() - 2.0) < 0.15 and abs(first.mean().item()) < 0.15


def test_a_second_lowering_names_where_the_first_is():
    first_line = softclip_lowering.__code__.co_firstlineno
    with pytest.raises(RuntimeError, match=rf"test_extending.py:{first_line}.*second one.*test_extending.py"):
        @lowering(torch.ops.torchneuron_ext.softclip.default)
        def _(x, key, scale):
            return x


def test_an_aten_op_already_lowered_is_refused():
    with pytest.raises(RuntimeError, match="aten.add.Tensor already has a lowering"):
        lowering(torch.ops.aten.add.Tensor)(lambda x, y, alpha=1: x + y)


def test_lowering_disagreeing_with_the_fake_kernel_is_an_error_naming_the_op():
    x = torch.randn(3, 4, device="neuron")
    with pytest.raises(RuntimeError, match=r"wrong_shape.*\[4\] float32.*fake kernel says \(\[3, 4\] float32\)"):
        wrong_shape(x)
    with pytest.raises(RuntimeError, match="wrong_shape"):
        torch.compile(wrong_shape, backend="neuron")(x)


@pytest.mark.parametrize("mode", ["eager", "adaptive", "compile"])
def test_lowering_returning_another_dtype_than_the_fake_kernel_is_an_error_naming_the_op(mode):
    x = torch.randn(3, 4, device="neuron")
    run = torch.compile(wrong_dtype, backend="neuron") if mode == "compile" else wrong_dtype
    with torch.neuron.adaptive_eager(mode == "adaptive"), pytest.raises(
        # compiled sizes may be symbolic ([None, None]): the same CustomOpDef.__call__ was compiled before
        RuntimeError, match=r"wrong_dtype.default returned \(\[3, 4\] int32\).*fake kernel says \(\[.*\] float32\)"
    ):
        run(x).cpu()


def test_force_cpu_runs_the_cpu_kernel_and_can_be_undone():
    op = torch.ops.torchneuron_ext.softclip.default
    x, key = torch.randn(5), torch.randn(5)
    fallback.reset()
    neuron_compile.reset()
    force_cpu(op)
    try:
        assert torchneuron.library.cpu_forced() == [op]
        with pytest.warns(UserWarning, match="softclip"):
            got = softclip(x.to("neuron"), key.to("neuron"), 1.5)
            compiled = torch.compile(lambda x, key: softclip(x, key, 1.5) + 1, backend="neuron")(
                x.to("neuron"), key.to("neuron"))
        assert fallback.counts[str(op)] == 2
        assert neuron_compile.report()["eager_ops"] == {str(op): 1}
    finally:
        force_cpu(op, False)
    torch.testing.assert_close(got.cpu(), softclip(x, key, 1.5))
    torch.testing.assert_close(compiled.cpu(), softclip(x, key, 1.5) + 1)
    with fallback.as_error():
        torch.testing.assert_close(softclip(x.to("neuron"), key.to("neuron"), 1.5).cpu(), softclip(x, key, 1.5))


_library = torch.library.Library("torchneuron_ext", "FRAGMENT")
_library.define("twice(Tensor x) -> Tensor")
_library.impl("twice", lambda x: x * 2, "CPU")


def test_meta_argument_serves_an_op_without_a_fake_kernel():
    @lowering(torch.ops.torchneuron_ext.twice.default, meta=lambda x: torch.empty_like(x))
    def _(x):
        return x + x

    x = torch.randn(6)
    with fallback.as_error():
        torch.testing.assert_close(torch.ops.torchneuron_ext.twice(x.to("neuron")).cpu(), x * 2)
        compiled = torch.compile(lambda t: torch.ops.torchneuron_ext.twice(t) + 1, backend="neuron")
        torch.testing.assert_close(compiled(x.to("neuron")).cpu(), x * 2 + 1)


def test_bad_registrations_raise_pytorch_error_types():
    with pytest.raises(TypeError, match="OpOverload"):
        lowering(softclip)
    with pytest.raises(TypeError, match="OpOverload"):
        force_cpu("torchneuron_ext::softclip")
    with pytest.raises(NotImplementedError, match="mutates"):
        lowering(torch.ops.aten.add_.Tensor)
