"""torch.neuron: the device module, registration and torch.accelerator."""
import subprocess
import sys

import pytest
import torch


def test_import_torch_alone_finds_the_device():
    code = "import torch; x = torch.ones(2, device='neuron'); print(x.device, torch.accelerator.current_accelerator())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["neuron:0", "neuron"]


def _set_or_unset(monkeypatch, name: str, value) -> None:
    """The environment variable set to `value` for the test, or unset for None (the default)."""
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)


# after `import torch`: how many objects are frozen, and whether a reference cycle made afterwards is collected
_FROZEN_AND_COLLECTED = """
import gc, weakref, torch
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a
alive = weakref.ref(a)
del a, b
gc.collect()
print(gc.get_freeze_count(), alive() is None)
"""


@pytest.mark.parametrize("setting, frozen", [(None, True), ("0", False)])
def test_import_freezes_the_import_time_objects_and_later_cycles_are_collected(monkeypatch, setting, frozen):
    _set_or_unset(monkeypatch, "TORCHNEURON_GC_FREEZE", setting)
    out = subprocess.run([sys.executable, "-c", _FROZEN_AND_COLLECTED], capture_output=True, text=True, check=True)
    count, collected = out.stdout.split()
    assert (int(count) > 100_000) == frozen
    assert collected == "True"


def test_module_basics():
    assert torch.neuron.is_available()
    assert torch.neuron.device_count() >= 1
    assert torch.neuron.current_device() == 0
    assert "neuron" in torch.neuron.get_device_name()
    props = torch.neuron.get_device_properties(0)
    assert props.platform == "cpu"
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("neuron")


def test_tensor_reports_device_index():
    x = torch.randn(3, device="neuron")
    assert x.device == torch.device("neuron", 0)
    assert x.is_neuron if hasattr(x, "is_neuron") else x.device.type == "neuron"


def test_device_index_out_of_range():
    with pytest.raises(RuntimeError, match="Invalid device ordinal"):
        torch.neuron.set_device(torch.neuron.device_count())


MULTI_DEVICE = """
import torch
assert torch.neuron.device_count() == 2, torch.neuron.device_count()
a = torch.arange(6.).reshape(2, 3).to("neuron:1")
assert a.device == torch.device("neuron", 1)
b = (a * 2).sum(0)
assert b.device.index == 1 and b.cpu().tolist() == [6.0, 10.0, 14.0]
with torch.neuron.device(1):
    assert torch.neuron.current_device() == 1
    c = torch.ones(2, device="neuron")
    assert c.device.index == 1
assert torch.neuron.current_device() == 0
d = a.to("neuron:0")
assert d.device.index == 0 and torch.equal(d.cpu(), a.cpu())
try:
    a + torch.ones(2, 3, device="neuron:0")
except RuntimeError as e:
    assert "same device" in str(e)
else:
    raise AssertionError("mixing devices must raise")
p = torch.nn.Linear(3, 1).to("neuron:1")
assert p(a).device.index == 1
# the buffers themselves are on the second device, also for results that depend on no input buffer
def placed(t):
    return {d.id for d in t._storage.buffer.devices()}
made = [torch.ones(3, device="neuron:1"), torch.arange(3, device="neuron:1"), torch.randn(3, device="neuron:1"),
        torch.empty(3, device="neuron:1").fill_(2.0), torch.zeros(3, device="neuron:1") * 2]
assert all(placed(t) == {1} for t in made), [placed(t) for t in made]
with torch.neuron.adaptive_eager():
    for _ in range(2):
        queued = torch.full((2,), 3.0, device="neuron:1") + 1
assert placed(queued) == {1} and queued.cpu().tolist() == [4.0, 4.0]
print("ok")
"""


