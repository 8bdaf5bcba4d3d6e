"""Transfers between host and device, factories, serialization."""

import io
import pickle
import re
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from conftest import assert_same, jax_compile_events
from torchneuron.eager import fallback
from torchneuron.runtime import transfer
from torchneuron.runtime.platform import jax_device

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool, torch.complex64]


@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_preserves_values(dtype):
    x = (torch.randn(5, 3) * 10).to(dtype)
    y = x.to("neuron")
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y.cpu(), x)
    assert torch.equal(y.to("cpu", non_blocking=True), x)


def test_numpy_via_cpu():
    x = torch.randn(2, 3)
    assert (x.to("neuron").cpu().numpy() == x.numpy()).all()


def test_tensor_constructor_and_item():
    y = torch.tensor([[1, 2], [3, 4]], device="neuron")
    assert y.dtype == torch.int64 and y.device.type == "neuron"
    assert y.sum().item() == 10
    assert y[1, 0].item() == 3
    assert y.tolist() == [[1, 2], [3, 4]]
    assert float(torch.tensor(2.5, device="neuron")) == 2.5


def test_factories_match_cpu():
    assert_same(torch.zeros(2, 3, device="neuron"), torch.zeros(2, 3))
    assert_same(torch.ones(4, dtype=torch.int32, device="neuron"), torch.ones(4, dtype=torch.int32))
    assert_same(torch.full((2, 2), 3.5, device="neuron"), torch.full((2, 2), 3.5))
    assert_same(torch.arange(10, device="neuron"), torch.arange(10))
    assert_same(torch.arange(0, 1, 0.1, device="neuron"), torch.arange(0, 1, 0.1))
    assert_same(torch.linspace(-1, 1, 7, device="neuron"), torch.linspace(-1, 1, 7))
    assert_same(torch.eye(3, 4, device="neuron"), torch.eye(3, 4))
    assert_same(torch.empty(3, 2, device="neuron").fill_(2), torch.full((3, 2), 2.0))
    y = torch.randn(3, device="neuron")
    assert_same(torch.zeros_like(y), torch.zeros(3))
    assert_same(y.new_ones(2), torch.ones(2))
    assert_same(torch.full_like(y, 7, dtype=torch.int64), torch.full((3,), 7))


_LIKE_AND_NEW = {
    "zeros_like": lambda t, device: torch.zeros_like(t, device=device),
    "empty_like": lambda t, device: torch.empty_like(t, device=device),
    "full_like": lambda t, device: torch.full_like(t, 2.5, dtype=torch.float64, device=device),
    "new_ones": lambda t, device: t.new_ones((2, 3), device=device),
    "new_empty_strided": lambda t, device: t.new_empty_strided((2, 3), (1, 2), device=device),
}


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("name", sorted(_LIKE_AND_NEW))
def test_like_and_new_factories_make_their_result_on_the_requested_device(name, device):
    # as on CUDA: `zeros_like(x, device="cpu")` is a CPU tensor (Dynamo's saved guards make meta copies so)
    x = torch.randn(4, 3).t()
    got, want = _LIKE_AND_NEW[name](x.to("neuron"), device), _LIKE_AND_NEW[name](x, device)
    assert (type(got), got.device, got.shape, got.stride(), got.dtype) == (
        type(want), want.device, want.shape, want.stride(), want.dtype)
    if device == "cpu" and "empty" not in name:
        assert torch.equal(got, want)


def test_channels_last_empty():
    y = torch.empty(2, 3, 4, 5, device="neuron", memory_format=torch.channels_last)
    assert y.stride() == torch.empty(2, 3, 4, 5, memory_format=torch.channels_last).stride()


