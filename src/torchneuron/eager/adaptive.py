"""Adaptive eager: queue ops instead of running them, then run the queue as one fused executable.

An op whose eager executable has already run once, or was compiled by an earlier
process and found on disk (so its lowering, meta and compile are known good), is
recorded instead of run; so is a new one, its program compiling meanwhile on a
compile thread (Executable._compiles_ahead: the new ops between two reads compile
side by side; one whose compile fails gets its results from the CPU at the flush,
as it would have at the op). Its outputs become `Pending` buffers of new storages,
and its inputs are either buffers that exist (the queue's external inputs) or
values an earlier queued op produces. Reading a pending buffer (a transfer,
`item()`, an op that is not queued, the CPU fallback,
`torch.neuron.synchronize()`), an op that donates buffers, a loop boundary (a
backward starting or ending, an optimizer step, the queue starting over) or the
queue reaching its limit runs the queue. Each thread records a queue of its own. The
first time a queue's structure is seen its ops run one by one through their
compiled executables; when the same structure comes round again (the next
iteration of a loop) the queued programs are traced into one function, which
compiles on a compile thread while the ops run one by one once more, and from
the third sighting on the structure runs as that one fused executable. A
structure whose fused executable an earlier process stored
runs it at once: a warm start's first step loads a few programs, not each
op's. Only values some live storage still holds are returned; XLA drops the
rest. Op order, random numbers and errors are those of op-by-op eager (each op
traces the same program; meta errors are raised at the op, before it is
queued); XLA may fuse arithmetic across ops, so floating-point results can
differ in the last bits. If the fused program fails, the queue is replayed op
by op.

A graph capture (torch.neuron.graph) records into the capturing thread's queue, which nothing may cut while it
captures, and keeps it as a CapturedGraph: one program replayed on the storages it read and wrote.

On by default. Off: `torch.neuron.set_adaptive_eager(False)`, the
`torch.neuron.adaptive_eager(False)` context manager, or TORCHNEURON_ADAPTIVE_EAGER=0.
"""
import contextlib
import functools
import hashlib
import os
import sys
import threading
import weakref

import jax
import jax.numpy as jnp
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from ..runtime import compilation_cache, events, pending_checks, rng, sync
from ..runtime.cache import ExecutableCache
from ..runtime.dtypes import to_jax
from ..runtime.platform import jax_device, platform_name
from ..runtime.program import (OverMesh, compile_ahead, compile_on_device, compiles_ahead, fast_call,
                               jit_on_device)
from ..runtime.storage import Pending, buffers_lock, live_storages
from ..runtime.transfer import device_scalars, scalar_key

_NUMBERS = (float, int, bool)
# the autograd engine's graph task running on this thread, -1 outside a backward
_current_graph_task = torch._C._current_graph_task_id
fused_cache = ExecutableCache(int(os.environ.get("TORCHNEURON_ADAPTIVE_CACHE_SIZE", "256")))


# what every thread's queue has done (stats())
_counts = dict.fromkeys(("flushes", "ops_fused", "values_kept", "replays", "first_sightings"), 0)
# structure key -> None, oldest first: the structures run once, op by op (whichever thread's queue ran them)
_sighted = {}
# the queues holding ops, of any thread: what a flush of all runs
_nonempty = set()


