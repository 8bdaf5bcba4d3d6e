"""Adaptive eager: queue ops instead of running them, then run the queue as one fused executable.

An op whose eager executable has already run once (so its lowering, meta and
compile are known good) is recorded instead of run: its outputs become
`Pending` buffers of new storages, and its inputs are either buffers that exist
(the queue's external inputs) or values an earlier queued op produces. Reading
a pending buffer (a transfer, `item()`, an op that is not queued, the CPU
fallback, `torch.neuron.synchronize()`), an op that donates buffers, or the
queue reaching its limit runs the queue: the queued programs are traced into
one function, keyed by the queue's structure, so the second iteration of a
loop replays a cached fused executable. Only values some live storage still
holds are returned; XLA drops the rest. Op order, random numbers and errors
are those of op-by-op eager (each op traces the same program; meta errors are
raised at the op, before it is queued); XLA may fuse arithmetic across ops, so
floating-point results can differ in the last bits. If the fused program fails,
the queue is replayed op by op.

Opt-in: `torch.neuron.set_adaptive_eager(True)`, the `torch.neuron.adaptive_eager()`
context manager, or TORCHNEURON_ADAPTIVE_EAGER=1.
"""
import contextlib
import os
import threading
import weakref

import jax

from ..runtime import sync
from ..runtime.cache import ExecutableCache
from ..runtime.storage import Pending

fused_cache = ExecutableCache(int(os.environ.get("TORCHNEURON_ADAPTIVE_CACHE_SIZE", "256")))


class Queue:
    def __init__(self, limit: int):
        self.limit = limit
        self.enabled = False
        self.lock = threading.RLock()
        self.flushes = 0
        self.ops_fused = 0
        self.replays = 0
        self._reset()

    def _reset(self):
        self.ops = []  # (executable, argument value numbers, number of its first output)
        self.externals = []  # the values that exist: buffers, scalars, random keys
        self.external_values = []  # their value numbers
        self.external_index = {}  # id(buffer) -> value number, so a buffer read twice is one input
        self.outputs = []  # (value number, weak reference to its Pending)
        self.n_values = 0
        self.device_index = None

    def record(self, executable, buffers, extras) -> list:
        """Queue one run of `executable` on `buffers` (arrays or Pendings) and `extras` (scalars, key);
        returns a Pending for each of its outputs."""
        with self.lock:
            if self.device_index != executable.device_index:
                self.flush()
                self.device_index = executable.device_index
            args = []
            for buffer in buffers:
                if type(buffer) is Pending and buffer.array is None:
                    args.append(buffer.value)
                else:
                    args.append(self._external(buffer.array if type(buffer) is Pending else buffer))
            for extra in extras:
                args.append(self._new_external(extra))
            first = self.n_values
            pendings = []
            run_queue = self.flush
            for numel in executable.output_sizes:
                pending = Pending(numel, self.n_values, run_queue)
                self.outputs.append((self.n_values, weakref.ref(pending)))
                pendings.append(pending)
                self.n_values += 1
            self.ops.append((executable, tuple(args), first))
            if len(self.ops) >= self.limit:
                self.flush()
            return pendings

    def _external(self, buffer) -> int:
        value = self.external_index.get(id(buffer))
        if value is None:
            value = self.external_index[id(buffer)] = self._new_external(buffer)
        return value

    def _new_external(self, value) -> int:
        self.externals.append(value)
        self.external_values.append(self.n_values)
        self.n_values += 1
        return self.n_values - 1

    def flush(self) -> None:
        with self.lock:
            if not self.ops:
                return
            ops, externals, device_index = self.ops, self.externals, self.device_index
            live = [(value, pending) for value, ref in self.outputs if (pending := ref()) is not None]
            kept = tuple(value for value, _ in live)
            key = (tuple((e, args) for e, args, _ in ops), tuple(self.external_values), kept)
            n_values, external_values = self.n_values, self.external_values
            self._reset()
            self.flushes += 1
            self.ops_fused += len(ops)
            fused = fused_cache.get(key)
            if fused is None:
                fused = jax.jit(_fused_program(ops, n_values, external_values, kept))
                fused_cache.put(key, fused)
            try:
                results = fused(*externals)
            except Exception:
                self.replays += 1
                results = _replay(ops, n_values, external_values, externals, kept)
            for (_, pending), array in zip(live, results):
                pending.array = array
            if results:
                sync.last[device_index] = results[-1]


def _fused_program(ops, n_values, external_values, kept):
    def fused(*externals):
        values = [None] * n_values
        for number, value in zip(external_values, externals):
            values[number] = value
        for executable, args, first in ops:
            results = executable.program(*[values[a] for a in args])
            values[first : first + len(results)] = results
        return tuple(values[v] for v in kept)

    return fused


def _replay(ops, n_values, external_values, externals, kept):
    """The queue op by op, each through its own (already compiled) executable."""
    values = [None] * n_values
    for number, value in zip(external_values, externals):
        values[number] = value
    for executable, args, first in ops:
        results = executable.compiled(*[values[a] for a in args])
        values[first : first + len(results)] = results
    return tuple(values[v] for v in kept)


queue = Queue(int(os.environ.get("TORCHNEURON_ADAPTIVE_MAX_OPS", "512")))


def set_enabled(enabled: bool) -> None:
    if not enabled:
        queue.flush()
    queue.enabled = bool(enabled)


def is_enabled() -> bool:
    return queue.enabled


@contextlib.contextmanager
def enabled(on: bool = True):
    previous = queue.enabled
    set_enabled(on)
    try:
        yield
    finally:
        set_enabled(previous)


def flush() -> None:
    queue.flush()


def stats() -> dict:
    return {
        "queued": len(queue.ops),
        "flushes": queue.flushes,
        "ops_fused": queue.ops_fused,
        "replays": queue.replays,
        "fused_cache": fused_cache.stats(),
    }


set_enabled(os.environ.get("TORCHNEURON_ADAPTIVE_EAGER", "0") == "1")
