"""CPU fallback (visible, counted, can be an error), PyTorch's error types, the executable cache."""
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same
from torch.fx.experimental import proxy_tensor

import torchneuron
from torchneuron.eager import executable, fallback
from torchneuron.ops import registry, rules
from torchneuron.runtime.platform import jax_device
from torchneuron.runtime.program import StorageProgram

aten = torch.ops.aten


@pytest.fixture
def unlowered_op(monkeypatch):
    """hardtanh with its lowering (and decomposition) hidden, as if no one had written it yet."""
    op = aten.hardtanh.default
    monkeypatch.delitem(registry.LOWERINGS, op)
    monkeypatch.setattr(rules, "_DECOMPOSED", {op: None})
    monkeypatch.setattr(rules, "_RULES", {})
    from torchneuron.eager import dispatch

    monkeypatch.setattr(dispatch, "_HANDLERS", {})
    monkeypatch.setattr(fallback, "_warned", set())
    fallback.reset()
    return op


@torch.library.custom_op("torchneuron_test::scaled_add", mutates_args=())
def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x + alpha * y.sin()


def test_custom_op_for_every_device_runs_on_neuron_not_on_the_cpu():
    """A torch.library.custom_op without device_types is PyTorch code: it runs on neuron tensors."""
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    fallback.reset()
    with fallback.as_error():
        result = scaled_add(x.to("neuron"), y.to("neuron"), 0.5)
    assert result.device.type == "neuron"
    torch.testing.assert_close(result.cpu(), scaled_add(x, y, 0.5))
    assert not fallback.counts


@torch.library.custom_op("torchneuron_test::neuron_only", mutates_args=(), device_types="neuron")
def neuron_only(x: torch.Tensor) -> torch.Tensor:
    return x * 3 + 1


