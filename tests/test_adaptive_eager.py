"""Adaptive eager: queued ops run as one fused executable with the results of op-by-op eager."""
import collections
import gc
import threading
import time

import numpy as np
import pytest
import torch
import torch.nn as nn
from jax.extend import core as jax_core

from torchneuron.eager import adaptive, executable, fallback
from torchneuron.runtime import pending_checks, program
from torchneuron.runtime.storage import Pending, Storage


@pytest.fixture
def queued():
    """Adaptive eager on, with the fused-executable cache emptied and the counters read from zero."""
    adaptive.fused_cache.clear()
    before = adaptive.stats()
    with torch.neuron.adaptive_eager():
        yield lambda: {k: adaptive.stats()[k] - before[k] for k in ("flushes", "ops_fused", "values_kept", "replays",
                                                                          "first_sightings")}
        torch.neuron.synchronize()
    assert adaptive.stats()["queued"] == 0


def _is_pending(t: torch.Tensor) -> bool:
    buffer = t._storage._buffer
    return type(buffer) is Pending and buffer.array is None


def _train(steps: int, device: str):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(8, 16).to(device), torch.randn(8, 4).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def test_training_loop_matches_op_by_op_and_replays_one_fused_program(queued):
    hits_before = adaptive.fused_cache.stats()["hits"]
    losses, params = _train(6, "neuron")
    counts = queued()
    with torch.neuron.adaptive_eager(False):
        expected_losses, expected_params = _train(6, "neuron")
    assert losses == pytest.approx(expected_losses, rel=1e-5)
    for p, e in zip(params, expected_params):
        torch.testing.assert_close(p, e, rtol=1e-5, atol=1e-6)
    # each step ends at loss.item(); steps after the first queue the whole step, the second runs its queues
    # op by op (new structures), the third again while their fused programs compile, the last three fused
    assert counts["flushes"] >= 5 and counts["ops_fused"] >= 3 * 20 and counts["replays"] == 0
    assert counts["first_sightings"] >= 1
    assert adaptive.fused_cache.stats()["hits"] - hits_before >= 3


def test_ops_are_queued_until_a_value_is_read(queued):
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    x, y = a.to("neuron"), b.to("neuron")
    ((x + y) * 2).sum()  # the first run of a signature executes (and compiles) it
    z = (x + y) * 2
    assert _is_pending(z)
    w = z.sum()
    assert _is_pending(w)
    assert w.item() == pytest.approx(((a + b) * 2).sum().item(), rel=1e-5)
    assert not _is_pending(z)
    torch.testing.assert_close(z.cpu(), (a + b) * 2)


def test_new_ops_are_queued_and_compiled_side_by_side_meanwhile(queued, monkeypatch):
    """An op's first run is queued like any other, its program compiling on a compile thread meanwhile: the ops
    between two reads compile side by side (and beside the host's work of queueing them), where each was compiled
    at the op, one after another. Without compile threads the first run is at the op."""
    a = torch.randn(11, 13)
    x = a.to("neuron")
    y = torch.tanh(x * 1.375) @ x.T
    assert _is_pending(y)
    compiling = [e for e in executable.eager_cache.entries.values()
                 if isinstance(e, executable.Executable) and e._compiling is not None]
    assert len(compiling) >= 3  # mul, tanh, mm (and the transpose's clone, if any)
    torch.testing.assert_close(y.cpu(), torch.tanh(a * 1.375) @ a.T)
    assert all(e.ran and e._compiling is None for e in compiling)
    monkeypatch.setattr(program, "COMPILE_THREADS", 0)
    z = torch.sinh(x[:5])
    assert not _is_pending(z)
    torch.testing.assert_close(z.cpu(), torch.sinh(a[:5]))


def _failing_to_compile(monkeypatch, ops):
    """`ops`' programs fail to compile (as XLA may refuse a program it traced)."""
    compile = executable.Executable._compile

    def failing(self, traced):
        if self.op in ops:
            raise RuntimeError("the compiler refused the program")
        return compile(self, traced)

    monkeypatch.setattr(executable.Executable, "_compile", failing)