def test_device_count_follows_platform():
    env = {"TORCHNEURON_CPU_DEVICES": "2", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", MULTI_DEVICE], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_unknown_platform_is_a_clear_error():
    code = "import torch; print(torch.neuron.is_available(), torch.neuron.device_count())"
    env = {"TORCHNEURON_PLATFORM": "no_such_platform", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.split() == ["False", "0"], out.stderr[-2000:]


def test_rng_seeding_reproduces():
    torch.neuron.manual_seed(123)
    a = torch.randn(8, device="neuron")
    torch.manual_seed(123)  # torch.manual_seed seeds every device, as for cuda
    b = torch.randn(8, device="neuron")
    assert torch.equal(a.cpu(), b.cpu())
    assert torch.neuron.initial_seed() == 123


def test_rng_state_roundtrip():
    torch.neuron.manual_seed(7)
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    a = torch.rand(5, device="neuron")
    torch.neuron.set_rng_state(state)
    b = torch.rand(5, device="neuron")
    assert torch.equal(a.cpu(), b.cpu())
    c = torch.rand(5, device="neuron")
    assert not torch.equal(b.cpu(), c.cpu())


def test_fork_rng_covers_neuron():
    torch.manual_seed(0)
    with torch.random.fork_rng(device_type="neuron"):
        inside = torch.rand(3, device="neuron")
    after = torch.rand(3, device="neuron")
    assert torch.equal(inside.cpu(), after.cpu())


def test_synchronize_streams_events():
    x = torch.randn(256, 256, device="neuron")
    stream = torch.neuron.current_stream()
    assert stream == torch.neuron.default_stream()
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    start.record()
    y = x @ x
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0
    assert end.query()
    s = torch.neuron.Stream()
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream() is s
        z = y + 1
    s.synchronize()
    torch.neuron.synchronize()
    assert torch.neuron.current_stream() == torch.neuron.default_stream()
    assert z.shape == (256, 256)


def test_sync_debug_mode_flags_operations_that_wait_to_read_values_on_the_host():
    """As torch.cuda.set_sync_debug_mode: reading values on the host (.item(), .cpu(), a shape that depends on the
    values, a CPU fallback) warns or raises; device work and explicit synchronisation do not."""
    import warnings

    x = torch.arange(6.0, device="neuron")
    mask = x > 2
    synchronizing = [lambda: x.sum().item(), lambda: x.cpu(), lambda: x[mask], lambda: x.nonzero(),
                     lambda: torch.equal(x, x), lambda: bool(x[1]), lambda: x.unique()]
    asynchronous = [lambda: x * 2 + 1, lambda: torch.where(mask, x, 0), lambda: x.sort(), lambda: x.to("neuron:1"),
                    lambda: torch.ones(2).to("neuron"), torch.neuron.synchronize]
    assert torch.neuron.get_sync_debug_mode() == 0
    try:
        torch.neuron.set_sync_debug_mode("error")
        assert torch.neuron.get_sync_debug_mode() == 2
        for operation in synchronizing:
            with pytest.raises(RuntimeError, match="^called a synchronizing neuron operation$"):
                operation()
        for operation in asynchronous:
            operation()
        torch.neuron.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x.tolist()
        assert [str(w.message) for w in caught] == ["called a synchronizing neuron operation"]
        assert caught[0].filename == __file__  # the user's line, not torchneuron's
        with pytest.raises(RuntimeError, match="expected one of `default`, `warn`, `error`"):
            torch.neuron.set_sync_debug_mode("loud")
    finally:
        torch.neuron.set_sync_debug_mode("default")
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_memory_accounting():
    torch.neuron.synchronize()
    base = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    x = torch.empty(1024, 1024, device="neuron")
    assert torch.neuron.memory_allocated() - base == 4 * 1024 * 1024
    del x
    assert torch.neuron.memory_allocated() == base
    assert torch.neuron.max_memory_allocated() >= base + 4 * 1024 * 1024
    stats = torch.neuron.memory_stats()
    assert stats["allocated_bytes.all.current"] == base


def test_per_process_memory_fraction_refuses_storages_past_it_as_cuda():
    torch.neuron.synchronize()
    held = torch.neuron.memory_allocated()
    total = torch.neuron.mem_get_info()[1]
    mib = 2 ** 20
    torch.neuron.set_per_process_memory_fraction((held + 9 * mib) / total)
    try:
        assert torch.neuron.get_per_process_memory_fraction() == (held + 9 * mib) / total
        x = torch.ones(mib, device="neuron")  # 4 MiB
        ooms = torch.neuron.memory_stats()["num_ooms"]
        with pytest.raises(torch.OutOfMemoryError, match="set_per_process_memory_fraction"):
            torch.ones(2 * mib, device="neuron")  # a factory's 8 MiB
        with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate 8.00 MiB"):
            torch.cat([x, x])  # an op's 8 MiB result
        assert torch.neuron.memory_stats()["num_ooms"] == ooms + 2
        assert torch.neuron.memory_allocated() == held + 4 * mib  # what was refused is given back
        del x
        y = torch.ones(2 * mib, device="neuron")  # freed memory counts again
        assert y.sum().item() == 2 * mib
        del y
    finally:
        torch.neuron.set_per_process_memory_fraction(1.0)
    x = torch.ones(4 * mib, device="neuron")
    assert torch.neuron.get_per_process_memory_fraction() == 1.0
    with pytest.raises(ValueError, match="Allowed range: 0~1"):
        torch.neuron.set_per_process_memory_fraction(1.5)
    with pytest.raises(TypeError, match="must be `float`"):
        torch.neuron.set_per_process_memory_fraction(1)


def test_cuda_functions_that_ask_about_capture_and_peers():
    torch.neuron.init()
    assert torch.neuron.is_current_stream_capturing() is False
    assert torch.neuron.can_device_access_peer(0, 1) and torch.neuron.can_device_access_peer("neuron:1", 0)
    with pytest.raises(AssertionError, match="Invalid peer device id"):
        torch.neuron.can_device_access_peer(0, torch.neuron.device_count())


def test_empty_cache_keeps_executables_and_clear_executable_cache_drops_them():
    x = torch.ones(3, device="neuron")
    x + 1
    entries = torch.neuron.cache_stats()["entries"]
    assert entries > 0
    torch.neuron.empty_cache()  # releases memory, not executables: nothing recompiles
    assert torch.neuron.cache_stats()["entries"] == entries
    torch.neuron.clear_executable_cache()
    assert torch.neuron.cache_stats()["entries"] == 0
    assert (x + 1).cpu().tolist() == [2.0, 2.0, 2.0]


# page faults of writing a freed-and-reallocated 24 MB host block (a program run's buffers on XLA:CPU), then of
# the same after torch.neuron.empty_cache()
_FREED_HOST_MEMORY_REUSED = """
import ctypes, resource, torch
torch.ones(1, device="neuron").cpu()  # the first device use, run (not compiling on a compile thread meanwhile)
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
def faults_of_a_run():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(24 << 20)
    ctypes.memset(block, 1, 24 << 20)
    libc.free(ctypes.c_void_p(block))
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_a_run()
print(max(faults_of_a_run() for _ in range(3)))
torch.neuron.empty_cache()
print(faults_of_a_run())
"""


@pytest.mark.parametrize("setting, kept", [(None, True), ("0", False)])
def test_xla_cpu_keeps_freed_host_memory_until_empty_cache(monkeypatch, setting, kept):
    _set_or_unset(monkeypatch, "TORCHNEURON_KEEP_HOST_MEMORY", setting)
    out = subprocess.run([sys.executable, "-c", _FREED_HOST_MEMORY_REUSED], capture_output=True, text=True,
                         check=True, timeout=300)
    reused, after_empty_cache = map(int, out.stdout.split())
    assert (reused < 100) == kept, reused  # glibc's defaults fault most of the block's 6144 pages in again
    if kept:
        assert after_empty_cache > 500  # its pages were given back


def test_deepcopy_is_a_counted_allocation_with_its_own_buffer():
    import copy

    x = torch.arange(6.0, device="neuron")
    base = torch.neuron.memory_allocated()
    y = copy.deepcopy(x)
    assert torch.neuron.memory_allocated() - base == 24
    y.add_(1.0)  # donates y's buffer: x must not share it
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert y.cpu().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    del y
    assert torch.neuron.memory_allocated() == base


def test_amp_dtypes_advertised():
    assert torch.bfloat16 in torch.neuron.get_amp_supported_dtype()
    assert torch.neuron.is_bf16_supported()


def test_every_patch_is_applied():
    import torchneuron.compile  # noqa: F401  (the compile patches apply when the backend loads)
    from torchneuron import patches

    applied = patches.applied()
    assert len(applied) >= 7 and all(applied.values()), applied


def test_torch_accelerator_api_reaches_neuron():
    x = torch.ones(256, device="neuron")
    torch.accelerator.synchronize()
    assert torch.accelerator.memory_allocated() == torch.neuron.memory_allocated() >= x.numel() * 4
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.set_device_index(0)
    assert torch.get_device_module("neuron") is torch.neuron


def test_accelerator_empty_host_cache_once_the_device_is_in_use():
    # it asked for a C++ host allocator neuron does not register and crashed the process (vLLM calls it at exit)
    code = ("import torch; x = torch.ones(2, device='neuron'); p = torch.ones(4).pin_memory(); "
            "torch.accelerator.empty_host_cache(); print(p.is_pinned(), x.sum().item())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "2.0"]


def test_accumulated_memory_statistics_their_reset_and_the_summary():
    torch.neuron.synchronize()
    # routed to torch.neuron (PyTorch's failed an internal assert: neuron has no C++ DeviceAllocator)
    torch.accelerator.reset_accumulated_memory_stats()
    base = torch.neuron.memory_allocated()
    x = torch.empty(1024, device="neuron")
    y = torch.empty(256, device="neuron")
    del x
    stats = torch.neuron.memory_stats()
    assert stats["allocation.all.allocated"] == 2
    assert stats["allocated_bytes.all.allocated"] == 4 * (1024 + 256)
    assert stats["allocated_bytes.all.freed"] == 4 * 1024
    assert stats["allocated_bytes.all.current"] == base + 4 * 256
    assert torch.neuron.memory_stats_as_nested_dict()["allocated_bytes"]["all"]["freed"] == 4 * 1024
    summary = torch.neuron.memory_summary()
    assert "memory summary, device ID 0" in summary and "5.00 KiB" in summary and "4.00 KiB" in summary
    torch.neuron.reset_accumulated_memory_stats()
    stats = torch.neuron.memory_stats()
    assert stats["allocation.all.allocated"] == stats["allocated_bytes.all.freed"] == 0
    del y
    assert torch.neuron.memory_stats()["allocated_bytes.all.freed"] == 4 * 256


def test_device_memory_info_through_torch_accelerator():
    free, total = torch.accelerator.get_memory_info()  # PyTorch's asserted: neuron has no C++ DeviceAllocator
    assert total == torch.neuron.mem_get_info()[1] and 0 < free <= total
    assert 0 < torch.neuron.device_memory_used() <= total