def test_random_factories_have_the_right_moments():
    torch.manual_seed(0)
    n = 200_000
    u = torch.rand(n, device="neuron").cpu()
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.01
    g = torch.randn(n, device="neuron").cpu()
    assert abs(g.mean()) < 0.01 and abs(g.std() - 1) < 0.01
    r = torch.randint(3, 9, (n,), device="neuron").cpu()
    assert r.min() == 3 and r.max() == 8 and r.dtype == torch.int64
    e = torch.empty(n, device="neuron").normal_(2.0, 3.0).cpu()
    assert abs(e.mean() - 2) < 0.05 and abs(e.std() - 3) < 0.05
    b = torch.empty(n, device="neuron").bernoulli_(0.3).cpu()
    assert abs(b.mean() - 0.3) < 0.01
    p = torch.randperm(100, device="neuron").cpu()
    assert sorted(p.tolist()) == list(range(100))



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_multinomial_draws_in_proportion_and_never_a_zero_weight(dtype):
    torch.manual_seed(0)
    weights = torch.tensor([[2.0, 0.0, 6.0, 12.0, 0.0], [0.0, 0.0, 0.0, 1.0, 3.0]], dtype=dtype)  # unnormalised
    draws = torch.multinomial(weights.to("neuron"), 50_000, replacement=True).cpu()
    assert draws.shape == (2, 50_000) and draws.dtype == torch.int64
    for row, w in zip(draws, weights.float()):
        assert torch.allclose(torch.bincount(row, minlength=5) / row.numel(), w / w.sum(), atol=0.01)
    rows = weights.repeat(500, 1)  # alternately the two rows
    without = torch.multinomial(rows.to("neuron"), 2).cpu()
    assert all(len(set(r)) == 2 and all(w[i] > 0 for i in r) for r, w in zip(without.tolist(), rows))
    first = torch.bincount(without[::2, 0], minlength=5) / 500  # the first draws from row 0 follow its weights
    assert first[1] == first[4] == 0 and torch.allclose(first[[0, 2, 3]], torch.tensor([0.1, 0.3, 0.6]), atol=0.06)

def _moments_match(samples, mean, variance, n):
    """The samples' mean and variance within 5 standard errors of the distribution's (fourth moment bounded
    by a few times the squared variance for these)."""
    samples = samples.double()
    assert abs(samples.mean(0) - mean).max() < 5 * (variance / n).sqrt().max(), (samples.mean(0), mean)
    assert abs(samples.var(0) / variance - 1).max() < 5 * (3 / n) ** 0.5, (samples.var(0), variance)


def test_distribution_samplers_have_the_right_moments():
    """Gamma, Dirichlet, Poisson and binomial samples on the device (each was a CPU fallback)."""
    with fallback.as_error():
        _sample_distributions()


def _sample_distributions():
    torch.manual_seed(0)
    n = 50_000
    alpha = torch.tensor([0.3, 1.0, 4.5, 40.0], dtype=torch.float64)
    on_device = alpha.to("neuron")
    _moments_match(torch._standard_gamma(on_device.expand(n, 4)).cpu(), alpha, alpha, n)
    concentration = torch.tensor([0.5, 2.0, 7.5], dtype=torch.float64)
    total = concentration.sum()
    dirichlet = torch.distributions.Dirichlet(concentration.to("neuron").float()).sample((n,)).cpu()
    mean = concentration / total
    assert torch.allclose(dirichlet.sum(-1), torch.ones(n)) and dirichlet.dtype == torch.float32
    _moments_match(dirichlet, mean, mean * (1 - mean) / (total + 1), n)
    rate = torch.tensor([0.0, 0.7, 12.0, 900.0])
    counts = torch.poisson(rate.to("neuron").expand(n, 4)).cpu()
    assert counts.dtype == torch.float32 and torch.equal(counts, counts.round()) and counts[:, 0].eq(0).all()
    _moments_match(counts[:, 1:], rate[1:], rate[1:], n)
    trials, probability = torch.tensor([1.0, 10.0, 300.0]), torch.tensor([0.5, 0.25, 0.9])
    draws = torch.binomial(trials.to("neuron").expand(n, 3), probability.to("neuron").expand(n, 3)).cpu()
    assert torch.equal(draws, draws.round()) and draws.min() >= 0 and (draws <= trials).all()
    _moments_match(draws, trials * probability, trials * probability * (1 - probability), n)