def test_a_program_failing_to_compile_ahead_falls_back_to_the_cpu_at_its_first_run(queued, monkeypatch):
    """A queued first run whose compile fails meanwhile gets the op's results from the CPU kernel, read from and
    written to its storages as the program would (new outputs, several outputs, in place through a view, numbers,
    device-side checks, a factory), and the op falls back from then on, counted, as it would have at the op."""
    aten = torch.ops.aten
    failing = {aten.sin.default, aten.max.dim, aten.mul_.Tensor, aten.index_select.default, aten.tril_indices.default}
    _failing_to_compile(monkeypatch, failing)
    fallback.reset()
    a, index = torch.randn(9, 17), torch.tensor([2, 0, 2])
    x, i = a.to("neuron"), index.to("neuron")
    with pytest.warns(UserWarning, match="running it on the CPU"):
        sines = torch.sin(x)
        values, indices = torch.max(x + 1.0, dim=1)
        view = x[3:]
        view.mul_(torch.tensor(2.5))
        picked = torch.index_select(x, 0, i)
        pairs = torch.tril_indices(4, 3, device="neuron")
        assert all(map(_is_pending, (sines, values, indices, x, picked, pairs)))  # queued: compiling meanwhile
        total = (sines + values[:, None] + picked.sum() + pairs.sum()).cpu()
    expected = a.clone()
    expected[3:] *= 2.5
    torch.testing.assert_close(x.cpu(), expected)
    torch.testing.assert_close(values.cpu(), (a + 1.0).max(dim=1).values)
    assert torch.equal(indices.cpu(), (a + 1.0).max(dim=1).indices)
    torch.testing.assert_close(picked.cpu(), expected[index])
    assert torch.equal(pairs.cpu(), torch.tril_indices(4, 3))
    torch.testing.assert_close(total, torch.sin(a) + (a + 1.0).max(dim=1).values[:, None] + expected[index].sum()
                               + torch.tril_indices(4, 3).sum())
    assert set(fallback.report()) == {str(op) for op in failing}
    assert "the compiler refused the program" in fallback.failures[str(aten.sin.default)]
    torch.sin(x)  # the same signature: at the op now
    assert fallback.report()[str(aten.sin.default)] == 2
    fallback.reset()


def test_a_program_failing_to_compile_ahead_with_fallback_disabled_raises_at_the_read(queued, monkeypatch):
    _failing_to_compile(monkeypatch, {torch.ops.aten.cosh.default})
    x = torch.randn(5, 19, device="neuron")
    with fallback.as_error(), pytest.raises(fallback.FallbackError, match="cosh"):
        torch.cosh(x).cpu()
    fallback.reset()


def test_equal_numbers_are_one_input_of_the_queue(queued):
    """A foreach optimizer step gives every parameter its own copy of the step size: the queue passes each
    distinct number (by type and bits) once, and each kept device scalar once, and the results stay op by
    op's."""
    tensors = [torch.randn(5) for _ in range(5)]
    on_neuron = [t.to("neuron") for t in tensors]
    numbers = [0.25, 0.25, -0.0, 0.0, 0.0]

    def step(ts, scale):
        torch._foreach_mul_(ts, [n * scale for n in numbers])
        torch._foreach_add_(ts, 1.0 / scale)

    step(on_neuron, 1.0)
    torch.neuron.synchronize()  # the numbers' first sighting: each later call's queue is its own
    step(tensors, 1.0)
    for scale in (3.0, 7.0):  # numbers new to the run, as an optimizer's bias corrections are
        step(on_neuron, scale)
        step(tensors, scale)
        # -0.0 and 0.0 come back each call: from the second they are kept device scalars, not numbers
        externals = adaptive.current().externals
        assert sorted(e for e in externals if type(e) is float) == sorted([0.25 * scale, 1.0 / scale])
        assert len([e for e in externals if getattr(e, "ndim", None) == 0]) == 2  # kept, once each
        for got, want in zip(on_neuron, tensors):
            torch.testing.assert_close(got.cpu(), want)


def _traced_equations() -> int:
    """The equations of every JAX trace alive in the process."""
    gc.collect()
    return sum(len(o.eqns) for o in gc.get_objects() if type(o) is jax_core.Jaxpr)


def test_programs_keep_nothing_of_their_traces(queued):
    """JAX keeps a jitted function's traces as long as the function lives; a program's trace is dropped once
    it is compiled, as Python's collector walks every object kept at each full collection (a foreach optimizer
    step's trace is tens of thousands)."""
    tensors = [torch.randn(3, 7) for _ in range(40)]
    on_neuron = [t.to("neuron") for t in tensors]
    before = _traced_equations()
    for _ in range(3):  # op by op (each op's executable traced and compiled), then fused (traced and compiled)
        for ts in (on_neuron, tensors):
            torch._foreach_mul_(ts, 1.5)
            torch._foreach_add_(ts, ts)
        torch.neuron.synchronize()
    assert queued()["ops_fused"] >= 2
    for got, want in zip(on_neuron, tensors):
        torch.testing.assert_close(got.cpu(), want)
    # each trace has an equation or more per tensor: 40 would be one trace kept
    assert _traced_equations() - before < 40


