"""The native core: a device PyTorch sees as several (guard, autograd engine), device generators,
real storages, streams and events. XLA:CPU gives 2 devices by default, so neuron:1 exists here."""
import gc
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_same


def test_two_devices_and_the_current_one():
    assert torch.neuron.device_count() >= 2
    assert torch.accelerator.device_count() == torch.neuron.device_count()
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(1):
        assert torch.neuron.current_device() == 1
        assert torch.accelerator.current_device_index() == 1
        assert torch.empty(2, device="neuron").device == torch.device("neuron", 1)
    assert torch.neuron.current_device() == 0
    torch.accelerator.set_device_index(1)
    try:
        assert torch.neuron.current_device() == 1
        assert torch.randn(2, device="neuron").device.index == 1
    finally:
        torch.neuron.set_device(0)
    # per thread, as CUDA's: another thread starts on device 0
    seen = []
    torch.neuron.set_device(1)
    try:
        thread = threading.Thread(target=lambda: seen.append(torch.neuron.current_device()))
        thread.start()
        thread.join()
    finally:
        torch.neuron.set_device(0)
    assert seen == [0]


def test_invalid_device_ordinal():
    count = torch.neuron.device_count()
    for make in (lambda: torch.empty(2, device=f"neuron:{count + 5}"),
                 lambda: torch.neuron.set_device(count),
                 lambda: torch.ones(2).to(f"neuron:{count}")):
        with pytest.raises(RuntimeError, match="Invalid device ordinal"):
            make()


def _train(device, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 8).to(device), torch.randn(32, 4).to(device)
    losses = []
    for _ in range(steps):
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach() for p in model.parameters()]


def test_training_on_neuron_1_and_neuron_0_in_one_process():
    cpu_losses, cpu_params = _train("cpu")
    for device in ("neuron:1", "neuron:0"):
        losses, params = _train(device)
        assert all(p.device == torch.device(device) for p in params)
        torch.testing.assert_close(losses, cpu_losses, rtol=1e-5, atol=1e-6)
        for p, q in zip(params, cpu_params):
            assert_same(p, q, rtol=1e-5, atol=1e-6)