def test_distribution_samplers_refuse_and_clamp_as_the_cpu_does():
    def both(fn):
        return fn("neuron"), fn("cpu")

    assert_same(*both(lambda d: torch._standard_gamma(torch.tensor([-1.0, 0.0], device=d))))  # the tiniest normal
    assert_same(*both(lambda d: torch._sample_dirichlet(torch.zeros(2, 3, device=d))))  # uniform
    assert_same(*both(lambda d: torch.binomial(torch.tensor([5.0, -1.0, 7.0], device=d),
                                               torch.tensor([1.5, 0.5, -0.2], device=d))))
    with pytest.raises(RuntimeError, match="invalid Poisson rate, expected rate to be non-negative"):
        torch.poisson(torch.tensor([-1.0, 2.0], device="neuron")).cpu()
    with pytest.raises(RuntimeError, match="Found dtype Double but expected Float"):
        torch.binomial(torch.ones(2, device="neuron"), torch.ones(2, device="neuron", dtype=torch.float64))
    with pytest.raises(ValueError, match="binomial only supports floating-point dtypes for count, got: Long"):
        torch.binomial(torch.ones(2, device="neuron", dtype=torch.int64), torch.ones(2, device="neuron"))


def test_reparameterized_gamma_gradients_match_the_cpu():
    """Gamma.rsample's gradient (aten._standard_gamma_grad), eager and compiled. PyTorch's CPU approximation
    is within 1e-3 of the exact derivative; JAX's, used here, within 1e-7."""
    alpha = torch.tensor([0.05, 0.3, 1.0, 2.5, 8.0, 50.0], dtype=torch.float64).repeat_interleave(50)
    sample = torch._standard_gamma(alpha, generator=torch.Generator().manual_seed(0))
    expected = torch._standard_gamma_grad(alpha, sample)
    on_device = torch._standard_gamma_grad(alpha.to("neuron"), sample.to("neuron")).cpu()
    torch.testing.assert_close(on_device, expected, rtol=2e-3, atol=0)

    @torch.compile(backend="neuron")
    def mean_of_samples(concentration):
        return torch.distributions.Gamma(concentration, torch.ones_like(concentration)).rsample((4000,)).mean(0)

    concentration = torch.tensor([0.5, 2.0, 7.0], device="neuron", requires_grad=True)
    mean_of_samples(concentration).sum().backward()
    # the mean of Gamma(a, 1) samples is a: its gradient averages to 1
    assert torch.allclose(concentration.grad.cpu(), torch.ones(3), atol=0.1)


def test_complex_random_factories_draw_both_parts():
    """PyTorch draws a complex tensor's real and imaginary parts independently, a normal's variance split
    between them; the mean of normal_ goes to both parts."""
    torch.manual_seed(0)
    n = 200_000
    g = torch.randn(n, dtype=torch.complex64, device="neuron").cpu()
    for part in (g.real, g.imag):
        assert abs(part.mean()) < 0.01 and abs(part.var() - 0.5) < 0.01
    assert abs(torch.corrcoef(torch.stack([g.real, g.imag]))[0, 1]) < 0.01
    u = torch.rand(n, dtype=torch.complex128, device="neuron").cpu()
    for part in (u.real, u.imag):
        assert 0 <= part.min() and part.max() < 1 and abs(part.mean() - 0.5) < 0.01
    e = torch.empty(n, dtype=torch.complex64, device="neuron").normal_(1.0, 2.0).cpu()
    for part in (e.real, e.imag):
        assert abs(part.mean() - 1) < 0.02 and abs(part.std() - 2 / 2**0.5) < 0.02
    like = torch.randn_like(torch.zeros(n, device="neuron"), dtype=torch.complex64)
    assert like.dtype == torch.complex64 and like.imag.cpu().std() > 0.6


@pytest.mark.parametrize("memory_format", [None, torch.preserve_format, torch.contiguous_format, torch.channels_last])
def test_copies_to_the_host_keep_the_layout_as_the_cpu_does(memory_format):
    x = torch.randn(2, 3, 4, 5).permute(0, 2, 3, 1)  # dense, not contiguous
    kwargs = {} if memory_format is None else {"memory_format": memory_format}
    for source in (x, x[:, ::2]):  # the second is not dense: preserve_format makes it contiguous
        got, want = source.to("neuron").to("cpu", **kwargs), source.clone(**kwargs)
        assert got.stride() == want.stride()
        assert torch.equal(got, want)