class Queue:
    """One thread's queue: each thread records its own ops, so that threads running their own loops (requests
    served in threads, a data thread beside the training loop) each keep the structures of their loop, where one
    queue cut at every change of thread ran most ops one by one. One lock for all: a queue reads what another
    queued by running it, and a program about to donate a buffer runs each queue that reads it (`run_readers`)."""

    enabled = False  # for every thread, as CUDA's settings are
    lock = buffers_lock

    def __init__(self, limit: int):
        self.limit = limit
        self._run = self.flush  # one bound method for every Pending
        self.capture = None  # the Capture being recorded (torch.neuron.graph), which no flush may cut
        self._reset()

    def _reset(self):
        self.ops = []  # (executable, argument value numbers, number of its first output)
        self.externals = []  # the values that exist: buffers, scalars, random keys
        self.external_values = []  # their value numbers
        self.inputs = {}  # id(array), or a Python number's scalar_key -> value number (see `_new_input`)
        self.pendings = []  # a weak reference to every result of a queued op: those still alive are kept
        self.n_values = 0
        self.device_index = None
        self.recorder = None  # the autograd graph task recording the queue
        _nonempty.discard(self)

    def record(self, executable, storages, extras, generator=None) -> list:
        """Queue one run of `executable` on the buffers of `storages` and on `extras` (scalars, then the random
        key a random op draws from `generator`); returns a Pending for each of its results."""
        with self.lock:
            # forward, backward and the optimizer step queue apart: a backward runs on the calling thread
            # (patches.backward_runs_on_the_calling_thread) as a graph task of its own
            recorder = _current_graph_task()
            if (self.device_index != executable.device_index or self.recorder != recorder
                    or self._repeats(executable)):
                if self.capture is None:
                    self.flush()
                elif self.device_index not in (None, executable.device_index):
                    raise RuntimeError(f"neuron: a graph captures one device's work; {executable.op} runs on "
                                       f"neuron:{executable.device_index}, the capture on neuron:{self.device_index}")
                self.device_index, self.recorder = executable.device_index, recorder
                _boundaries.install()  # here, not when enabled: a process that never queues an op has no hook
            inputs, args, capture = self.inputs, [], self.capture
            for p in executable.argument_storages:
                buffer = storages[p]._buffer
                if type(buffer) is Pending:
                    if buffer.array is None:
                        if buffer._run_queue is self._run:
                            args.append(buffer.number)
                            continue
                        ops = self.ops
                        buffer.resolve()  # another thread's queue computes it
                        # and ran this one (an op-by-op run first runs the queues reading its inputs)
                        if self.ops is not ops:
                            return self.record(executable, storages, extras, generator)
                    buffer = buffer.array
                elif buffer is None:
                    buffer = storages[p].buffer
                number = inputs.get(id(buffer))
                if number is None:
                    number = self._new_input(id(buffer), buffer)
                    if capture is not None:
                        capture.reads[number] = storages[p]
                args.append(number)
            for extra in extras:
                # a number is one input however it reaches the program (as itself the first time
                # device_scalars sees it, then put on the device): a queue's structure, and the fused
                # program it names, do not depend on which numbers were new
                is_number = type(extra) in _NUMBERS
                key = scalar_key(type(extra), extra, self.device_index) if is_number else id(extra)
                number = inputs.get(key)
                if number is None:
                    number = self._new_input(
                        key, device_scalars([extra], self.device_index)[0] if is_number else extra)
                args.append(number)
            if capture is not None and executable.random:
                capture.keys[args[-1]] = generator
            first = self.n_values
            sizes = executable.output_sizes
            if len(sizes) == 1:
                pendings = [Pending(sizes[0], first, self._run)]
                self.pendings.append(weakref.ref(pendings[0]))
            else:
                pendings = [Pending(numel, first + k, self._run) for k, numel in enumerate(sizes)]
                self.pendings += map(weakref.ref, pendings)
            self.n_values += len(pendings)
            if not self.ops:
                _nonempty.add(self)
            self.ops.append((executable, tuple(args), first))
            if len(self.ops) >= self.limit and capture is None:
                self.flush()
            return pendings

    def _repeats(self, executable) -> bool:
        """The queue, past half its limit, is about to record its first op again: cut it here, so that a
        loop which never reads a value (nor steps an optimizer) is cut at the same op in every iteration."""
        return len(self.ops) >= self.limit // 2 and executable is self.ops[0][0]

    @staticmethod
    def _first_sighting(key) -> bool:
        """Whether the queue's structure is new; remembers it (boundedly) if so."""
        if key in _sighted:
            del _sighted[key]  # the fused program compiled now lives in fused_cache
            return False
        if len(_sighted) >= fused_cache.capacity:
            del _sighted[next(iter(_sighted))]
        _sighted[key] = None
        return True

    def _fused_run(self, key, ops, n_values, external_values, kept, externals, device_index):
        """How this flush runs the queue as one program (None: op by op, through the ops' own executables), and
        whether that compiles it.

        A structure seen once may never come back (a test, a loop whose shapes change each iteration): its ops
        run one by one. At its second sighting its fused program is traced and starts compiling on a compile
        thread while the ops run one by one once more; from the third on it runs fused, its first run waiting
        for the compile if need be. Which sighting runs fused never depends on a thread's timing, so neither do
        a loop's results (fused arithmetic may differ in the last bits). A structure an earlier process stored
        runs fused at once, loaded from disk; without compile threads (TORCHNEURON_COMPILE_THREADS=0) the
        second sighting compiles and runs it."""
        fused = fused_cache.get(key)
        if type(fused) is _CompilingAhead:
            return fused.run_first, True
        if fused is not None:
            return fused, False
        path = _disk_path(ops, external_values, kept, externals, device_index)
        if not compilation_cache.stored(path):
            if self._first_sighting(key):
                _counts["first_sightings"] += 1
                return None, False
            program = _fused_program(ops, n_values, external_values, kept)
            ahead = _CompilingAhead.start(key, program, device_index, externals, path)
            if ahead is not None:
                fused_cache.put(key, ahead)
                return None, False
        return functools.partial(_compile_and_run, key, ops, n_values, external_values, kept, device_index, path), True

    def _new_input(self, key, value) -> int:
        """The value number of `value`, which exists and is no input yet; `record` looks the inputs up itself (a
        method call per argument is a measurable part of queueing an op). One input however many ops read it:
        an array (a buffer, a kept device scalar, a random key) by identity, a number given as itself
        (transfer.device_scalars) by its type and bits. A foreach optimizer step gives each parameter its own
        copy of the step size, and each number passed to an executable is a transfer at the call (1-2 us each
        on XLA:CPU)."""
        number = self.inputs[key] = self.n_values
        self.externals.append(value)
        self.external_values.append(number)
        self.n_values += 1
        return number

    def flush(self) -> None:
        with self.lock:
            if not self.ops:
                return
            if self.capture is not None:
                raise RuntimeError(
                    "neuron: this operation reads a value computed inside the graph being captured "
                    "(torch.neuron.graph), or waits for the device: not permitted while capturing, as on CUDA. "
                    "Read values after capture_end(), from the graph's outputs after replay().")
            ops, externals, device_index = self.ops, self.externals, self.device_index
            # a result is needed if its Pending is still alive (a storage holds it)
            live = [p for p in (ref() for ref in self.pendings) if p is not None]
            kept = tuple(p.number for p in live)
            key = (tuple((e, args) for e, args, _ in ops), tuple(self.external_values), kept)
            n_values, external_values = self.n_values, self.external_values
            self._reset()
            _counts["flushes"] += 1
            _counts["values_kept"] += len(live)
            results = None
            try:
                run, compiles = self._fused_run(key, ops, n_values, external_values, kept, externals, device_index)
                if run is not None:
                    results = (events.flush(run, externals, len(ops), device_index, compiles) if events.listening
                               else run(*externals))
                    _counts["ops_fused"] += len(ops)
            except Exception:
                _counts["replays"] += 1
            if results is None:
                results = _replay(ops, n_values, external_values, externals, kept, device_index)
            for pending, array in zip(live, results):
                pending.array = array
            if results:
                sync.last[device_index] = results[-1]


