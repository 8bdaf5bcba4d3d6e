"""Views alias their base, in-place ops and out= mutate through views, exactly as on the CPU."""
import warnings

import pytest
import torch

from conftest import assert_same


def both(make):
    cpu = make()
    return cpu, cpu.clone().to("neuron")


def test_transpose_row_add():
    x, y = both(lambda: torch.arange(12.0).reshape(3, 4))
    x.t()[0] += 1
    y.t()[0] += 1
    assert_same(y, x)


def test_strided_slice_zero():
    x, y = both(lambda: torch.arange(20.0).reshape(4, 5))
    a, b = x[1:, ::2], y[1:, ::2]
    assert b.stride() == a.stride() and b.storage_offset() == a.storage_offset()
    a.zero_()
    b.zero_()
    assert_same(y, x)


def test_flat_view_setitem():
    x, y = both(lambda: torch.arange(12.0).reshape(3, 4))
    x.view(-1)[3] = 7
    y.view(-1)[3] = 7
    assert_same(y, x)


@pytest.mark.parametrize(
    "view",
    [
        lambda t: t.t(),
        lambda t: t.transpose(0, 1),
        lambda t: t.permute(1, 0),
        lambda t: t[1],
        lambda t: t.select(1, 2),
        lambda t: t[:, 1:3],
        lambda t: t[::2],
        lambda t: t.narrow(1, 1, 2),
        lambda t: t.diagonal(),
        lambda t: t.unsqueeze(0),
        lambda t: t.view(4, 3),
        lambda t: t.reshape(2, 6),
        lambda t: t.as_strided((2, 2), (1, 4), 1),
        lambda t: t.unfold(1, 2, 1),
        lambda t: t.expand(2, 3, 4),
        lambda t: t.flatten(),
        lambda t: t.chunk(2, dim=1)[1],
        lambda t: t.split(1)[2],
        lambda t: t.unbind(0)[1],
        lambda t: t.movedim(0, 1)[..., 1],
    ],
)
def test_view_metadata_and_values(view):
    x, y = both(lambda: torch.arange(12.0).reshape(3, 4))
    a, b = view(x), view(y)
    assert b.shape == a.shape and b.stride() == a.stride() and b.storage_offset() == a.storage_offset()
    assert b._base is y if a._base is x else True
    assert_same(b, a)
    assert_same(b.contiguous(), a.contiguous())


@pytest.mark.parametrize(
    "mutate",
    [
        lambda t: t.t().mul_(2),
        lambda t: t[:, 1].add_(10),
        lambda t: t.diagonal().fill_(-1),
        lambda t: t[1:, 1:3].copy_(torch.tensor([[5.0, 6.0], [7.0, 8.0]], device=t.device)),
        lambda t: t.view(4, 3)[::2].neg_(),
        lambda t: t.select(0, 2).clamp_(min=9),
        lambda t: torch.mul(t[0], 3, out=t[2]),
        lambda t: t.masked_fill_(t > 5, 0),
        lambda t: t.index_fill_(1, torch.tensor([0, 3], device=t.device), 4.5),
        lambda t: t.__setitem__((slice(None), 0), 100.0),
        lambda t: t.__setitem__(t > 8, -3.0),
    ],
)
def test_inplace_through_views(mutate):
    x, y = both(lambda: torch.arange(12.0).reshape(3, 4))
    mutate(x)
    mutate(y)
    assert_same(y, x)


def test_inplace_returns_self_and_bumps_version():
    y = torch.ones(3, device="neuron")
    version = y._version
    assert y.add_(1) is y
    assert y._version > version


def test_out_variant_resizes():
    out = torch.empty(0, device="neuron")
    a = torch.randn(3, 4)
    torch.add(a.to("neuron"), 1, out=out)
    assert out.shape == (3, 4)
    assert_same(out, a + 1)


def test_contiguous_copies_only_when_needed():
    y = torch.randn(3, 4, device="neuron")
    assert y.contiguous() is y
    t = y.t()
    c = t.contiguous()
    assert c is not t and c.is_contiguous()
    assert_same(c, y.cpu().t())


def test_resize_and_set():
    y = torch.arange(4.0, device="neuron")
    y.resize_(2, 3)
    assert y.shape == (2, 3)
    assert y.flatten()[:4].cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    z = torch.empty(0, device="neuron")
    z.set_(y)
    assert z.shape == (2, 3)
    z.fill_(1.0)
    assert y.cpu().eq(1).all()