def test_pin_memory_and_non_blocking():
    x = torch.randn(4, 4).pin_memory()
    assert x.is_pinned()
    y = x.to("neuron", non_blocking=True)
    torch.neuron.synchronize()
    assert_same(y, x)


def test_save_and_load_with_map_location(tmp_path):
    x = torch.randn(3, 4, device="neuron", requires_grad=True)
    path = tmp_path / "t.pt"
    torch.save({"x": x, "n": 3}, path)
    same = torch.load(path)
    assert same["x"].device.type == "neuron" and same["x"].requires_grad
    assert torch.equal(same["x"].detach().cpu(), x.detach().cpu())
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu["x"].device.type == "cpu"
    cpu_path = tmp_path / "c.pt"
    weights = torch.nn.Linear(3, 2).state_dict()
    torch.save(weights, cpu_path)
    loaded = torch.load(cpu_path, map_location="neuron")
    assert all(t.device.type == "neuron" for t in loaded.values())
    assert torch.equal(loaded["weight"].cpu(), weights["weight"])


def _saved(obj, **options) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(obj, buffer, **options)
    buffer.seek(0)
    return buffer


def test_saved_views_load_sharing_one_storage():
    """torch.save writes a storage once however many tensors view it, and torch.load gives them one storage again,
    on neuron as on the CPU (and CUDA); mapped to another device or to the CPU, they still share one."""
    base = torch.arange(12.0).view(3, 4)
    cpu_size = len(_saved({"x": base, "row": base[1], "t": base.t()}).getvalue())
    on_device = base.to("neuron")
    buffer = _saved({"x": on_device, "row": on_device[1], "t": on_device.t()})
    assert abs(len(buffer.getvalue()) - cpu_size) < 256  # the values once, not three times
    for location, device in ((None, "neuron:0"), ("neuron:1", "neuron:1"), ("cpu", "cpu")):
        buffer.seek(0)
        loaded = torch.load(buffer, map_location=location)
        assert loaded["x"].device == torch.device(device) and loaded["t"].stride() == (1, 4)
        torch.testing.assert_close(loaded["t"].cpu(), base.t(), rtol=0, atol=0)
        loaded["row"].fill_(-1)
        assert loaded["x"].cpu()[1].tolist() == [-1.0] * 4 and loaded["t"].cpu()[:, 1].tolist() == [-1.0] * 4


def test_parameters_and_attributes_survive_save_and_load():
    """A neuron Parameter loads as a Parameter (a module saved whole keeps its parameters), with weights_only
    too, and attributes set on a tensor are kept, as on the CPU."""
    model = torch.nn.Linear(3, 2).to("neuron")
    loaded = torch.load(_saved(model), weights_only=False)
    assert isinstance(loaded.weight, torch.nn.Parameter) and loaded.weight.device.type == "neuron"
    assert_same(loaded.weight, model.weight.detach().cpu())
    weight = torch.load(_saved({"w": model.weight}))["w"]
    assert isinstance(weight, torch.nn.Parameter) and weight.requires_grad
    tagged = torch.ones(2, device="neuron")
    tagged.note = "kept"
    assert torch.load(_saved(tagged)).note == "kept"


def test_pickling_and_sending_to_another_process_keep_values():
    """pickle (through the legacy format PyTorch pickles a storage in), torch.save's legacy format and
    multiprocessing's pickler (a host copy: a neuron storage has no shared memory) rebuild the tensor on its
    device."""
    values = torch.arange(6, dtype=torch.int32).view(2, 3)
    tensor = values.to("neuron:1")
    for copy in (pickle.loads(pickle.dumps(tensor)),
                 torch.load(_saved(tensor, _use_new_zipfile_serialization=False), weights_only=False)):
        assert copy.device == torch.device("neuron:1")
        assert_same(copy, values)
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(tensor[1])
    sent = pickle.loads(buffer.getvalue())
    assert sent.device == torch.device("neuron:1")
    assert_same(sent, values[1])


def test_module_to_keeps_tied_weights():
    embed = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = embed.weight
    model = torch.nn.ModuleDict({"embed": embed, "head": head}).to("neuron")
    assert model["embed"].weight is model["head"].weight
    assert isinstance(model["head"].weight, torch.nn.Parameter)
    assert model["head"].weight.device.type == "neuron"