def _evaluate(ops, n_values, external_values, externals, kept, run_op):
    """The queue's kept values, each op run by `run_op(executable, arguments)`."""
    values = [None] * n_values
    for number, value in zip(external_values, externals):
        values[number] = value
    for executable, args, first in ops:
        results = run_op(executable, [values[a] for a in args])
        values[first : first + len(results)] = results
    return tuple(values[v] for v in kept)


def _fused_program(ops, n_values, external_values, kept, name=None):
    """One traceable function of the queue: each op's program inlined (its eager executable's jit is not)."""

    def fused(*externals):
        return _evaluate(ops, n_values, external_values, externals, kept, lambda e, args: e.program.function(*args))

    fused.__name__ = fused.__qualname__ = name or events.fused_name(len(ops))
    return fused


def _compile_and_run(key, ops, n_values, external_values, kept, device_index, path, *externals):
    """A queue structure's second sighting, or first where `path` holds it: its fused program compiled (or loaded
    from disk), run, and cached."""
    fused, results = _compiled_at_first_run(_fused_program(ops, n_values, external_values, kept), device_index,
                                            externals, path)
    fused_cache.put(key, fused)
    return results


class _CompilingAhead:
    """A queue structure's fused program, compiling on a compile thread since its second sighting: the cache's entry
    for it until its first run (at the third sighting) puts the compiled program there."""

    @classmethod
    def start(cls, key, program, device_index: int, externals, path):
        """Traced here, lowered and compiled on a compile thread; None where there is none (program.compile_ahead).
        Not traced there: the ops' lowerings may run PyTorch's tracing (make_fx, for decompositions), whose state
        is the process's, not the thread's."""
        if not compiles_ahead():
            return None
        traced = jit_on_device(program, device_index).trace(*externals)
        compiling = compile_ahead(compilation_cache.compile_and_store, path, lambda: traced.lower().compile())
        return compiling and cls(key, compiling)

    def __init__(self, key, compiling):
        self.key, self.compiling = key, compiling

    def run_first(self, *externals):
        """Its first run, waiting for the compile; a compile that failed raises here each time, and the queue runs
        op by op."""
        compiled = self.compiling.result()
        results = compiled(*externals)
        fused_cache.replace(self.key, fast_call(compiled))
        return results