def test_in_place_writes_through_views_are_queued_in_order(queued):
    base = torch.zeros(4, 6)
    x = base.to("neuron")
    for _ in range(2):  # the second round is queued
        row, col = x[1], x[:, 2]
        row.add_(1.0)
        col.mul_(3.0)
        x.t()[0].sub_(0.5)
        base[1].add_(1.0)
        base[:, 2].mul_(3.0)
        base.t()[0].sub_(0.5)
    snapshot = x.clone()
    x.zero_()
    torch.testing.assert_close(snapshot.cpu(), base)
    torch.testing.assert_close(x.cpu(), torch.zeros(4, 6))


def test_random_ops_draw_the_numbers_of_op_by_op(queued):
    def draw():
        torch.neuron.manual_seed(7)
        t = torch.ones(64, device="neuron")
        return [nn.functional.dropout(t, 0.5).cpu(), torch.rand_like(t).cpu(), (t + torch.randn_like(t)).cpu()]

    queued_draws = draw(), draw()
    with torch.neuron.adaptive_eager(False):
        expected = draw()
    for draws in queued_draws:
        for got, want in zip(draws, expected):
            torch.testing.assert_close(got, want)


def test_the_cpu_fallback_reads_queued_values(queued, monkeypatch):
    x = torch.randn(5, 3).to("neuron")
    x * 2
    y = x * 2
    assert _is_pending(y)
    fallback.reset()
    monkeypatch.setattr(fallback, "strict", lambda: False)
    from torchneuron.ops import registry

    monkeypatch.delitem(registry.LOWERINGS, torch.ops.aten.hardtanh.default)
    from torchneuron.eager import dispatch
    from torchneuron.ops import rules

    monkeypatch.setattr(rules, "_DECOMPOSED", {torch.ops.aten.hardtanh.default: None})
    monkeypatch.setattr(rules, "_RULES", {})
    monkeypatch.setattr(dispatch, "_HANDLERS", {})
    with pytest.warns(UserWarning):
        out = torch.ops.aten.hardtanh.default(y, -0.5, 0.5)
    torch.testing.assert_close(out.cpu(), (x.cpu() * 2).clamp(-0.5, 0.5))


def test_a_compiled_graph_sees_queued_writes(queued):
    x = torch.zeros(8, device="neuron")
    x.add_(1.0)
    x.add_(1.0)
    assert _is_pending(x)
    compiled = torch.compile(lambda t: t * 3 + 1, backend="neuron")
    torch.testing.assert_close(compiled(x).cpu(), torch.full((8,), 7.0))


def test_dead_intermediates_are_not_computed_and_limits_flush(queued, monkeypatch):
    monkeypatch.setattr(adaptive.current(), "limit", 8)
    x = torch.randn(32).to("neuron")
    acc = x.clone()
    acc = acc + x
    for _ in range(46):
        acc = acc + x
    counts = queued()
    # the limit ran the queue without any read: [clone, 7 adds] and [8 adds] run op by op, the next [8 adds] op by op
    # again while its fused program compiles, then [8 adds] fused three times
    assert counts["flushes"] >= 6
    # each flush returns only the newest sum (plus the copy `acc` was cloned into, while it lived)
    assert counts["values_kept"] <= 2 * counts["flushes"] < counts["ops_fused"]
    torch.testing.assert_close(acc.cpu(), x.cpu() * 48)


def test_shape_errors_are_raised_at_the_op_not_at_the_flush(queued):
    x, y = torch.randn(3, 4, device="neuron"), torch.randn(5, device="neuron")
    x + x
    with pytest.raises(RuntimeError, match="must match the size of tensor b"):  # the CPU's message
        x + y
    torch.testing.assert_close((x + x).cpu(), x.cpu() * 2)


def test_ops_with_device_side_checks_are_queued_and_raise_at_synchronisation(queued):
    table = torch.randn(5, 3)
    on_device = table.to("neuron")

    def lookup(indices):
        return torch.nn.functional.embedding(torch.tensor(indices, device="neuron"), on_device)

    lookup([1, 2])  # the first run of a signature executes (and compiles) it
    good = lookup([3, 4])
    assert _is_pending(good)  # queued with its index check
    torch.testing.assert_close(good.cpu(), table[[3, 4]])
    bad = lookup([1, 7])
    assert _is_pending(bad)
    with pytest.raises(IndexError, match="reported at synchronisation"):
        torch.neuron.synchronize()
    assert torch.ones(2, device="neuron").sum().item() == 2.0  # the failure was consumed