def test_mixing_devices_raises_like_cuda():
    y = torch.randn(3, device="neuron")
    with pytest.raises(RuntimeError, match="same device"):
        y + torch.randn(3)
    assert_same(y + torch.tensor(1.5), y.cpu() + 1.5)  # 0-dim CPU tensors are allowed


def test_a_cpu_scalar_input_is_put_on_the_device_once_per_value(monkeypatch):
    """0-dim CPU tensors mixed into device ops are only ever inputs, so one device copy serves every op
    given an equal scalar; another value, sign or dtype is a copy of its own."""
    from torchneuron.profiler.collector import Collector

    monkeypatch.setattr(transfer, "_scalars", {})  # the copies outlive a test: start without earlier tests'

    x = torch.randn(3, device="neuron")
    scalars = [torch.tensor(2.5), torch.tensor(-0.0), torch.tensor(0.0), torch.tensor(float("nan")),
               torch.tensor(-float("nan")), torch.tensor(2.5, dtype=torch.bfloat16), torch.tensor(2),
               torch.tensor(True)]

    def use_each():
        for s in scalars:
            assert_same(torch.copysign(x, s), torch.copysign(x.cpu(), s), equal_nan=True)
            assert_same(x * s, x.cpu() * s, equal_nan=True)
        assert_same(x + torch.tensor(2.5), x.cpu() + 2.5)  # another tensor of a value seen before

    with Collector() as first:
        use_each()
    with Collector() as again:
        use_each()
    assert first.transfers["h2d"][0] == len(scalars)  # -0.0 is not 0.0, nor -NaN NaN
    assert again.transfers["h2d"][0] == 0


def test_a_python_number_is_passed_as_itself_once_then_kept_on_the_device(monkeypatch):
    """An op's first sight of a number (an optimizer's new step size) passes it to the program as itself,
    without a device copy; from its second sight it is put on the device once and kept. Both forms run the
    one compiled program, with the CPU's results, zeros and NaNs keyed by their bits."""

    monkeypatch.setattr(transfer, "_scalars", {})
    monkeypatch.setattr(transfer, "_sighted_once", {})
    x = torch.randn(5, 3)
    with torch.neuron.adaptive_eager(False):
        y = x.to("neuron")
        assert_same(y.mul(0.5), x.mul(0.5))  # compiles, given the number itself
        with jax_compile_events() as compiles:
            for number in (0.75, 0.75, 0.75, -0.0, 0.0, -0.0, float("nan"), float("nan")):
                assert_same(y.mul(number), x.mul(number), equal_nan=True)
    assert compiles == []  # the kept copies are committed to the device, the first sights are not
    assert set(transfer._scalars) == {transfer.scalar_key(type(n), n, 0) for n in (0.75, -0.0, float("nan"))}
    assert set(transfer._sighted_once) == {transfer.scalar_key(type(n), n, 0) for n in (0.5, 0.0)}


@pytest.mark.parametrize("numel", [8, 4 * 2**20])
def test_device_copy_does_not_alias_host_memory(numel):
    x = torch.zeros(numel)
    y = x.to("neuron")
    z = torch.zeros(numel, device="neuron")
    z.copy_(x)
    x.add_(1)  # a later CPU write must not show through
    assert y.sum().item() == 0 and z.sum().item() == 0


def test_numpy_is_refused_as_for_cuda_tensors_unless_forced():
    import numpy as np

    x = torch.arange(4.0, device="neuron", requires_grad=True)
    message = "can't convert neuron:0 device type tensor to numpy. Use Tensor.cpu()"
    for convert in (lambda: x.numpy(), lambda: np.asarray(x)):
        with pytest.raises(TypeError, match=re.escape(message)):
            convert()
    assert x.numpy(force=True).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_tensors_from_lists_of_zero_dim_device_tensors():
    """PyTorch reads each element's value below the Python key (`_local_scalar_dense` on the device's own
    kernel), which neuron lacked: torch.tensor([loss0, loss1]) raised NotImplementedError."""
    x = torch.arange(4.0, device="neuron")
    assert torch.tensor([x[0], x[3]]).tolist() == [0.0, 3.0]
    assert torch.as_tensor([x[1], x[2]]).tolist() == [1.0, 2.0]
    on_device = torch.tensor([x[2], x[3]], device="neuron")
    assert on_device.device.type == "neuron" and on_device.cpu().tolist() == [2.0, 3.0]