def _disk_path(ops, external_values, kept, externals, device_index: int):
    """Where the fused program of this queue is kept on disk (runtime/compilation_cache.py): named by its ops'
    signatures (None if one has no name there, see executable._disk_key), how they connect, and its inputs' types."""
    names = [getattr(executable, "disk_key", None) for executable, _, _ in ops]
    if None in names:
        return None
    inputs = [_input_type(x) for x in externals]
    structure = repr(([args for _, args, _ in ops], external_values, kept, inputs))
    return compilation_cache.entry_path("fused", platform_name(), jax_device(device_index), structure, *names)


_input_types = {}  # (shape, dtype, weak typing) -> its text


def _input_type(x) -> str:
    """A fused program input's shape, dtype and weak typing as text: a number and the device's copy of it alike.
    Each distinct one is written once: `repr(jax.typeof(x))` takes 5 us, a dtype's repr 3 us, and every first
    sighting of a queue looks its program up on disk."""
    aval = x if isinstance(x, jax.Array) else jax.typeof(x)
    key = aval.shape, aval.dtype, aval.weak_type
    text = _input_types.get(key)
    if text is None:
        if len(_input_types) >= 4096:
            _input_types.clear()
        text = _input_types[key] = repr(key)
    return text


def _compiled_at_first_run(program, device_index: int, externals, path=None):
    """`program` compiled for `externals` (or loaded from `path`, where it is stored) and run on them: how to call
    it from now on, as eager executables keep theirs (JAX's C++ call, which the first call sets), and the first
    run's results."""
    def compile():
        return compilation_cache.compile_and_store(path, lambda: compile_on_device(program, device_index, externals))

    loaded, _ = compilation_cache.load(path, jax_device(device_index)) or (None, None)
    compiled, results = compilation_cache.run_first(path, loaded, externals, compile)
    return fast_call(compiled), results