def test_backward_in_a_thread_and_double_backward_on_neuron_1():
    x_cpu = torch.randn(5, dtype=torch.float64)
    results = {}

    def run():
        x = x_cpu.to("neuron:1").requires_grad_()
        (x.sin() * x).sum().backward()
        results["grad"] = x.grad

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert_same(results["grad"], x_cpu.sin() + x_cpu * x_cpu.cos())

    x = x_cpu.to("neuron:1").requires_grad_()
    (g,) = torch.autograd.grad((x ** 3).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    assert gg.device == torch.device("neuron", 1)
    assert_same(g.detach(), 3 * x_cpu ** 2)
    assert_same(gg, 6 * x_cpu)


_BACKWARD_THREAD = """
import threading, torch
seen = {}
x = torch.randn(3, device="neuron:1", requires_grad=True)
y = x * 2
y.register_hook(lambda grad: seen.update({threading.get_ident(): torch.neuron.current_device()}))
y.sum().backward(retain_graph=True)
torch.autograd.grad(y.sum(), x)
assert torch.neuron.current_device() == 0 and x.grad.cpu().tolist() == [2.0] * 3
print(threading.get_ident() in seen, set(seen.values()))
"""


@pytest.mark.parametrize("device_threads", ["0", "1"])
def test_backward_runs_on_the_calling_thread_on_its_device(device_threads):
    """A backward from neuron roots runs on the calling thread (patches.backward_runs_on_the_calling_thread:
    a device thread cost the whole step a third more CPU time), its nodes on their tensors' device as on the
    engine's device threads, which TORCHNEURON_AUTOGRAD_DEVICE_THREADS=1 keeps."""
    env = dict(os.environ, TORCHNEURON_AUTOGRAD_DEVICE_THREADS=device_threads)
    run = subprocess.run([sys.executable, "-c", _BACKWARD_THREAD], capture_output=True, text=True, timeout=300,
                         env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("\n")[-2] == f"{device_threads == '0'} {{1}}"


def test_an_error_in_backward_on_neuron_1_is_raised_not_fatal():
    x = torch.randn(3, device="neuron:1", requires_grad=True)

    class Bad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, grad):
            return grad.reshape(7)  # wrong size: RuntimeError from a neuron op on the device thread

    class PythonError(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, grad):
            raise ValueError("raised by a custom backward")

    with pytest.raises(RuntimeError, match="invalid for input of size 3"):
        Bad.apply(x).sum().backward()
    with pytest.raises(ValueError, match="raised by a custom backward"):
        PythonError.apply(x).sum().backward()
    (x * 3).sum().backward()  # the engine keeps working
    assert x.grad.cpu().tolist() == [3.0, 3.0, 3.0]


RANDOM_DRAWS = {
    "randn": lambda g, d: torch.randn(16, device=d, generator=g),
    "rand": lambda g, d: torch.rand(16, device=d, generator=g),
    "randint": lambda g, d: torch.randint(0, 100, (16,), device=d, generator=g),
    "normal_": lambda g, d: torch.empty(16, device=d).normal_(2.0, 3.0, generator=g),
    "bernoulli_": lambda g, d: torch.empty(16, device=d).bernoulli_(0.3, generator=g),
    "multinomial": lambda g, d: torch.multinomial(torch.ones(10, device=d), 5, generator=g),
    "randperm": lambda g, d: torch.randperm(16, device=d, generator=g),
}


@pytest.mark.parametrize("draw", sorted(RANDOM_DRAWS))
@pytest.mark.parametrize("device", ["neuron", "neuron:1"])
def test_generator_argument_reproduces_and_leaves_the_default_alone(draw, device):
    make = RANDOM_DRAWS[draw]
    g = torch.Generator(device=device)
    assert g.device == torch.device(device if ":" in device else "neuron:0")
    default_state = torch.neuron.get_rng_state(g.device.index)
    g.manual_seed(1234)
    first = make(g, device).cpu()
    g.manual_seed(1234)
    again = make(g, device).cpu()
    other = make(g, device).cpu()
    assert torch.equal(first, again)
    if draw not in ("bernoulli_", "multinomial"):  # few outcomes: equal draws are possible
        assert not torch.equal(first, other)
    assert torch.equal(torch.neuron.get_rng_state(g.device.index), default_state)


def test_generator_state_seed_and_dropout():
    g = torch.Generator(device="neuron")
    g.manual_seed(7)
    assert g.initial_seed() == 7
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.numel() == 16  # Philox-shaped: seed, offset
    x = torch.ones(1000, device="neuron")
    first = torch.randn(8, device="neuron", generator=g).cpu()
    g.set_state(state)
    assert torch.equal(torch.randn(8, device="neuron", generator=g).cpu(), first)
    assert g.seed() != 7 and g.initial_seed() == g.initial_seed()
    clone = torch.Generator(device="neuron").set_state(g.get_state())
    assert torch.equal(torch.rand(4, device="neuron", generator=g).cpu(),
                       torch.rand(4, device="neuron", generator=clone).cpu())
    # dropout (which takes no generator argument) draws from its device's default generator
    torch.manual_seed(3)
    d1 = F.dropout(x, 0.5).cpu()
    torch.manual_seed(3)
    assert torch.equal(F.dropout(x, 0.5).cpu(), d1)
    assert 300 < int((d1 == 0).sum()) < 700


def test_manual_seed_seeds_every_device_and_default_generators():
    gens = torch.neuron.default_generators
    assert len(gens) == torch.neuron.device_count()
    assert [g.device for g in gens] == [torch.device("neuron", i) for i in range(len(gens))]
    torch.manual_seed(11)
    assert [g.initial_seed() for g in gens] == [11] * len(gens)
    a = torch.randn(4, device="neuron:1").cpu()
    torch.manual_seed(11)
    assert torch.equal(torch.randn(4, device="neuron:1").cpu(), a)
    torch.neuron.manual_seed_all(5)
    assert torch.neuron.get_rng_state_all()[1][:8].tolist() == [5, 0, 0, 0, 0, 0, 0, 0]


def test_generator_in_adaptive_eager_and_compile_matches_eager():
    def draw(g):
        return torch.randn(6, device="neuron", generator=g) * 2 + 1

    g = torch.Generator(device="neuron").manual_seed(21)
    eager = [draw(g).cpu() for _ in range(3)]
    g.manual_seed(21)
    with torch.neuron.adaptive_eager():
        adaptive = [draw(g) for _ in range(3)]
    # the same numbers drawn; the arithmetic after them may be fused (last-bit differences)
    for a, e in zip(adaptive, eager):
        torch.testing.assert_close(a.cpu(), e, rtol=1e-6, atol=1e-6)
    g.manual_seed(21)
    compiled = torch.compile(draw, backend="neuron")
    for e in eager:
        torch.testing.assert_close(compiled(g).cpu(), e, rtol=1e-6, atol=1e-6)


def test_generator_of_another_device_is_the_cpu_error():
    with pytest.raises(RuntimeError, match="Expected a 'neuron' device type for generator but found 'cpu'"):
        torch.randn(3, device="neuron", generator=torch.Generator())


def test_storage_is_shared_by_views_and_resizes():
    gc.collect()  # storages earlier tests left in reference cycles would be freed between the counts below
    torch.neuron.synchronize()
    base = torch.neuron.memory_allocated()
    x = torch.arange(256, dtype=torch.float32, device="neuron")
    view = x[16:].view(15, 16)
    storage = x.untyped_storage()
    assert storage.device == torch.device("neuron", 0)
    assert storage.nbytes() == 1024
    assert view.untyped_storage().data_ptr() == storage.data_ptr() != 0
    assert view.data_ptr() == x.data_ptr() + 16 * 4
    other = torch.zeros(256, device="neuron")
    assert other.untyped_storage().data_ptr() != storage.data_ptr()
    assert torch.neuron.memory_allocated() == base + 2048

    storage.resize_(0)  # FSDP2's free_storage
    assert storage.nbytes() == 0 and x.untyped_storage().nbytes() == 0
    assert torch.neuron.memory_allocated() == base + 1024
    storage.resize_(1024)  # FSDP2's alloc_storage
    assert torch.neuron.memory_allocated() == base + 2048
    x.copy_(torch.arange(256, dtype=torch.float32) * 2)
    assert_same(view, (torch.arange(256, dtype=torch.float32) * 2)[16:].view(15, 16))
    assert x.untyped_storage().data_ptr() == view.untyped_storage().data_ptr()
    with pytest.raises(RuntimeError, match="not a multiple"):
        storage.resize_(1023)


@pytest.mark.parametrize("inference", [False, True])
def test_tensors_are_built_as_pytorch_builds_a_wrapper_subclass(inference):
    """native.new_tensor builds every neuron tensor in place of torch.Tensor._make_wrapper_subclass: what
    PyTorch sees of one (dispatch keys, device, view, autograd state, inference mode) must be the same."""
    from torchneuron.runtime.tensor import NeuronTensor

    with torch.inference_mode(inference):
        base = torch.arange(24.0, device="neuron:1")
        x = base.view(4, 6)[1:, ::2]
        reference = torch.Tensor._make_wrapper_subclass(NeuronTensor, x.shape, strides=x.stride(),
                                                        storage_offset=x.storage_offset(), dtype=x.dtype,
                                                        device=x.device)
    assert type(x) is NeuronTensor
    assert torch._C._dispatch_keys(x) == torch._C._dispatch_keys(reference)
    for fact in ("device", "shape", "dtype", "requires_grad", "is_leaf", "grad_fn", "layout"):
        assert getattr(x, fact) == getattr(reference, fact), fact
    assert (x.stride(), x.storage_offset(), x.is_contiguous(), x.is_inference()) == \
        (reference.stride(), reference.storage_offset(), reference.is_contiguous(), reference.is_inference())
    assert x.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert_same(x, torch.arange(24.0).view(4, 6)[1:, ::2])


def test_tensor_resize_and_set_to_a_storage():
    x = torch.zeros(4, device="neuron")
    x.resize_(10)
    assert x.untyped_storage().nbytes() == 40
    y = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], device="neuron")
    z = torch.empty(0, device="neuron")
    z.set_(y.untyped_storage(), 2, (2, 2), (1, 2))
    assert z.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    assert_same(z, torch.tensor([[3.0, 5.0], [4.0, 6.0]]))
    y.add_(10)
    assert_same(z, torch.tensor([[13.0, 15.0], [14.0, 16.0]]))
    w = torch.empty(0, device="neuron").set_(y.untyped_storage())
    assert w.shape == (6,)
    # an explicit empty stride means contiguous, for a storage and for a tensor source alike
    for source in (y.untyped_storage(), y):
        v = torch.empty(0, device="neuron").set_(source, 1, (2, 2), [])
        assert v.stride() == (2, 1)
        assert_same(v, torch.tensor([[12.0, 13.0], [14.0, 15.0]]))