def test_host_copies_are_resizable_as_cpu_tensors_are():
    """A host copy owns torch memory (one wrapping numpy's could not be resized: a CPU kernel resizing the
    fallback's copy of a written argument failed)."""
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64):
        host = torch.ones(3, dtype=dtype).to("neuron").cpu()
        assert host.untyped_storage().resizable()
        host.resize_(5)
        assert host[:3].tolist() == torch.ones(3, dtype=dtype).tolist()


def test_storages_move_to_the_device_as_cuda_storages_do():
    """`storage.neuron()`, `is_neuron` and TypedStorage's, as PyTorch generates them for torch.cuda's."""
    x = torch.arange(6.0)
    moved = x.untyped_storage().neuron(1)
    assert moved.is_neuron and not x.untyped_storage().is_neuron and moved.device == torch.device("neuron:1")
    assert moved.neuron(1) is moved and moved.neuron(0).device == torch.device("neuron:0")
    assert torch.tensor([], device="neuron:1").set_(moved, 0, (6,), (1,)).cpu().tolist() == x.tolist()
    typed = x.storage().neuron()
    assert typed.device == torch.device("neuron:0") and typed.dtype == torch.float32 and typed.tolist() == x.tolist()


def test_pinning_a_device_tensor_is_refused_as_for_a_cuda_tensor():
    """It ran on the CPU as a fallback and came back a device tensor."""
    x = torch.ones(3, device="neuron")
    assert not x.is_pinned()
    with pytest.raises(RuntimeError, match="cannot pin 'torch.neuron.FloatTensor' only dense CPU tensors can be pinned"):
        x.pin_memory()


def _views_of_a_storage():
    base = torch.arange(24.0).reshape(4, 6)
    return base, {
        "whole": lambda t: t,
        "transposed": lambda t: t.t(),
        "offset slice": lambda t: t[1:, 2:5],
        "strided": lambda t: t[::2, ::3],
        "reinterpreted": lambda t: t.view(torch.int32),
        "expanded": lambda t: t[0].expand(3, 6),
    }


@pytest.mark.parametrize("view", list(_views_of_a_storage()[1]))
def test_dlpack_consumers_read_the_tensors_elements(view):
    """JAX, NumPy (where the device's memory is the host's) and PyTorch take a neuron tensor through DLPack
    with its values, views and reinterpreted dtypes included, as they take a CPU tensor (JAX refuses views
    that are not compact, of either)."""
    import jax.numpy as jnp
    import numpy as np

    base, views = _views_of_a_storage()
    expected = views[view](base)
    tensor = views[view](base.to("neuron"))
    consumers = [jnp.from_dlpack]
    if tensor.__dlpack_device__()[0] == torch.utils.dlpack.DLDeviceType.kDLCPU:
        consumers.append(np.from_dlpack)
    for consume in consumers:
        assert _outcome(lambda: np.asarray(consume(tensor))) == _outcome(lambda: np.asarray(consume(expected)))
    # PyTorch takes it on the memory's device (from a capsule, or when asked for that device), or on neuron
    memory_device = torch.device(*_dlpack_torch_device(tensor))
    for device, shared in ((memory_device, torch.from_dlpack(torch.utils.dlpack.to_dlpack(tensor))),
                           (memory_device, torch.from_dlpack(tensor, device=memory_device)),
                           (tensor.device, torch.from_dlpack(tensor))):
        assert shared.device == device
        assert torch.equal(shared.cpu(), expected) and shared.stride() == expected.stride()


def _outcome(read):
    try:
        return read().tolist()
    except Exception as error:
        return type(error)


def _dlpack_torch_device(tensor):
    kind, index = tensor.__dlpack_device__()
    return ("cpu",) if kind == torch.utils.dlpack.DLDeviceType.kDLCPU else ("cuda", index)