@pytest.mark.parametrize(
    "resize",
    [
        lambda t: t.resize_(2, 3, 4, 5, memory_format=torch.channels_last),
        lambda t: t.resize_(2, 3, 4, 5).resize_(2, 3, 4, 5, memory_format=torch.channels_last),
        lambda t: t.resize_(2, 3, 4, 5, 6, memory_format=torch.channels_last_3d),
        lambda t: t.resize_as_(torch.empty(2, 3, 4, 5, device=t.device, memory_format=torch.channels_last),
                               memory_format=torch.preserve_format),
        lambda t: t.resize_as_(torch.empty(2, 3, 4, 5, device=t.device, memory_format=torch.channels_last)),
    ],
    ids=["channels_last", "same-size", "channels_last_3d", "as-preserve", "as-default"],
)
def test_resize_takes_the_memory_format_as_on_the_cpu(resize):
    results = {d: resize(torch.arange(720.0, device=d)) for d in ("cpu", "neuron")}
    assert results["neuron"].stride() == results["cpu"].stride()
    assert_same(results["neuron"], results["cpu"])


def test_copy_between_dtypes_and_devices():
    src = torch.randn(3, 4)
    dst = torch.zeros(3, 4, dtype=torch.float64, device="neuron")
    dst.copy_(src)
    assert_same(dst, src.double())
    back = torch.zeros(3, 4, dtype=torch.int32)
    back.copy_(dst * 10)
    assert torch.equal(back, (src.double() * 10).int())
    broadcast = torch.zeros(2, 3, 4, device="neuron")
    broadcast.copy_(src.to("neuron"))
    assert_same(broadcast, src.expand(2, 3, 4))


def test_view_dtype_reinterprets_bits():
    x, y = both(lambda: torch.tensor([1.0, -2.0, 0.5]))
    assert_same(y.view(torch.int32), x.view(torch.int32))
    y.view(torch.int32).add_(1)
    x.view(torch.int32).add_(1)
    assert_same(y, x)


def test_inplace_on_expanded_view_errors_like_cpu():
    x = torch.zeros(3).expand(2, 3)
    y = torch.zeros(3, device="neuron").expand(2, 3)
    with pytest.raises(RuntimeError):
        x.add_(1)
    with pytest.raises(RuntimeError):
        y.add_(1)


def test_other_tensor_subclasses_over_neuron_tensors_dispatch_first():
    """A subclass wrapping neuron tensors (DTensor, funcol's AsyncCollectiveTensor, TwoTensor) meets plain
    neuron tensors in one op: neuron's dispatch defers to it, and it unwraps."""
    from torch.testing._internal.two_tensor import TwoTensor

    a, b = torch.randn(3), torch.randn(3)
    pair = TwoTensor(a.to("neuron"), b.to("neuron"))
    out = torch.ones(3, device="neuron") + pair
    assert isinstance(out, TwoTensor)
    torch.testing.assert_close(out.a.cpu(), a + 1)
    torch.testing.assert_close(out.b.cpu(), b + 1)


def test_views_of_normal_tensors_in_inference_mode():
    # a cache allocated outside inference mode, written through views inside it (vLLM's KV cache)
    x, y = both(lambda: torch.zeros(4, 6))
    with torch.inference_mode():
        for t in (x, y):
            view = t.view(4, 2, 3)[1:3]
            view.add_(1)
            assert not view.is_inference()
            made = torch.ones(2, 3, device=t.device)
            made.view(6)[2:4].mul_(5)
            assert made.is_inference() and made.view(6).is_inference()
    assert_same(y, x)