def _replay(ops, n_values, external_values, externals, kept, device_index):
    """The queue op by op, each through its own (already compiled) executable, which donates the buffers it
    writes: other threads' queues that read them run first."""
    run_readers(externals)
    executables = list(dict.fromkeys(e for e, _, _ in ops))
    type(executables[0]).load_stored(executables, device_index)  # executable.Executable, which imports this module
    if not events.listening:
        return _evaluate(ops, n_values, external_values, externals, kept, lambda e, args: e.compiled(*args))
    return events.flush_op_by_op(_evaluate, (ops, n_values, external_values, externals, kept, events.launch),
                                 len(ops), len(externals), device_index)


class Capture:
    """What a graph capture (torch.neuron.graph) notes beside the queue: where its inputs came from."""

    def __init__(self):
        self.reads = {}  # value number of an input buffer -> the storage it was read from
        self.keys = {}  # value number of a random op's key -> the generator it was drawn from (None: the default)
        self.mesh = None  # the processes' devices a captured collective spans: the graph is a program of all
        self.agree = None  # checks with those processes that they replay the same program

    def spans(self, mesh, agree, what: str) -> None:
        """A collective over `mesh` (a process group's devices) is captured: the graph becomes one program of
        the group's ranks, as a compiled graph with collectives does; `agree(description)` checks that every
        rank compiles the same one."""
        if self.mesh is not None and self.mesh != mesh:
            raise RuntimeError(f"neuron: {what} uses another process group than the collectives captured before it: "
                               "a graph (torch.neuron.graph) captures the collectives of one process group")
        self.mesh, self.agree = mesh, agree


class CapturedGraph:
    """The ops recorded while a graph was captured, as one program run again at each `replay()`: it reads the
    buffers its input storages hold then, writes its results into the storages the capture wrote (tensors
    made in the capture, and inputs it updated in place), and draws new keys for its random ops from their
    generators, as CUDA graphs advance their Philox offsets."""

    def __init__(self, ops, n_values, externals, external_values, capture, writes, checks, device_index):
        position = {number: i for i, number in enumerate(external_values)}
        # with each storage read, its size when captured (which the program is compiled for)
        self.reads = [(position[number], storage, externals[position[number]].shape[0])
                      for number, storage in capture.reads.items()]
        self.keys = [(position[number], generator) for number, generator in capture.keys.items()]
        # what replay reads anew is not kept: a captured training step would hold its parameters twice
        self.externals = list(externals)
        for i, *_ in self.reads + self.keys:
            self.externals[i] = None
        self.writes = [storage for storage, _ in writes]
        self.checks = [(op, len(numbers), errors) for op, numbers, errors in checks]
        kept = tuple(number for _, number in writes) + tuple(n for _, numbers, _ in checks for n in numbers)
        self.program = _fused_program(ops, n_values, external_values, kept, events.graph_name(len(ops)))
        self.ops = ops  # the executables the program inlines
        self.device_index = device_index
        self.compiled = None
        self.mesh, self.agree = capture.mesh, capture.agree
        # over a mesh each replay passes only what it reads anew, each process's shard of an array over the
        # mesh; the numbers are constants of the program
        self.given = sorted(i for i, *_ in self.reads + self.keys)
        # what the ranks compare before the first replay: the ops, how they connect, what each collective does
        self.structure = None if self.mesh is None else [
            [(str(e.op), getattr(e, "signature", None), args) for e, args, _ in ops], external_values, kept]

    def replay(self) -> None:
        # no other thread may donate a buffer the graph reads between its taking it and the program's launch
        with Queue.lock:
            current().flush()  # work queued before the replay: it may write what the graph reads
            externals = list(self.externals)
            for i, storage, numel in self.reads:
                externals[i] = storage.buffer if storage.numel == numel else self._freed(storage, numel)
            for i, generator in self.keys:
                externals[i] = rng.next_key(self.device_index, generator)
            run = self.compiled or self._compile_and_run
            results = (events.graph_replay(run, externals, len(self.ops), self.device_index, self.compiled is None)
                       if events.listening else run(*externals))
            for storage, array in zip(self.writes, results):
                storage.buffer = array
        checked = results[len(self.writes):]
        for op, n, errors in self.checks:
            pending_checks.add(self.device_index, op, checked[:n], errors)
            checked = checked[n:]
        if results:
            sync.last[self.device_index] = results[-1]

    def _freed(self, storage, numel: int):
        """What a replay reads of a storage freed since the capture read it (resized to 0, as FSDP2 frees the
        unsharded parameters between uses): zeros of the captured size, what it would hold once resized back.
        A storage resized to another size cannot be read by the program compiled for the captured one. Filled
        on the device: an unsharded parameter's zeros copied from the host at each replay would cost a transfer
        of its size."""
        if storage.numel:
            raise RuntimeError(f"neuron: a storage the captured graph reads held {numel} elements when captured and "
                               f"holds {storage.numel} now: resize it back before replay()")
        return jnp.zeros((numel,), to_jax(storage.dtype), device=jax_device(self.device_index))

    def _compile_and_run(self, *externals):
        if self.mesh is None:
            self.compiled, results = _compiled_at_first_run(self.program, self.device_index, externals)
            return results
        given = [externals[i] for i in self.given]
        avals = [(x.shape, x.dtype.name) for x in given]
        digest = hashlib.sha256(repr((self.structure, avals)).encode()).hexdigest()
        self.agree(f"captured graph {self.program.__name__} {digest[:16]}")
        self.compiled = functools.partial(_given, OverMesh(self._with_constants(), self.mesh, given), self.given)
        return self.compiled(*externals)

    def _with_constants(self):
        """The program of the arguments each replay gives, with the capture's numbers in it."""
        constants, given, program = self.externals, self.given, self.program

        def graph(*arrays):
            externals = list(constants)
            for i, array in zip(given, arrays):
                externals[i] = array
            return program(*externals)

        graph.__name__ = program.__name__
        return graph