@pytest.mark.parametrize("device", ["neuron", "neuron:1"])
def test_a_storage_pytorch_allocates_holds_what_tensors_write_to_it(device):
    """torch.UntypedStorage(n, device=...) is made by the device's allocator, with no tensor: it keeps its
    bytes as a CPU storage does, while tensors come and go (it crashed the process before)."""
    import gc

    placed = torch.device("neuron", torch.device(device).index or 0)
    gc.collect()  # earlier tests' garbage, which the collections below would otherwise free from the count
    before = torch.neuron.memory_allocated(placed)
    storage = torch.UntypedStorage(16, device=device)
    assert storage.device == placed and storage.nbytes() == 16
    view = torch.empty(0, device=device).set_(storage, 0, (4,), (1,))
    assert view.untyped_storage() is storage and view.device == placed
    view.fill_(3.0)
    del view
    gc.collect()
    assert_same(torch.empty(0, device=device).set_(storage, 0, (4,), (1,)), torch.full((4,), 3.0))
    storage.resize_(32)
    storage.copy_(torch.arange(8.0).untyped_storage())
    assert torch.empty(0).set_(storage.cpu(), 0, (8,), (1,)).tolist() == list(range(8))
    del storage
    gc.collect()
    assert torch.neuron.memory_allocated(placed) == before