@pytest.mark.parametrize("adaptive", [False, True], ids=["eager", "adaptive"])
def test_a_loop_over_positions_compiles_a_few_programs_not_one_per_position(adaptive):
    """Views that differ only in where they start share one program taking the offsets as arguments (a KV
    cache written at position i); views of one storage (x[j] += x[i]) keep their offsets compiled in."""
    from torchneuron.runtime.cache import eager_cache

    width = 5 if adaptive else 3  # signatures of their own: the other mode's executables are not counted

    def run(device, steps, aliasing=False):
        torch.manual_seed(0)
        cache, new = torch.zeros(4, steps, width).to(device), torch.randn(steps, 4, width).to(device)
        scores = torch.zeros(steps).to(device)
        for i in range(steps):
            cache[:, i] = new[i] * 2
            scores[i] = (cache[:, i] * new[i]).sum()
            if aliasing:
                cache[:, (i + 3) % steps] += cache[:, i]
        return cache, scores

    with torch.neuron.adaptive_eager(adaptive):
        run("neuron", 5)
        before = len(eager_cache.entries)
        got = run("neuron", 40)
        compiled = len(eager_cache.entries) - before
        aliased = run("neuron", 12, aliasing=True)
    for result, expected in ((got, run("cpu", 40)), (aliased, run("cpu", 12, aliasing=True))):
        for g, e in zip(result, expected):
            torch.testing.assert_close(g.cpu(), e)
    # four ops with views, each compiled for its first offsets and once with offsets as arguments (one per
    # position otherwise: 160)
    assert compiled <= 8, compiled


def test_a_view_of_a_storage_of_another_dtype_gets_its_own_program():
    """The same view (shape, strides, dtype) over a storage of another dtype reads other bytes."""
    ints = torch.tensor([1, 2, 3], dtype=torch.int32)
    floats = torch.tensor([1.0, 2.0, 3.0]).view(torch.int32)
    for same_view in (ints, floats):
        assert_same(same_view.to("neuron") + 1, same_view + 1)
    assert_same(torch.tensor([1.0, 2.0, 3.0], device="neuron").view(torch.int32) + 1, floats + 1)


def test_assigning_data_rebinds_the_tensor_to_the_new_one():
    """`t.data = new` (weight initialisation, EMA, Module.half/float/to(dtype)) is made in C++ without a dispatch:
    the neuron tensor then views `new`'s storage, shape and dtype. Before, it reported the new shape and dtype
    and computed with its old values."""
    results = {}
    for device in ("cpu", "neuron"):
        parameter = torch.nn.Parameter(torch.zeros(2, device=device))
        new = torch.arange(4.0, device=device)
        parameter.data = new
        new[0] = 7  # the parameter views the assigned tensor's storage
        results[device] = (parameter + 0, parameter.data)
        assert parameter.requires_grad and isinstance(parameter, torch.nn.Parameter)
    for got, expected in zip(results["neuron"], results["cpu"]):
        assert_same(got.detach(), expected.detach())
    # across devices, as between CUDA and the CPU: the tensor views the assigned one (tests/test_patches.py too)
    moved, host = torch.zeros(2, device="neuron"), torch.arange(2.0)
    moved.data = host
    host[0] = 5
    assert moved.device.type == "cpu" and moved.tolist() == [5.0, 1.0]


@pytest.mark.parametrize("convert", [lambda m: m.half(), lambda m: m.to(torch.bfloat16), lambda m: m.double()])
def test_module_dtype_conversions_on_the_device(convert):
    torch.manual_seed(0)
    cpu = torch.nn.Linear(4, 3)
    neuron = convert(torch.nn.Linear(4, 3).to("neuron"))
    neuron.load_state_dict(convert(cpu).state_dict())
    x = torch.randn(2, 4, dtype=cpu.weight.dtype)
    out = neuron(x.to("neuron"))
    assert out.dtype == cpu.weight.dtype and neuron.weight._storage.dtype == cpu.weight.dtype
    assert_same(out.detach(), cpu(x).detach(), atol=1e-2, rtol=1e-2)


def test_as_strided_copy_of_a_strided_view_counts_in_its_storage_as_the_cpu():
    def strided_copy(device):
        base = torch.arange(18.0, device=device).reshape(3, 6)
        return torch.as_strided_copy(base[:, ::2], (2, 2), (1, 2), 1)

    assert_same(strided_copy("neuron"), strided_copy("cpu"))


_PARTIAL_WRITES = {
    "index_put_": lambda u, d: u.index_put_((torch.tensor([0], device=d),), torch.tensor(5.0, device=d)),
    "setitem": lambda u, d: u.__setitem__(torch.tensor([2], device=d), 9.0),
    "masked_fill_": lambda u, d: u.masked_fill_(torch.arange(18, device=d).reshape(6, 3) == 0, -1.0),
    "scatter_": lambda u, d: u.scatter_(1, torch.zeros(6, 1, dtype=torch.long, device=d), 7.0),
}