def test_dlpack_shares_the_storage_until_neuron_writes_it():
    """The export views the storage's buffer: a consumer's write shows in the neuron tensor and its views; a
    later write on neuron makes a new buffer (XLA never donates a shared one), and the consumer's memory stays
    valid with the values it had."""
    tensor = torch.zeros(4, 5, device="neuron")
    row = tensor[1]
    shared = torch.from_dlpack(torch.utils.dlpack.to_dlpack(tensor))
    shared[1].fill_(7.0)
    assert row.cpu().tolist() == [7.0] * 5 and tensor.sum().item() == 35.0
    for _ in range(3):
        tensor.add_(1.0)
    assert torch.equal(tensor.cpu(), torch.full((4, 5), 3.0).index_fill_(0, torch.tensor([1]), 10.0))
    assert torch.equal(shared.cpu(), torch.zeros(4, 5).index_fill_(0, torch.tensor([1]), 7.0))


def test_from_dlpack_of_a_neuron_tensor_on_neuron_shares_its_storage_as_a_cuda_tensors_does():
    tensor = torch.zeros(6, device="neuron")
    for shared in (torch.from_dlpack(tensor[2:]), torch.from_dlpack(tensor[2:], device="neuron:0")):
        assert shared.device == tensor.device and shared.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
        shared.add_(1.0)
    copied = torch.from_dlpack(tensor, copy=True)
    copied.add_(5.0)
    assert tensor.tolist() == [0.0, 0.0, 2.0, 2.0, 2.0, 2.0] and copied.tolist() == [5.0, 5.0, 7.0, 7.0, 7.0, 7.0]
    with pytest.raises(BufferError, match="require gradient"):
        torch.from_dlpack(tensor.requires_grad_())


def test_dlpack_exports_queued_values_and_raises_failed_checks():
    """A value adaptive eager has only queued is computed for the consumer; a failed device-side check raises
    there, as at any synchronisation."""
    import jax.numpy as jnp

    with torch.neuron.adaptive_eager():
        doubled = torch.arange(6.0, device="neuron") * 2
        assert jnp.from_dlpack(doubled).tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        torch.nn.functional.embedding(torch.tensor([9], device="neuron"), torch.zeros(3, 2, device="neuron"))
        with pytest.raises(IndexError, match="index out of range"):
            jnp.from_dlpack(doubled)


def test_dlpack_refuses_what_pytorch_refuses_and_complex32():
    with pytest.raises(BufferError, match=re.escape("Can't export tensors that require gradient")):
        torch.ones(2, device="neuron", requires_grad=True).__dlpack__()
    with pytest.raises(BufferError, match="Can't export tensors with the conjugate bit set"):
        torch.ones(2, dtype=torch.complex64, device="neuron").conj().__dlpack__()
    with pytest.raises(TypeError, match="stream must be"):
        torch.ones(2, device="neuron").__dlpack__(stream="default")
    with pytest.raises(BufferError, match="complex32 tensor cannot be shared through DLPack"):
        torch.utils.dlpack.to_dlpack(torch.ones(2, dtype=torch.complex32, device="neuron"))
    # what a JAX array gives to a neuron tensor is a copy, as from any other device
    import jax.numpy as jnp

    moved = torch.from_dlpack(jnp.arange(3.0, dtype=jnp.float32), device="neuron")
    assert moved.device.type == "neuron" and moved.cpu().tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("device", ["neuron:0", "neuron:1"])
def test_host_values_reach_their_device_by_either_call(monkeypatch, device):
    """runtime/transfer.put calls jaxlib's batched_device_put, and jax.device_put where that is missing or refuses
    its arguments (a jaxlib whose signature changed)."""
    values = torch.arange(10, dtype=torch.int16).view(2, 5)
    assert_same(values.to(device), values)
    assert values.to(device)._storage.buffer.devices() == {jax_device(torch.device(device).index)}
    assert torch.empty(3, device=device).add_(2).cpu().tolist() == [2.0] * 3

    def changed_signature(*args):
        raise TypeError("batched_device_put(): incompatible function arguments")

    monkeypatch.setattr(transfer, "_batched_device_put", changed_signature)
    on_device = values.to(device)
    assert on_device.device == torch.device(device)
    assert_same(on_device, values)
    assert transfer._batched_device_put is None