@torch.library.custom_op("torchneuron_test::two_kernels", mutates_args=())
def two_kernels(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@two_kernels.register_kernel("neuron")
def _(x):
    return x + 2  # distinguishable from the default kernel


def test_custom_op_kernels_for_neuron_run_on_neuron():
    """Kernels registered for the neuron device (device_types="neuron", register_kernel("neuron"),
    torch.library.impl(..., "PrivateUse1") as FSDP2's fsdp.* ops) are the ones neuron tensors reach."""
    x = torch.randn(4, 5)
    fallback.reset()
    with fallback.as_error():
        only, two = neuron_only(x.to("neuron")), two_kernels(x.to("neuron"))
    assert only.device.type == "neuron" and two.device.type == "neuron"
    torch.testing.assert_close(only.cpu(), x * 3 + 1)
    torch.testing.assert_close(two.cpu(), x + 2)
    assert not fallback.counts


def test_fallback_is_counted_warned_and_correct(unlowered_op):
    x = torch.randn(10) * 3
    with pytest.warns(UserWarning, match="hardtanh"):
        got = unlowered_op(x.to("neuron"))
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), torch.nn.functional.hardtanh(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warns once per op only
        unlowered_op(x.to("neuron"))
    assert torchneuron.fallback_report() == {"aten.hardtanh.default": 2}
    assert torch.neuron.fallback_report() == torchneuron.fallback_report()


torch.library.define("torchneuron_test::without_meta_kernel", "(Tensor x) -> Tensor")
torch.library.impl("torchneuron_test::without_meta_kernel", "CPU", lambda x: x.clamp(-1, 1))


def test_a_lowered_op_without_a_meta_kernel_runs_on_the_cpu(monkeypatch):
    """A release of PyTorch may lack a lowered op's meta kernel (torch 2.11 had none for _standard_gamma):
    without output metadata no program can be built, so the op falls back, visibly, where it raised."""
    op = torch.ops.torchneuron_test.without_meta_kernel.default
    monkeypatch.setitem(registry.LOWERINGS, op, lambda x: x.clip(-1, 1))
    fallback.reset()
    x = torch.randn(10) * 3
    with pytest.warns(UserWarning, match="without_meta_kernel"):
        got = op(x.to("neuron"))
    torch.testing.assert_close(got.cpu(), x.clamp(-1, 1))
    assert torchneuron.fallback_report() == {"torchneuron_test.without_meta_kernel.default": 1}


def test_an_op_is_looked_up_in_pytorchs_decompositions_without_building_their_whole_table(monkeypatch):
    """Each op's decomposition is the one PyTorch's tables give it (its own or its composite kernel's), found
    without walking every composite op: a warm start that meets .item() skips that tenth of a second."""
    from torch._decomp import decomposition_table

    whole = rules._decomposition_table()
    ops = set(whole) | set(decomposition_table) | set(registry.LOWERINGS)
    ops |= {packet.default for packet in (aten._local_scalar_dense, aten.linear, aten.matmul, aten.dropout)}
    for op in ops:
        found, expected = rules._decomposition_of(op), whole.get(op)
        assert (found is None) == (expected is None), op
        if expected in decomposition_table.values() or found in decomposition_table.values():
            assert found is expected, op
    monkeypatch.setattr(rules, "_decomposition_table", None)
    monkeypatch.setattr(rules, "_DECOMPOSED", {})
    assert rules.lowering_for(aten._local_scalar_dense.default) is None
    assert rules.lowering_for(aten.linear.default) is not None


def test_a_decompositions_graph_is_traced_once_per_signature(monkeypatch):
    """A lowering made from PyTorch's decomposition runs make_fx once per signature (the arrays' shapes and dtypes,
    the other arguments' values), however often it is traced: adaptive eager traces each queued op's program again
    in its fused program. A float constant is told apart by its bits."""
    traces = []
    make_fx = proxy_tensor.make_fx
    monkeypatch.setattr(proxy_tensor, "make_fx", lambda *args, **kwargs: traces.append(1) or make_fx(*args, **kwargs))
    monkeypatch.setattr(rules, "_GRAPHS", {})
    lowering = rules.lowering_for(aten.hardshrink.default)
    x = torch.linspace(-1, 1, 9)
    for values, lambd in ((x, 0.5), (x, 0.25), (x, 0.5), (x, -0.0), (x, 0.0), (x[:5], 0.5), (x[:5], 0.5)):
        got = lowering(jnp.asarray(values.numpy()), lambd)
        torch.testing.assert_close(torch.from_numpy(np.asarray(got)), F.hardshrink(values, lambd))
    assert len(traces) == 5
    # a setting decompositions read (max_pool2d_with_indices_backward's declines in deterministic mode)
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    lowering(jnp.asarray(x.numpy()), 0.5)
    assert len(traces) == 6
    # a tensor among the other arguments, which may change after a graph took it: traced each time, not kept
    flat, spec = torch.utils._pytree.tree_flatten(((jnp.ones(3), torch.ones(2)), {}))
    for _ in range(2):
        rules._decomposition_graph(lambda a, t: a + 1, flat, spec, [True, False])
    assert len(traces) == 8 and len(rules._GRAPHS) == 6


def test_fallback_inplace_writes_back(unlowered_op):
    x = torch.randn(3, 4) * 3
    y = x.to("neuron")
    aten.hardtanh_.default(y.t()[1])
    aten.hardtanh_.default(x.t()[1])
    torch.testing.assert_close(y.cpu(), x)


@pytest.fixture
def add_on_the_cpu():
    """In-place and out= add run by the CPU fallback (torchneuron.library.force_cpu)."""
    ops = (aten.add_.Tensor, aten.add.out)
    for op in ops:
        torchneuron.library.force_cpu(op)
    yield
    for op in ops:
        torchneuron.library.force_cpu(op, False)


def test_fallback_views_of_one_storage_alias_as_on_the_cpu(add_on_the_cpu):
    """The fallback reads each storage once and gives the CPU kernel the tensors' views of it: what one view writes
    the others see, and a write overlapping a read is refused as on the CPU (not computed on separate copies)."""
    cpu = torch.arange(8.0)
    neuron = cpu.to("neuron")
    for base in (cpu, neuron):
        base[:4].add_(base[4:])
        torch.add(base[:2], base[4:6], out=base[6:])
    assert_same(neuron, cpu)
    for base in (cpu, neuron):
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            base[2:6].add_(base[:4])


@pytest.mark.parametrize("device", ["neuron:0", "neuron:1"])
def test_fallback_writes_views_of_large_storages_and_results_on_their_device(add_on_the_cpu, device):
    """A row of a storage too large to read for it is copied on its own and written back by copy_; the storages
    written and the new results stay on the tensors' device."""
    cpu = torch.arange(300 * 256.0).view(300, 256)
    neuron = cpu.to(device)
    for base in (cpu, neuron):
        base[7].add_(base[0, :256])
        base[:, 0].add_(base[:, 1])
    assert_same(neuron, cpu)
    small = torch.arange(4.0, device=device)
    out = torch.empty(4, device=device)
    torch.add(small, small, out=out)
    small.add_(1)
    assert out.tolist() == [0.0, 2.0, 4.0, 6.0] and small.tolist() == [1.0, 2.0, 3.0, 4.0]
    for tensor in (neuron, small, out):
        assert tensor._storage.buffer.devices() == {jax_device(torch.device(device).index)}
    assert fallback.report()["aten.add_.Tensor"] >= 5


def test_strict_mode_makes_fallback_an_error(unlowered_op, monkeypatch):
    monkeypatch.setenv("TORCHNEURON_FALLBACK", "error")
    with pytest.raises(NotImplementedError, match="hardtanh.*TORCHNEURON_FALLBACK"):
        unlowered_op(torch.randn(3, device="neuron"))


@pytest.mark.parametrize(
    "bad",
    [
        lambda d: torch.randn(3, device=d) + torch.randn(4, device=d),
        lambda d: torch.randn(3, 4, device=d) @ torch.randn(3, 4, device=d),
        lambda d: torch.randn(3, device=d).view(2, 2),
        lambda d: torch.randn(2, 3, device=d).t().view(6),
        lambda d: torch.cat([torch.randn(2, 3, device=d), torch.randn(2, 4, device=d)]),
        lambda d: torch.randn(3, device=d).sum(dim=2),
        lambda d: torch.zeros(3, dtype=torch.int64, device=d).add_(1.5),
        lambda d: torch.randn(3, device=d)[5],
    ],
)
def test_bad_input_raises_the_cpu_exception_type(bad):
    with pytest.raises(Exception) as on_cpu:
        bad("cpu")
    with pytest.raises(Exception) as on_neuron:
        bad("neuron")
    assert on_neuron.type is on_cpu.type
    assert "jax" not in str(on_neuron.value).lower()


def test_executable_cache_hits_and_bounds():
    stats = torch.neuron.cache_stats()
    x = torch.randn(7, 5, device="neuron")
    x * 3.25
    before = torch.neuron.cache_stats()
    for scale in [1.5, 2.5, 3.5]:  # a new float does not compile a new executable
        x * scale
    after = torch.neuron.cache_stats()
    assert after["misses"] == before["misses"]
    assert after["hits"] >= before["hits"] + 3
    assert stats["capacity"] > 0


def test_cache_evicts_when_full():
    code = (
        "import torch\n"
        "for n in range(1, 9): torch.ones(n, device='neuron') + 1\n"
        "s = torch.neuron.cache_stats(); print(s['entries'], s['evictions'])"
    )
    env = {"TORCHNEURON_EAGER_CACHE_SIZE": "4", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    entries, evictions = map(int, out.stdout.split())
    assert entries == 4 and evictions > 0


def _op_programs_on_disk(directory) -> list:
    return list(directory.glob("ops/*/*.xla"))


def test_eager_programs_found_on_disk_are_neither_traced_nor_lowered(own_disk_cache, monkeypatch):
    """A process finds the op programs another stored (the executable cache dropped here stands for a new process):
    they run as compiled, with their device-side checks."""
    x = torch.randn(3, 11)
    index = torch.tensor([1, 12])
    expected = (x * 2.5).softmax(-1)
    torch.testing.assert_close((x.to("neuron") * 2.5).softmax(-1).cpu(), expected)
    with pytest.raises(IndexError):
        x.to("neuron")[0][index.to("neuron")].cpu()
    stored = _op_programs_on_disk(own_disk_cache)
    assert len(stored) >= 3
    torch.neuron.clear_executable_cache()

    def refuse(*args, **kwargs):
        raise AssertionError("an op program was traced")

    monkeypatch.setattr(StorageProgram, "jit", refuse)
    torch.testing.assert_close((x.to("neuron") * 2.5).softmax(-1).cpu(), expected)
    with pytest.raises(IndexError):
        x.to("neuron")[0][index.to("neuron")].cpu()
    assert _op_programs_on_disk(own_disk_cache) == stored


def test_a_stored_program_keeps_its_outputs_plan_so_its_meta_kernel_runs_no_more(own_disk_cache, monkeypatch):
    """An op program on disk carries its outputs' plan (several outputs, one written in place), so a later process
    builds its outputs without PyTorch's meta kernel and argument checks; but for a signature taking a number,
    whose checks may read its value (a fill value out of its dtype's range), and one resizing an out= (its meta
    kernel warns where the out= held elements, as the CPU's kernel does), which ask again."""
    x, y = torch.randn(4, 6), torch.randn(4, 6)

    def ops(a, b):
        values, indices = a.max(dim=1)
        product = a.clone()
        product.mul_(b)
        total = torch.empty(0, device=a.device)
        torch.add(a, b, out=total)
        return values, indices, product, total, a * 2.5

    expected = ops(x, y)
    for got, want in zip(ops(x.to("neuron"), y.to("neuron")), expected):
        torch.testing.assert_close(got.cpu(), want)
    torch.neuron.clear_executable_cache()
    asked = []
    outputs_from_meta = executable.Executable._outputs_from_meta

    def asking(self, op, *args):
        asked.append(op.func)
        return outputs_from_meta(self, op, *args)

    monkeypatch.setattr(executable.Executable, "_outputs_from_meta", asking)
    for got, want in zip(ops(x.to("neuron"), y.to("neuron")), expected):
        torch.testing.assert_close(got.cpu(), want)
    assert asked == [aten.add.out, aten.mul.Tensor]


def test_an_executable_jax_loaded_from_its_own_cache_is_not_stored(own_disk_cache):
    """Serialized again, an executable JAX loaded from its persistent cache lacks kernels (XLA:CPU: "Function
    add_bitcast_fusion not found" in the process that loads it), so only executables compiled here are stored."""
    x = torch.randn(5, 13)
    expected = x.sqrt() + 1
    torch.testing.assert_close((x.to("neuron").sqrt() + 1).cpu(), expected, equal_nan=True)
    for stored in _op_programs_on_disk(own_disk_cache):
        stored.unlink()
    torch.neuron.clear_executable_cache()
    jax.clear_caches()
    torch.testing.assert_close((x.to("neuron").sqrt() + 1).cpu(), expected, equal_nan=True)
    assert _op_programs_on_disk(own_disk_cache) == []


def test_stored_executables_that_cannot_run_are_compiled_again(own_disk_cache, unrunnable_stored_executables):
    """An eager op's or a fused queue's executable that loads from disk but cannot run is traced and compiled
    afresh at its first run, which it failed without consuming its inputs: right results on neuron, no CPU
    fallback, no replay of the queue op by op; the unrunnable executable runs no more."""
    x, w = torch.randn(4, 7), torch.randn(7)

    def step(a, b):
        return ((a * 3.5 + b).relu() * 0.5).sum(0)

    expected = step(x, w)
    with torch.neuron.adaptive_eager():
        for _ in range(3):  # the queue's structure seen twice: its fused program compiled and stored
            torch.testing.assert_close(step(x.to("neuron"), w.to("neuron")).cpu(), expected)
    assert _op_programs_on_disk(own_disk_cache) and list(own_disk_cache.glob("fused/*/*.xla"))
    torch.neuron.clear_executable_cache()
    replays = torch.neuron.adaptive_eager_stats()["replays"]
    for adaptive in (False, True, True, True):
        with torch.neuron.adaptive_eager(adaptive):
            torch.testing.assert_close(step(x.to("neuron"), w.to("neuron")).cpu(), expected)
        if not adaptive:
            failed = len(unrunnable_stored_executables)
            assert failed >= 3  # every op of the step loaded its program, which failed once
    assert len(unrunnable_stored_executables) == failed + 1  # the fused program's, once
    assert torch.neuron.adaptive_eager_stats()["replays"] == replays


def test_stored_op_programs_this_runtime_cannot_load_are_compiled_again(own_disk_cache, monkeypatch):
    """An op program on disk that this runtime refuses to load (another runtime's) still counts as compiled,
    so adaptive eager queues it; at its first run, alone or in a queue run op by op, it is traced and
    compiled: right results on neuron, no CPU fallback."""
    from jax.experimental import serialize_executable

    x, w = torch.randn(3, 17), torch.randn(17)  # shapes of its own: JAX's cache must not hold its programs

    def step(a, b):
        return ((a * 2.5 - b).tanh() * 0.5).sum(1)

    expected = step(x, w)
    torch.testing.assert_close(step(x.to("neuron"), w.to("neuron")).cpu(), expected)
    assert _op_programs_on_disk(own_disk_cache)

    def refuse(*args, **kwargs):
        raise RuntimeError("built for another runtime")

    monkeypatch.setattr(serialize_executable, "deserialize_and_load", refuse)
    monkeypatch.setenv("TORCHNEURON_FALLBACK", "error")
    for adaptive in (True, False):
        torch.neuron.clear_executable_cache()
        with torch.neuron.adaptive_eager(adaptive):
            torch.testing.assert_close(step(x.to("neuron"), w.to("neuron")).cpu(), expected)


def test_executables_are_released_near_the_memory_map_limit(monkeypatch):
    """Past a share of vm.max_map_count every cached executable is dropped (XLA:CPU crashed when a process
    compiling tens of thousands of shapes ran out of mappings); ops go on, compiling again."""
    from torchneuron.runtime import cache

    if cache.map_limit() is None:
        pytest.skip("no /proc/sys/vm/max_map_count (not Linux)")
    x = torch.arange(6.0, device="neuron")
    (x * 2).cpu()
    assert cache.eager_cache.entries
    monkeypatch.setattr(cache, "MAP_SHARE", cache.map_count() / cache.map_limit() / 2)
    monkeypatch.setattr(cache, "CHECK_EVERY", 1)
    released = cache.released
    assert torch.equal((torch.arange(7.0, device="neuron") + 1).cpu(), torch.arange(7.0) + 1)  # a new program
    assert cache.released > released and len(cache.eager_cache.entries) <= 1
    monkeypatch.setattr(cache, "MAP_SHARE", 0.75)
    assert torch.equal((x * 2).cpu(), torch.arange(6.0) * 2)


@pytest.mark.parametrize(
    "bad, error",
    [
        (lambda d: torch.nn.functional.embedding(torch.tensor([1, 7], device=d), torch.randn(5, 3, device=d)), IndexError),
        (lambda d: torch.randn(3, 4, device=d)[torch.tensor([5], device=d)], IndexError),
        (lambda d: torch.randn(3, 4, device=d).index_select(0, torch.tensor([3], device=d)), IndexError),
        (lambda d: torch.gather(torch.randn(3, 4, device=d), 1, torch.tensor([[9]], device=d)), RuntimeError),
    ],
)
def test_out_of_range_index_values_raise_at_synchronisation(bad, error):
    with pytest.raises(error):
        bad("cpu")
    result = bad("neuron")  # like CUDA, the op is queued; the error surfaces when the host waits
    with pytest.raises(error, match="reported at synchronisation"):
        result.cpu()
    assert torch.ones(2, device="neuron").sum().item() == 2.0  # the failure was consumed


_ERROR_IN_BACKWARD = """
import pytest, torch
from torchneuron.eager import dispatch

def boom(func, args, kwargs):
    raise ValueError("boom in " + str(func))

x = torch.randn(4, 3, device="neuron", requires_grad=True)
dispatch._HANDLERS[torch.ops.aten.threshold_backward.default] = boom
with pytest.raises(ValueError, match="boom in aten.threshold_backward"):
    torch.relu(x).sum().backward()
with pytest.raises(ValueError, match="boom in aten.threshold_backward"):
    torch.autograd.grad(torch.relu(x).sum(), x)
del dispatch._HANDLERS[torch.ops.aten.threshold_backward.default]
torch.relu(x).sum().backward()
assert torch.equal(x.grad.cpu(), (x.detach().cpu() > 0).float())
print("survived")
"""


def test_an_error_inside_backward_is_raised_by_backward():
    """Raised on the autograd engine's device thread, the error reaches backward() and autograd.grad()."""
    run = subprocess.run([sys.executable, "-c", _ERROR_IN_BACKWARD], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "survived" in run.stdout, run.stderr[-3000:]


def test_float_arguments_keep_their_value_sign_and_weak_type():
    """Python floats reach executables as cached device scalars: -0.0 must not reuse 0.0's, NaN and
    changing values must be honoured, and a float32 tensor times a float stays float32."""
    x = torch.ones(3, device="neuron")
    assert torch.signbit((x * -0.0).cpu()).all() and not torch.signbit((x * 0.0).cpu()).any()
    assert torch.isnan((x * float("nan")).cpu()).all()
    for lr in (0.1, 0.2, 0.3):
        assert (x * lr).dtype == torch.float32
        torch.testing.assert_close((x * lr).cpu(), torch.full((3,), lr))


def test_an_unreadable_entry_on_disk_is_compiled_again(own_disk_cache):
    """A damaged file in the disk cache is a miss, not an error."""
    x = torch.randn(4, 9)
    torch.testing.assert_close((x.to("neuron") * 4.5).cpu(), x * 4.5)
    (entry,) = _op_programs_on_disk(own_disk_cache)
    entry.write_bytes(entry.read_bytes()[:100])
    torch.neuron.clear_executable_cache()
    torch.testing.assert_close((x.to("neuron") * 4.5).cpu(), x * 4.5)