@pytest.mark.parametrize("adaptive", [False, True], ids=["eager", "adaptive"])
@pytest.mark.parametrize("write", _PARTIAL_WRITES.values(), ids=_PARTIAL_WRITES.keys())
def test_writing_some_elements_of_overlapping_windows_as_the_cpu(write, adaptive):
    """Through `x.unfold(0, 3, 1)` (windows sharing memory) an op writing some elements writes those alone: the
    whole view was written back, and an element of another window over the same memory, still holding its
    old value, undid the write (x[1] and x[2] stayed as they were after `u[0] = 5`)."""
    results = {}
    with torch.neuron.adaptive_eager(adaptive):
        for device in ("cpu", "neuron"):
            x = torch.arange(8.0, device=device)
            write(x.unfold(0, 3, 1), device)
            results[device] = x.cpu()
    assert torch.equal(results["neuron"], results["cpu"]), results


_OUT_OPS = {
    "sort": lambda x, out: torch.sort(x, out=(out, torch.zeros(12, dtype=torch.long, device=x.device)[::2])),
    "msort": lambda x, out: torch.msort(x, out=out),
    "linalg.solve": lambda x, out: torch.linalg.solve(x[:3].reshape(3, 1) * torch.eye(3, device=x.device)
                                                      + torch.eye(3, device=x.device) * 4, x[3:], out=out[:3]),
    "cumsum": lambda x, out: torch.cumsum(x, 0, out=out),
}


@pytest.mark.parametrize("f", _OUT_OPS.values(), ids=_OUT_OPS.keys())
def test_a_strided_out_of_the_right_shape_keeps_its_strides(f):
    """`torch.sort(x, out=(buf[::2], ...))`: the CPU writes through the out's strides into `buf`; PyTorch's meta
    kernels of sort and linalg.solve make the out contiguous, and the result went to a new storage, `buf`
    unchanged."""
    x = torch.randn(6)
    results = {}
    for device in ("cpu", "neuron"):
        buffer = torch.zeros(12, device=device)
        out = buffer[::2]
        f(x.to(device), out)
        results[device] = (buffer.cpu(), out.stride())
    torch.testing.assert_close(results["neuron"][0], results["cpu"][0])
    assert results["neuron"][1] == results["cpu"][1] == (2,)


@pytest.mark.parametrize("adaptive", [False, True], ids=["eager", "adaptive"])
@pytest.mark.parametrize("base_numel", [8, 20], ids=["grown", "fits"])
def test_an_out_of_another_shape_is_resized_in_its_own_storage(base_numel, adaptive):
    """An out= of another shape is resized as PyTorch's resize_ does it: in its own storage, grown if too small,
    so that its base sees the values (the result went to a new storage, the base unchanged). An empty out still
    takes the result as it is."""
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    results = {}
    with warnings.catch_warnings(), torch.neuron.adaptive_eager(adaptive):
        warnings.simplefilter("ignore")  # PyTorch's deprecation of resizing a non-empty out
        for device in ("cpu", "neuron"):
            base = torch.zeros(base_numel, device=device)
            out = base[::2]
            torch.add(a.to(device), b.to(device), out=out)
            empty = torch.empty(0, device=device)
            torch.mul(a.to(device), b.to(device), out=empty)
            results[device] = (base.cpu(), out.cpu(), out.stride(), out.untyped_storage().nbytes(), empty.cpu())
    cpu, neuron = results["cpu"], results["neuron"]
    for got, expected in zip(neuron, cpu):
        if isinstance(expected, torch.Tensor):
            torch.testing.assert_close(got, expected)
        else:
            assert got == expected


def test_resizing_a_view_of_another_dtype_grows_its_storage_by_bytes_as_the_cpu():
    """`x.view(torch.uint8).resize_(20)` over 16 bytes of float32 grows the storage to 20 bytes, as on the CPU (it
    counted 20 float32 elements, 80 bytes), keeping the values."""
    results = {}
    for device in ("cpu", "neuron"):
        x = torch.arange(4, dtype=torch.float32, device=device)
        v = x.view(torch.uint8)
        v.resize_(20)
        results[device] = (v.untyped_storage().nbytes(), x.cpu())
    assert results["neuron"][0] == results["cpu"][0] == 20
    assert torch.equal(results["neuron"][1], results["cpu"][1])