def _given(run, given, *externals):
    return run(*[externals[i] for i in given])


def capturing() -> bool:
    """Whether this thread captures a graph (torch.neuron.graph)."""
    return current().capture is not None


def refuse_while_capturing(what: str) -> None:
    """Work that would run at once instead of being recorded (a transfer, a data-dependent op, a collective
    distributed/captured.py does not record) is refused while a graph is captured: it would not run again at
    replay."""
    if capturing():
        raise RuntimeError(f"neuron: {what} cannot be captured in a graph (torch.neuron.graph): only ops on the "
                           "capture's device are recorded. Run it before the capture or after replay().")


def begin_capture() -> None:
    queue = current()
    with queue.lock:
        if queue.capture is not None:
            raise RuntimeError("neuron: a graph is already being captured")
        queue.flush()
        queue.capture = Capture()


def end_capture(keep: bool = True):
    """The CapturedGraph of the ops recorded since `begin_capture` (None if not `keep`: a capture that
    failed). Like CUDA's, the capture ran nothing: each storage it wrote holds again what it held before
    (a tensor made in the capture, zeros) until the first replay."""
    queue = current()
    with queue.lock:
        capture, queue.capture = queue.capture, None
        ops, externals, external_values = queue.ops, queue.externals, queue.external_values
        n_values, device_index = queue.n_values, queue.device_index
        live = {id(p): p for p in (ref() for ref in queue.pendings) if p is not None}
        queue._reset()
    position = {number: i for i, number in enumerate(external_values)}
    before = {id(storage): externals[position[number]] for number, storage in capture.reads.items()}
    writes = []
    for storage in live_storages():
        if type(storage._buffer) is Pending and id(storage._buffer) in live:
            writes.append((storage, storage._buffer.number))
            storage._buffer = before.get(id(storage))
    checks = pending_checks.take(device_index, lambda c: type(c) is Pending and id(c) in live)
    if not keep or not ops:
        return None
    checks = [(op, [c.number for c in conditions], errors) for op, conditions, errors in checks]
    return CapturedGraph(ops, n_values, externals, external_values, capture, writes, checks, device_index)