@pytest.mark.parametrize("device", ["neuron", "neuron:1"])
def test_a_storage_taken_from_a_tensor_keeps_its_bytes_after_the_tensor(device):
    """As on CUDA, `t.untyped_storage()` owns the memory: it outlives every tensor that viewed it (it raised
    before), a tensor set to it later reads the bytes, and the memory goes, without a garbage collection,
    when the last holder does."""
    import gc

    placed = torch.device(device)
    gc.collect()
    before = torch.neuron.memory_allocated(placed)
    x = torch.arange(6.0, device=device)
    storage = x.untyped_storage()
    address = x.data_ptr()
    del x
    assert torch.neuron.memory_allocated(placed) == before + 24
    assert storage.data_ptr() == address and storage.nbytes() == 24
    assert torch.empty(0).set_(storage.cpu(), 0, (6,), (1,)).tolist() == list(range(6))
    again = torch.empty(0, device=device).set_(storage, 2, (2, 2), (2, 1))
    assert again.data_ptr() == address + 8
    assert_same(again, torch.tensor([[2.0, 3.0], [4.0, 5.0]]))
    del again
    storage.resize_(8)
    assert storage.data_ptr() != address and torch.neuron.memory_allocated(placed) == before + 8
    assert torch.empty(0).set_(storage.cpu(), 0, (2,), (1,)).tolist() == [0.0, 1.0]
    del storage
    assert torch.neuron.memory_allocated(placed) == before
    y = torch.ones(100, device=device)
    del y
    assert torch.neuron.memory_allocated(placed) == before


