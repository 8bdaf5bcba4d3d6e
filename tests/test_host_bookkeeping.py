"""Small integer ops whose shapes keep changing run on the host: a shape that recurs is compiled, unless the op
keeps growing (eager/host_bookkeeping.py)."""
import pytest
import torch

from torchneuron.eager import host_bookkeeping
from torchneuron.runtime.cache import eager_cache

aten = torch.ops.aten

# a host run is not a fallback: none may warn
pytestmark = pytest.mark.filterwarnings("error")


def _programs(op) -> int:
    return sum(1 for key in eager_cache.entries if key[0] is op)


@pytest.fixture(autouse=True)
def on_and_fresh(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_FALLBACK", "error")
    eager_cache.clear()
    host_bookkeeping._sighted.clear()
    host_bookkeeping._ops.clear()
    with torch.neuron.host_bookkeeping(True):
        yield


@pytest.mark.parametrize("adaptive", [False, True])
def test_an_integer_op_whose_shapes_change_runs_on_the_host_twice_then_compiles(adaptive):
    before = torch.neuron.host_bookkeeping_report().get("aten.mul.Tensor", 0)
    with torch.neuron.adaptive_eager(adaptive):
        for length, sightings, host_runs in ((4, 3, 0), (5, 4, host_bookkeeping.HOST_RUNS)):
            cpu_a, cpu_b = torch.arange(3 * length).view(3, length), torch.full((3, length), 5)
            a, b = cpu_a.to("neuron"), cpu_b.to("neuron")
            for sighting in range(1, sightings + 1):
                result = a * b
                assert result.device == a.device
                torch.testing.assert_close(result.cpu(), cpu_a * cpu_b, rtol=0, atol=0)
                # the first shape compiles at once, as every op's; the next runs on the host at first
                assert _programs(aten.mul.Tensor) == 1 + (length == 5 and sighting > host_runs)
    assert torch.neuron.host_bookkeeping_report()["aten.mul.Tensor"] - before == host_bookkeeping.HOST_RUNS


def test_a_growing_sequence_compiles_nothing_for_its_bookkeeping():
    """generate()'s pattern: two int64 tensors grow by one at each token, and the ops reading them are new
    signatures at every token."""
    cpu_ids, cpu_positions = torch.tensor([[3, 1, 4, 1, 5]]), torch.arange(5)[None]
    ids, positions = cpu_ids.to("neuron"), cpu_positions.to("neuron")
    stop = torch.tensor([9, 2])
    for _ in range(6):
        token = (ids[:, -1:] * 7 + 3) % 10
        ids = torch.cat([ids, token], dim=-1)
        positions = torch.cat([positions, positions[:, -1:] + 1], dim=-1)
        done = torch.isin(ids[:, -1], stop.to("neuron")).any().item()
        cpu_token = (cpu_ids[:, -1:] * 7 + 3) % 10
        cpu_ids = torch.cat([cpu_ids, cpu_token], dim=-1)
        cpu_positions = torch.cat([cpu_positions, cpu_positions[:, -1:] + 1], dim=-1)
        assert done == torch.isin(cpu_ids[:, -1], stop).any().item()
    torch.testing.assert_close(ids.cpu(), cpu_ids, rtol=0, atol=0)
    torch.testing.assert_close(positions.cpu(), cpu_positions, rtol=0, atol=0)
    # the first token's, then none
    assert _programs(aten.cat.default) == _programs(aten.isin.Tensor_Tensor) == 1


def test_a_growing_op_stays_on_the_host_however_often_its_shapes_recur():
    """generate() called again with the same lengths: each length's ops recur once a call, and compiled they would
    make each token's adaptive eager queue a structure of its own."""
    host_runs = torch.neuron.host_bookkeeping_report().get("aten.cat.default", 0)
    tokens = host_bookkeeping.GROWING + 3
    for _ in range(host_bookkeeping.HOST_RUNS + 2):
        cpu_ids = torch.tensor([[3, 1, 4]])
        ids = cpu_ids.to("neuron")
        for _ in range(tokens):
            ids = torch.cat([ids, ids[:, -1:] + 1], dim=-1)
            cpu_ids = torch.cat([cpu_ids, cpu_ids[:, -1:] + 1], dim=-1)
        torch.testing.assert_close(ids.cpu(), cpu_ids, rtol=0, atol=0)
    # the first length's program only; every other length ran on the host at every call, the GROWING lengths first
    # seen included once the op was growing
    assert _programs(aten.cat.default) == 1
    calls = host_bookkeeping.HOST_RUNS + 2
    assert torch.neuron.host_bookkeeping_report()["aten.cat.default"] - host_runs == calls * (tokens - 1)


def test_shapes_that_recur_among_new_ones_compile_at_their_third_sighting():
    """A training loop's buckets of sequence lengths, more of them than GROWING, in shuffled order: each length
    compiles at its third sighting, as a host run would cut the step's queue at every step."""
    lengths = [7, 3, 12, 5, 9, 4, 11, 6, 10, 8, 13, 2]
    assert len(lengths) > host_bookkeeping.GROWING + 1
    host_runs = torch.neuron.host_bookkeeping_report().get("aten.add.Tensor", 0)
    for _ in range(host_bookkeeping.HOST_RUNS + 2):
        for length in lengths:
            mask = torch.arange(length)
            assert (mask.to("neuron") + 1).cpu().tolist() == (mask + 1).tolist()
    assert _programs(aten.add.Tensor) == len(lengths)
    assert (torch.neuron.host_bookkeeping_report()["aten.add.Tensor"] - host_runs
            == host_bookkeeping.HOST_RUNS * (len(lengths) - 1))


def test_results_keep_the_cpu_kernels_structure_and_strides():
    for length in (3, 4):
        cpu = torch.arange(4 * length).view(4, length) % 5
        result = torch.max(cpu.to("neuron"), dim=1)
        assert type(result) is torch.return_types.max
        values, indices = result
        torch.testing.assert_close(values.cpu(), cpu.max(dim=1).values, rtol=0, atol=0)
        torch.testing.assert_close(indices.cpu(), cpu.max(dim=1).indices, rtol=0, atol=0)
        transposed = cpu.to("neuron").t().clone()
        assert transposed.stride() == cpu.t().clone().stride()
        torch.testing.assert_close(transposed.cpu(), cpu.t(), rtol=0, atol=0)


def test_an_out_the_kernel_resizes_takes_the_result():
    for length in (3, 4, 5):
        cpu = torch.arange(length)
        out = torch.empty(0, dtype=torch.int64, device="neuron")
        result = torch.cat([cpu.to("neuron"), cpu.to("neuron")], out=out)
        assert result is out
        torch.testing.assert_close(out.cpu(), torch.cat([cpu, cpu]), rtol=0, atol=0)


def test_float_and_large_integer_ops_compile_whatever_their_shapes():
    for length in (4, 5):
        torch.ones(length, length, device="neuron").sub(1)
        torch.ones(host_bookkeeping.MAX_ELEMENTS + length, dtype=torch.int32, device="neuron").sub(1)
    assert _programs(aten.sub.Tensor) == 4


def test_off_by_the_context_manager_and_the_setter():
    torch.arange(7, device="neuron").neg()
    with torch.neuron.host_bookkeeping(False):
        torch.arange(6, device="neuron").neg()
    assert _programs(aten.neg.default) == 2
    torch.neuron.set_host_bookkeeping(False)
    try:
        torch.arange(5, device="neuron").neg()
    finally:
        torch.neuron.set_host_bookkeeping(True)
    assert _programs(aten.neg.default) == 3


def test_an_in_place_op_on_a_view_writes_through_to_its_base():
    cpu_base = torch.arange(12).view(3, 4)
    base = cpu_base.to("neuron")
    other_view = base[:, 1]
    for row in (1, slice(1, 3)):  # a view of one shape, then of another
        base[row].add_(100)
        cpu_base[row].add_(100)
    torch.testing.assert_close(base.cpu(), cpu_base, rtol=0, atol=0)
    torch.testing.assert_close(other_view.cpu(), cpu_base[:, 1], rtol=0, atol=0)
    assert _programs(aten.add_.Tensor) == 1


def test_what_the_cpu_refuses_runs_on_the_device():
    """histc of ints has no CPU kernel (CUDA's and neuron's take it); an assertion on the device raises at
    synchronisation, where the CPU's raises at once."""
    for length in (5, 6):
        values = torch.tensor([0, 1, 1, 3, 7, 9][:length], dtype=torch.int32)
        counts = torch.histc(values.to("neuron"), bins=5, min=0, max=10)
        torch.testing.assert_close(counts.cpu(), torch.histc(values.float(), bins=5, min=0, max=10).int(), rtol=0,
                                   atol=0)
    assert _programs(aten.histc.default) == 2
    for length in (1, 2):
        torch._assert_async(torch.zeros(length, dtype=torch.bool, device="neuron").all(), "checked on the device")
        with pytest.raises(RuntimeError, match="checked on the device"):
            torch.neuron.synchronize()


def test_a_captured_integer_op_is_compiled_into_the_graph():
    torch.zeros(5, dtype=torch.int64, device="neuron").add_(1)
    counter = torch.zeros(4, dtype=torch.int64, device="neuron")
    graph = torch.neuron.NeuronGraph()
    with torch.neuron.graph(graph):
        counter.add_(1)
    for _ in range(3):
        graph.replay()
    # capturing runs nothing, as CUDA's does; each replay adds one
    assert counter.cpu().tolist() == [3] * 4


def test_not_under_sync_debug_mode():
    torch.arange(6, device="neuron").add(1)
    a = torch.arange(5, device="neuron")
    torch.neuron.set_sync_debug_mode("error")
    try:
        b = a + 1
    finally:
        torch.neuron.set_sync_debug_mode(0)
    assert b.cpu().tolist() == [1, 2, 3, 4, 5]
    assert _programs(aten.add.Tensor) == 2


def test_reading_views_of_a_small_storage_compiles_nothing():
    values = torch.arange(0.0, 50.0, device="neuron")
    assert [values[i].item() for i in range(0, 50, 7)] == list(range(0, 50, 7))
    assert values[::3].cpu().tolist() == list(range(0, 50, 3))
    assert _programs(aten.clone.default) == 0