class _ThreadQueue(threading.local):
    def __init__(self):
        global threads_seen
        self.queue = Queue(int(os.environ.get("TORCHNEURON_ADAPTIVE_MAX_OPS", "512")))
        threads_seen += 1


threads_seen = 0  # how many threads have run neuron ops: past one, what runs at once takes the queues' lock


_this_thread = _ThreadQueue()


def current() -> Queue:
    """The calling thread's queue."""
    return _this_thread.queue


class _LoopBoundaries:
    """Runs the queue after each optimizer step, so that a training step's queues start at the same ops in
    every iteration and iterations replay the same few fused executables; queues cut only by the op limit
    would start at a different op in each iteration, and each new structure is a new compile. No module hooks:
    any global module hook makes every module call take PyTorch's slower path and `torch.compile(module)` warn."""

    def __init__(self):
        self.handle = None
        self.traceable = False

    def install(self):
        """Register the hook; once Dynamo is imported, as one it traces (see `_after_step`). Importing Dynamo
        here would add a second to every `import torch` (the backend autoloads): whoever compiles, or makes
        an optimizer, imports it, and the next install (each change of recorder calls it) upgrades."""
        traceable = _dynamo_loaded()
        if self.handle is not None and (self.traceable or not traceable):
            return
        self.remove()
        hook = self._after_step
        if traceable:
            # torch < 2.13 lacks it: its compiled graphs break at the hook, which is slower but correct
            hook = getattr(torch._dynamo, "dont_skip_tracing", lambda fn: fn)(hook)
        self.handle, self.traceable = register_optimizer_step_post_hook(hook), traceable

    def remove(self):
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    # torch.compile traces global hooks into its graphs (Dynamo skips torchneuron's frames, so this is
    # marked traceable, or it would break the graph): there it does nothing. Around a compiled optimizer it
    # runs eagerly but inside Dynamo's frame evaluation, which must not try to compile the queue's run.
    def _after_step(self, optimizer, args, kwargs):
        if not torch.compiler.is_compiling() and current().capture is None:
            # a process without Dynamo compiles nothing
            flush = _flush_outside_dynamo() if _dynamo_loaded() else _flush_this_thread
            flush()


def _dynamo_loaded() -> bool:
    return "torch._dynamo" in sys.modules


def _flush_this_thread() -> None:
    current().flush()


@functools.cache
def _flush_outside_dynamo():
    return torch.compiler.disable(_flush_this_thread)


_boundaries = _LoopBoundaries()


def set_enabled(enabled: bool) -> None:
    if not enabled:
        flush()
        _boundaries.remove()
    Queue.enabled = bool(enabled)


def is_enabled() -> bool:
    return Queue.enabled


@contextlib.contextmanager
def enabled(on: bool = True):
    previous = Queue.enabled
    set_enabled(on)
    try:
        yield
    finally:
        set_enabled(previous)


def flush() -> None:
    """Run every thread's queue (a synchronisation, or a program about to donate buffers they may read), but
    another thread's capturing a graph, whose ops run at replay (this thread's refuses, as CUDA does)."""
    this_thread = current()
    with Queue.lock:
        for queue in list(_nonempty):
            if queue.capture is None or queue is this_thread:
                queue.flush()


def run_readers(buffers) -> None:
    """Run each thread's queue that reads one of `buffers` (a program is about to donate them), but one capturing
    a graph, which reads them at replay."""
    if not _nonempty:
        return
    with Queue.lock:
        for queue in list(_nonempty):
            if queue.capture is None and any(id(buffer) in queue.inputs for buffer in buffers):
                queue.flush()


def stats() -> dict:
    """Of all threads' queues; "queued": the ops this thread's queue holds."""
    return {"queued": len(current().ops), **_counts, "fused_cache": fused_cache.stats()}


set_enabled(os.environ.get("TORCHNEURON_ADAPTIVE_EAGER", "1") != "0")