def test_streams_and_events():
    s = torch.neuron.Stream()
    assert isinstance(s, torch.Stream) and s.device == torch.device("neuron", 0)
    assert s != torch.neuron.default_stream() and torch.neuron.current_stream() == torch.neuron.default_stream()
    x = torch.randn(512, 512, device="neuron")
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream() == s
        y = x @ x
        y.record_stream(s)
    torch.neuron.current_stream().wait_stream(s)
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    # from before the record: the thread may wait for the GIL (a compile thread lowering) after the event's time
    began = time.perf_counter()
    start.record()
    for _ in range(8):
        y = y @ x / 512
    end.record()
    end.synchronize()
    host = (time.perf_counter() - began) * 1000
    assert end.query()
    elapsed = start.elapsed_time(end)
    assert 0 < elapsed <= host + 1.0  # the event timed the queued work, which the host waited for
    untimed = torch.neuron.Event()
    untimed.record()
    with pytest.raises(ValueError, match="enable_timing"):  # torch.Event's own check
        start.elapsed_time(untimed)
    # torch's generic events and synchronize go through the same device guard
    e1, e2 = torch.Event(device="neuron", enable_timing=True), torch.Event(device="neuron", enable_timing=True)
    e1.record()
    z = (y @ x).sum()
    e2.record()
    torch.accelerator.synchronize()
    assert e1.elapsed_time(e2) > 0 and z.device.type == "neuron"


def test_device_properties_and_cuda_named_memory_stats():
    props = torch.neuron.get_device_properties(1)
    assert props.total_memory > 0 and props.index == 1
    assert (props.major, props.minor) == torch.neuron.get_device_capability(1) and not props.is_integrated
    assert props.uuid != torch.neuron.get_device_properties(0).uuid
    free, total = torch.neuron.mem_get_info(0)
    assert total == torch.neuron.get_device_properties(0).total_memory and 0 < free <= total
    torch.neuron.synchronize()
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.memory_allocated()
    x = torch.empty(256, 256, device="neuron")
    stats = torch.neuron.memory_stats()
    for name in ("allocated_bytes", "active_bytes", "reserved_bytes"):
        assert stats[f"{name}.all.current"] == base + x.nbytes
        assert stats[f"{name}.all.peak"] == base + x.nbytes
    assert stats["num_alloc_retries"] == 0 and "num_ooms" in stats  # its count: test_bad_input's OOM test
    assert torch.accelerator.memory_stats()["active_bytes.all.peak"] == base + x.nbytes
    assert torch.neuron.memory_cached() == torch.neuron.memory_reserved() == base + x.nbytes  # older names
    # torch.cuda.memory's names, and torch.accelerator.memory's (whose functions call each other)
    assert torch.neuron.memory.memory_allocated() == torch.accelerator.memory.memory_allocated() == base + x.nbytes


def test_accelerator_device_capability_names_the_dtypes_tensors_hold():
    supported = torch.accelerator.get_device_capability("neuron:1")["supported_dtypes"]
    candidates = [getattr(torch, name) for name in dir(torch) if isinstance(getattr(torch, name), torch.dtype)]
    for dtype in set(candidates):
        try:
            torch.empty(2, dtype=dtype, device="neuron")
            holds = True
        except (NotImplementedError, RuntimeError):
            holds = False
        assert holds == (dtype in supported), dtype
    assert {torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.complex32} <= supported