def test_unread_device_checks_past_their_limit_do_not_cut_the_queue(queued, monkeypatch):
    """Past pending_checks.LIMIT the checks already computed are read, queued ones only when they alone pass
    it: reading a queued one runs the queue where no loop boundary is, a queue of a new structure to compile
    (a training step with three checked ops met one every 341 steps)."""
    monkeypatch.setattr(pending_checks, "LIMIT", 4)
    table = torch.randn(5, 3)
    on_device, indices = table.to("neuron"), torch.tensor([1, 3], device="neuron")

    def lookup():
        return torch.nn.functional.embedding(indices, on_device) * 2

    lookup()  # the first run of each op executes (and compiles) it
    for _ in range(4):  # steps of three checked lookups, each step's queue run at its end (a loop boundary)
        flushes = queued()["flushes"]
        results = [lookup() for _ in range(3)]
        assert queued()["flushes"] == flushes and all(_is_pending(r) for r in results)
        adaptive.current().flush()
    assert len(pending_checks._pending[0]) <= 4 + 3  # those computed were read past the limit
    bad = torch.nn.functional.embedding(torch.tensor([1, 7], device="neuron"), on_device)
    assert _is_pending(bad)
    with pytest.raises(IndexError, match="reported at synchronisation"):
        torch.neuron.synchronize()
    torch.testing.assert_close(results[-1].cpu(), table[[1, 3]] * 2)
    # more queued checks than the limit: they are read, running the queue
    flushes = queued()["flushes"]
    [lookup() for _ in range(5)]
    assert queued()["flushes"] == flushes + 1 and not pending_checks._pending.get(0)


def test_unread_device_checks_past_their_limit_are_read_at_the_op_when_computed(monkeypatch):
    monkeypatch.setattr(pending_checks, "LIMIT", 4)
    on_device = torch.randn(5, 3, device="neuron")
    with torch.neuron.adaptive_eager(False):
        torch.nn.functional.embedding(torch.tensor([1, 7], device="neuron"), on_device)
        with pytest.raises(IndexError, match="reported at synchronisation"):
            for _ in range(4):
                torch.nn.functional.embedding(torch.tensor([1, 2], device="neuron"), on_device)
        assert not pending_checks._pending.get(0)


def test_a_device_check_added_while_another_thread_reads_the_checks_is_kept(monkeypatch):
    """A thread reading a device's checks takes them out and puts back those it does not read; a check another
    thread's op adds in between is kept (it was dropped: its error never raised)."""
    adder = threading.Thread(target=pending_checks.add,
                             args=(0, "the other thread's op", [np.array(False)], [(IndexError, "out of range")]))

    class AddsWhileTaken(collections.defaultdict):
        def pop(self, *args):
            taken = super().pop(*args)
            if not adder.ident:
                adder.start()
                adder.join(timeout=0.2)  # it waits for the reader to put back what it keeps
            return taken

    monkeypatch.setattr(pending_checks, "_pending", AddsWhileTaken(list))
    for _ in range(2):
        pending_checks.add(0, "an op", [np.array(True)], [(IndexError, "out of range")])
    pending_checks._raise_failures_of(0, 1)  # reads the first, keeps the second
    adder.join(timeout=10)
    with pytest.raises(IndexError, match="raised by the other thread's op"):
        pending_checks.raise_failures(0)


def test_synchronize_runs_the_queue(queued):
    x = torch.ones(4, device="neuron")
    x * 5
    y = x * 5
    assert _is_pending(y)
    torch.neuron.synchronize()
    assert not _is_pending(y)
    assert adaptive.stats()["queued"] == 0


def _in_turns(*bodies):
    """Run each body in a thread of its own, one step of each in turn (a body takes `turn()` and calls it before
    each step), as threads interleave at the interpreter's switches; returns their results."""
    turns = [threading.Semaphore(i == 0) for i in range(len(bodies))]
    results, errors = [None] * len(bodies), []

    def run(i, body):
        def turn():
            turns[(i - 1) % len(turns)].release()
            turns[i].acquire()

        turns[i].acquire()
        try:
            results[i] = body(turn)
        except BaseException as error:
            errors.append(error)
        finally:
            for semaphore in turns:
                semaphore.release()

    threads = [threading.Thread(target=run, args=(i, body)) for i, body in enumerate(bodies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return results


def test_threads_queue_apart_so_interleaved_loops_run_fused(queued):
    """Each thread records its own queue: two loops whose ops alternate op by op keep their structures, and run
    fused from their second sighting; one queue, cut at every change of thread, ran them one by one."""
    def loop(start):
        def body(turn):
            x = torch.full((4,), start, device="neuron")
            for _ in range(6):
                turn()
                x = torch.tanh(x * 0.5 + 1.0)
            return x.cpu()
        return body

    def expected(start):
        x = torch.full((4,), start)
        for _ in range(6):
            x = torch.tanh(x * 0.5 + 1.0)
        return x

    for sighting in range(3):
        before = queued()
        results = _in_turns(loop(0.25), loop(-2.0))
        counts = {k: v - before[k] for k, v in queued().items()}
        for result, start in zip(results, (0.25, -2.0)):
            torch.testing.assert_close(result, expected(start))
        # once each op has run (its first run is not queued), each thread's loop is one queue (torch.full's fill
        # and 3 ops a step), run when the thread reads its result: op by op at its first sighting, then fused
        if sighting:
            assert counts["flushes"] == 2 and counts["first_sightings"] == 0, counts
            assert counts["ops_fused"] == 2 * (1 + 6 * 3), counts


@pytest.fixture
def first_runs_at_the_op(monkeypatch):
    """No compile threads: an op's first run is not queued but runs (and compiles) at the op, as it does with
    adaptive eager off, so that the tests of that path test it."""
    monkeypatch.setattr(program, "COMPILE_THREADS", 0)


def test_a_thread_reads_what_another_queued_and_donations_wait_for_every_queue(queued, first_runs_at_the_op):
    """A value another thread queued is computed for the reader (its queue runs); a read another thread queued
    before a write is of the value before it; an op run at once that donates a buffer (its first run, not
    queued) first runs each thread's queue that reads that buffer."""
    shared = torch.zeros(5, device="neuron")
    shared * 2.0  # known good: queued from now on
    shared.add_(1.0)  # queued in the main thread's queue

    def reader(turn):
        doubled = shared * 2.0  # the main thread's queued value, read here
        turn()
        return doubled

    def writer(turn):
        turn()
        shared.addcdiv_(torch.ones(5, device="neuron"), torch.full((5,), 4.0, device="neuron"))  # a first run
        return shared.cpu()

    doubled, written = _in_turns(reader, writer)
    assert doubled.cpu().tolist() == [2.0] * 5 and written.tolist() == [1.25] * 5


def _in_another_thread(body) -> None:
    errors = []

    def run():
        try:
            body()
        except Exception as error:
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert not errors, errors


def _written_once_read(monkeypatch, tensor, write, wait: float) -> list:
    """Storage.buffer patched so that the main thread's first read of `tensor`'s storage starts `write` in another
    thread and gives it `wait` seconds, as another thread's op may run between a read and the use of what it
    read. Returns [the buffer read, the thread] once that has happened."""
    buffer_of, raced = Storage.buffer, []

    def buffer_then_a_write(storage):
        buffer = buffer_of.fget(storage)
        if storage is tensor._storage and not raced and threading.current_thread() is threading.main_thread():
            raced.extend((buffer, threading.Thread(target=write)))
            raced[1].start()
            raced[1].join(timeout=wait)
        return buffer

    monkeypatch.setattr(Storage, "buffer", property(buffer_then_a_write, buffer_of.fset))
    return raced


_READS = {"cpu": lambda t: t.cpu(), "to another device": lambda t: t.to("neuron:1").cpu(),
          "dlpack": lambda t: torch.from_numpy(np.from_dlpack(t).copy())}


@pytest.mark.parametrize("read", _READS)
def test_a_read_racing_another_threads_write_reads_one_value_not_a_donated_buffer(read, monkeypatch):
    """A read (a transfer, a DLPack export) of a tensor whose buffer another thread's op donates meanwhile reads
    the storage's new buffer (it raised "Array has been deleted")."""
    shared = torch.zeros(6, device="neuron")
    with torch.neuron.adaptive_eager(False):
        shared.add_(1.0)  # compiled: from now on it donates at once
        raced = _written_once_read(monkeypatch, shared, lambda: shared.add_(1.0), wait=60)
        values = _READS[read](shared)
    assert raced and raced[0].is_deleted()
    assert values.tolist() == [2.0] * 6


@pytest.mark.parametrize("op", [torch.unique, torch.nonzero])
def test_a_data_dependent_op_racing_another_threads_write_reads_one_value(op, monkeypatch):
    """An op whose result's shape depends on the values (run on concrete arrays, not as a program) reading a
    tensor whose buffer another thread's op donates meanwhile reads the storage's new buffer."""
    shared = torch.zeros(6, device="neuron")
    with torch.neuron.adaptive_eager(False):
        shared.add_(1.0)  # compiled: from now on it donates at once
        expected = op(shared.cpu() + 1.0)
        raced = _written_once_read(monkeypatch, shared, lambda: shared.add_(1.0), wait=60)
        result = op(shared)
    assert raced and raced[0].is_deleted()
    torch.testing.assert_close(result.cpu(), expected)


def test_a_graph_replay_reads_its_inputs_before_another_threads_op_donates_them(monkeypatch):
    """A captured graph's replay takes the buffers it reads and launches its program with no other thread's op
    donating one of them in between (the launch raised "Array has been deleted"); that op runs after it."""
    shared = torch.ones(6, device="neuron")
    with torch.neuron.adaptive_eager(False):
        shared.add_(1.0)  # compiled: from now on it donates at once
        graph = torch.neuron.NeuronGraph()
        with torch.neuron.graph(graph):
            doubled = shared * 2.0
        raced = _written_once_read(monkeypatch, shared, lambda: shared.add_(1.0), wait=0.2)  # it waits for the launch
        graph.replay()
        raced[1].join(timeout=10)
        monkeypatch.undo()
    assert doubled.cpu().tolist() == [4.0] * 6 and shared.cpu().tolist() == [3.0] * 6


def test_a_read_running_a_queue_never_undoes_another_threads_write(queued, monkeypatch):
    """A read that runs the queue computing a tensor's value stores that value in the storage only if no other
    thread wrote the storage meanwhile: it had put back the older value, losing the write."""
    shared = torch.zeros(6, device="neuron")
    shared.add_(1.0)  # known good: queued from now on
    shared.add_(1.0)
    resolve, raced = Pending.resolve, []

    def resolve_then_a_write(pending):
        array = resolve(pending)
        if not raced:
            raced.append(pending)
            _in_another_thread(lambda: shared.add_(1.0))
        return array

    monkeypatch.setattr(Pending, "resolve", resolve_then_a_write)
    assert shared.cpu().tolist() == [2.0] * 6
    assert raced and shared.cpu().tolist() == [3.0] * 6


def test_threads_meeting_at_an_ops_first_run_compile_it_once_and_never_read_what_it_donates(queued, monkeypatch,
                                                                                             first_runs_at_the_op):
    """An op's first run (not queued) compiles, runs, and donates what it writes. A thread queueing a read of a
    tensor another thread's first run is writing waits for the write and reads its result (it had queued the
    donated buffer: "Buffer has been deleted"); two threads reaching the same first run compile it once (the
    second had found its trace gone)."""
    from torchneuron.runtime import compilation_cache

    compiling = threading.Event()
    store = compilation_cache.compile_and_store

    def slow_compile(*args, **kwargs):
        compiling.set()
        time.sleep(0.3)  # another thread runs meanwhile
        return store(*args, **kwargs)

    monkeypatch.setattr(compilation_cache, "compile_and_store", slow_compile)
    results, errors = {}, []

    def run(name, body, after_a_compile_starts=False):
        def target():
            if after_a_compile_starts:
                compiling.wait(10)
            try:
                results[name] = body()
            except Exception as error:
                errors.append(error)
        return threading.Thread(target=target)

    def in_threads(*threads):
        compiling.clear()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors

    shared, written = torch.full((7,), 2.0, device="neuron"), threading.Event()
    shared * 3.0  # known good: queued from now on

    def read_once_written():
        tripled = shared * 3.0
        written.wait(10)
        return tripled.cpu()

    in_threads(run("written", lambda: (shared.mul_(0.5), written.set())),  # a first run
               run("tripled", read_once_written, after_a_compile_starts=True))
    assert results["tripled"].tolist() == [3.0] * 7

    # op by op, a first run of one thread reads what another's run writes: one waits for the other
    with torch.neuron.adaptive_eager(False):
        shared.mul_(2.0)  # compiled: from now on it donates at once
        in_threads(run("hypot", lambda: torch.hypot(shared, shared).cpu()),  # a first run
                   run("doubled", lambda: shared.mul_(2.0).cpu(), after_a_compile_starts=True))
    torch.testing.assert_close(results["hypot"], torch.full((7,), 8.0).sqrt())
    assert results["doubled"].tolist() == [4.0] * 7

    start, end = torch.zeros(5, device="neuron"), torch.full((5,), 4.0, device="neuron")
    in_threads(*[run(name, lambda: torch.lerp(start, end, 0.75).cpu(), after_a_compile_starts=name == "second")
                 for name in ("first", "second")])
    assert results["first"].tolist() == results["second"].tolist() == [3.0] * 5


def test_loops_without_reads_replay_a_few_fused_programs(queued, monkeypatch):
    """Training iterations are cut where a backward starts and ends and after optimizer.step; a loop that
    neither reads a value nor steps is cut where its queue starts over. Either way the loop replays the same fused programs instead of compiling a new one
    per queue."""
    monkeypatch.setattr(adaptive.current(), "limit", 37)  # not a divisor of a step's op count
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(8, 16, device="neuron")

    def train():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    def infer():
        with torch.no_grad():
            model(x)

    for step, settling_steps in ((train, 12), (infer, 24)):
        # the first runs compile each op; a queue's structure then runs op by op once, and fused from
        # its second sighting on (an inference queue spans six iterations)
        for _ in range(settling_steps):
            step()
        before = adaptive.fused_cache.stats()
        for _ in range(24):
            step()
        misses, hits = (adaptive.fused_cache.stats()[k] - before[k] for k in ("misses", "hits"))
        assert misses == 0 and hits >= 3, (step.__name__, misses, hits)


def test_a_failing_fused_program_is_replayed_op_by_op(queued, monkeypatch):
    def unusable(*args):
        def fail(*externals):
            raise RuntimeError("this fused program cannot be compiled")

        return fail

    monkeypatch.setattr(adaptive, "_fused_program", unusable)
    x = torch.randn(6).to("neuron")
    for _ in range(3):  # the third iteration's queue is the second of its structure: it is traced
        y = x * 3.0
        y.add_(1.0)
        z = y.sum()
        torch.neuron.synchronize()
    torch.testing.assert_close(z.cpu(), (x.cpu() * 3.0 + 1.0).sum())
    assert queued()["replays"] >= 1


DEFAULTS = """
import json, sys, torch
from torch.nn.modules import module
from torch.optim import optimizer

dynamo_at_import = "torch._dynamo" in sys.modules

def hooks():
    return {"module": len(module._global_forward_hooks) + len(module._global_forward_pre_hooks),
            "optimizer": len(optimizer._global_optimizer_post_hooks)}

cpu_only = hooks()
model = torch.nn.Linear(4, 4)
torch.optim.SGD(model.parameters(), lr=0.1).step()
cpu_only_after_a_step = hooks()
x = torch.ones(4, device="neuron")
for _ in range(2):
    y = x * 2  # the second run is queued
print(json.dumps({"enabled": torch.neuron.is_adaptive_eager_enabled(), "dynamo_at_import": dynamo_at_import,
                  "cpu_only": cpu_only, "cpu_only_after_a_step": cpu_only_after_a_step, "queued": hooks(),
                  "y": y.tolist()}))
"""


@pytest.mark.parametrize("setting", [None, "0"])
def test_on_by_default_and_hooks_only_once_ops_queue(setting):
    """On unless TORCHNEURON_ADAPTIVE_EAGER=0; `import torch` alone (which loads torchneuron) adds no hook and
    does not import Dynamo (a second of imports), so a CPU-only program is untouched; the optimizer-step
    boundary is hooked when the first op queues."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TORCHNEURON_ADAPTIVE_EAGER"}
    if setting is not None:
        env["TORCHNEURON_ADAPTIVE_EAGER"] = setting
    done = subprocess.run([sys.executable, "-c", DEFAULTS], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    none = {"module": 0, "optimizer": 0}
    assert seen["cpu_only"] == seen["cpu_only_after_a_step"] == none
    assert seen["dynamo_at_import"] is False
    assert seen["y"] == [2.0] * 4
    assert seen["enabled"] is (setting is None)
    assert seen["queued"] == ({"module": 0, "optimizer": 1} if setting is None else none)


def test_the_step_boundary_hook_becomes_traceable_once_dynamo_is_loaded(monkeypatch):
    """Hooked before Dynamo is imported, the hook is a plain function; the next install, once Dynamo is
    loaded, replaces it with one Dynamo traces (else a compiled optimizer step would break at it)."""
    from torch.optim import optimizer

    boundaries = adaptive._boundaries
    boundaries.remove()
    try:
        monkeypatch.setattr(adaptive, "_dynamo_loaded", lambda: False)
        boundaries.install()
        assert not boundaries.traceable and len(optimizer._global_optimizer_post_hooks) == 1
        monkeypatch.undo()
        import torch._dynamo  # as torch.compile, an optimizer or a meta kernel does

        boundaries.install()
        assert boundaries.traceable and len(optimizer._global_optimizer_post_hooks) == 1
        hook = next(iter(optimizer._global_optimizer_post_hooks.values()))
        assert (hook != boundaries._after_step) == hasattr(torch._dynamo, "dont_skip_tracing")  # wrapped for Dynamo
    finally:
        boundaries.remove()


# sizes apart: a fused program is stored on disk, where the next structure like it would find it at its first sighting
@pytest.mark.parametrize("compile_delay, size", [(0.0, 7), (0.3, 9)])
def test_a_fused_program_compiles_ahead_and_runs_from_the_third_sighting(queued, monkeypatch, compile_delay, size):
    """At a structure's second sighting its fused program starts compiling on a compile thread and the ops run one
    by one once more; the third sighting runs it fused, whatever the compile's timing (a slow one is waited for)."""
    def compile_late(compile, *args):
        return program.compile_ahead(lambda: time.sleep(compile_delay) or compile(*args))

    monkeypatch.setattr(adaptive, "compile_ahead", compile_late)
    x = torch.randn(size).to("neuron")
    fused = []
    for _ in range(4):
        y = (x * 1.5 - 0.5).tanh()
        torch.neuron.synchronize()
        fused.append(queued()["ops_fused"])
    assert fused == [0, 0, 3, 6]
    # the third run put the compiled program in the place of its compile
    assert not any(type(entry) is adaptive._CompilingAhead for entry in adaptive.fused_cache.entries.values())
    torch.testing.assert_close(y.cpu(), (x.cpu() * 1.5 - 0.5).tanh())


def test_a_fused_program_whose_compile_ahead_fails_runs_op_by_op(queued, monkeypatch):
    """A compile failing on the compile thread is found at the third sighting, which runs the ops one by one, as
    every later sighting does without compiling it again."""
    compiles = []

    def failing(*args):
        raise RuntimeError("XLA cannot compile this fused program")

    def compile_failing_ahead(*args):
        compiles.append(args)
        return program.compile_ahead(failing)

    monkeypatch.setattr(adaptive, "compile_ahead", compile_failing_ahead)
    x = torch.randn(5).to("neuron")
    for _ in range(5):
        y = x.exp() * 2.0 + 1.0
        torch.neuron.synchronize()
    torch.testing.assert_close(y.cpu(), x.cpu().exp() * 2.0 + 1.0)
    counts = queued()
    assert counts["ops_fused"] == 0 and counts["replays"] == 3 and len(compiles) == 1


WARM_START = """
import sys, torch
from torchneuron.eager import adaptive
from torchneuron.runtime import compilation_cache

loads, together = [], []
deserialized, deserialized_together = compilation_cache.deserialized, compilation_cache.deserialized_together
compilation_cache.deserialized = lambda *args: loads.append(1) or deserialized(*args)
compilation_cache.deserialized_together = lambda e, d: together.append(len(e)) or deserialized_together(e, d)
torch.manual_seed(0)
x, w = torch.randn(6, 5), torch.randn(5)
xn, wn = x.to("neuron"), w.to("neuron")
for _ in range(int(sys.argv[1])):
    if sys.argv[2] == "keep":  # a value the queue must return too: another structure
        hidden = xn * 1.75 + wn
        got = (hidden.relu() * 0.5 - 0.25).sum(0).cpu()
    else:
        got = ((xn * 1.75 + wn).relu() * 0.5 - 0.25).sum(0).cpu()
torch.testing.assert_close(got, ((x * 1.75 + w).relu() * 0.5 - 0.25).sum(0))
stats = adaptive.stats()
print(stats["first_sightings"], stats["ops_fused"], len(loads), sum(together))
"""


AT_EXIT = """
import atexit, torch

def late():
    x = torch.randn(3, 23, device="neuron")
    y = torch.cosh(x * 2.5)
    print("matches the CPU:", torch.allclose(y.cpu(), torch.cosh(x.cpu() * 2.5)))

atexit.register(late)
"""


def test_ops_run_while_the_interpreter_shuts_down_compile_and_load_without_threads(tmp_path):
    """An atexit hook's ops: no thread can be started then, so a new program compiles at its first run (cold) and
    stored ones load one by one (warm), where both raised "cannot schedule new futures after interpreter shutdown"."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCHNEURON_CACHE_DIR": str(tmp_path)}
    for start in ("cold", "warm"):
        done = subprocess.run([sys.executable, "-c", AT_EXIT], env=env, capture_output=True, text=True, timeout=300)
        assert "matches the CPU: True" in done.stdout, (start, done.stderr[-3000:])


def test_a_warm_start_runs_a_step_an_earlier_process_fused_as_one_program(tmp_path):
    """A process that finds an earlier one's programs on disk queues every stored op at its first call, and a
    queue whose fused program is stored runs it at its first sighting, loading no op's own executable: a warm
    start's first step is one stored program, not its ops one by one. The numbers, new to the second process,
    were on the device when the first stored the program: the queue's structure is the same."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCHNEURON_CACHE_DIR": str(tmp_path)}
    env.pop("TORCHNEURON_ADAPTIVE_EAGER", None)

    def run(steps: int, hidden: str) -> list:
        done = subprocess.run([sys.executable, "-c", WARM_START, str(steps), hidden], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return [int(n) for n in done.stdout.split()]

    # queued at once (each op compiling meanwhile) and replayed op by op (a new structure), then op by op again while
    # its fused program compiles and is stored, then fused
    assert run(3, "drop") == [1, 6, 0, 0]
    assert run(1, "drop") == [0, 6, 1, 0]
    # a queue no process fused runs op by op, its ops' five executables loaded together
    assert run(1, "keep") == [1, 0, 5, 5]
