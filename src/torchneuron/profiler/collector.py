"""The doctor's listener: totals of what the backend did, with the user's call sites.

While it listens, executables are waited for (device time), so a run is serialised as under
TORCHNEURON_LAUNCH_BLOCKING; the totals are what one run of the program costs, op by op.
"""
import collections
import heapq
import logging
import os
import sys
import time

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from ..runtime import events, memory

_LIBRARY_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules["torchneuron"]))
_PYTHON_DIR = os.path.dirname(os.__file__) + os.sep
_TIMELINE_LIMIT = 20_000
_PEAK_SNAPSHOTS = 1.05  # the largest live tensors are noted again when the peak grows by 5%
_LARGEST = 8
_EVICTED = "evicted from the executable cache (TORCHNEURON_EAGER_CACHE_SIZE)"


def call_site() -> str:
    """The innermost frame of the user's code (not torch's, torchneuron's or the standard library's)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if not (path.startswith(_LIBRARY_DIRS) or path.startswith(_PYTHON_DIR) or path.startswith("<")):
            return f"{path}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "(no user frame: autograd's backward or library code)"


class Collector:
    wants_device_time = True

    def __init__(self):
        self.started = time.perf_counter_ns()
        self.ops = collections.defaultdict(lambda: [0, 0])  # op -> [calls, host ns]
        self.programs = collections.defaultdict(lambda: [0, 0, 0])  # executable -> [runs, device ns, max ns]
        self.compiles = collections.defaultdict(lambda: [0, 0])  # op or graph -> [compiles, ns]
        self.signatures = collections.defaultdict(dict)  # op or graph -> its signatures, in order (as keys)
        self.recompiles = []  # (op or graph, cause, call site, optimizer steps taken before it)
        self.fallbacks = collections.Counter()  # (op, call site) -> calls
        self.transfers = collections.defaultdict(lambda: [0, 0, 0])  # direction -> [count, bytes, ns]
        self.flushes = collections.Counter()  # flushes, ops, compiles, op by op
        self.replays = collections.Counter()  # replays, ops, compiles (captured graphs: torch.neuron.graph)
        self.timeline = []  # (seconds since start, bytes allocated on all devices)
        self.live = {}  # id(storage) -> (bytes, device, dtype, call site)
        self.peak = 0
        self.largest_at_peak = []
        self.step_ends = []  # seconds since start at the end of each step of an optimizer of neuron parameters
        self.dynamo_recompiles = []
        self.graph_breaks = collections.Counter()
        self._noted_peak = 0
        self._hooks = []

    # --- listening -----------------------------------------------------------------------------------

    def __enter__(self):
        self._graph_breaks_before = collections.Counter(torch._dynamo.utils.counters["graph_break"])
        self._hooks.append(register_optimizer_step_post_hook(self._step))
        self._recompile_log = _RecompileLog(self.dynamo_recompiles)
        events.listen(self)
        return self

    def __exit__(self, *exc):
        events.stop_listening(self)
        for hook in self._hooks:
            hook.remove()
        self._recompile_log.close()
        after = torch._dynamo.utils.counters["graph_break"]
        self.graph_breaks = collections.Counter({k: v - self._graph_breaks_before.get(k, 0) for k, v in after.items()})
        self.graph_breaks += collections.Counter()  # drops the reasons seen only before
        self.elapsed_ns = time.perf_counter_ns() - self.started

    def _step(self, optimizer, args, kwargs):
        if any(p.device.type == "neuron" for group in optimizer.param_groups for p in group["params"][:1]):
            self.step_ends.append((time.perf_counter_ns() - self.started) / 1e9)

    # --- the events protocol -------------------------------------------------------------------------

    def begin(self, kind, name, details):
        return kind, name, time.perf_counter_ns()

    def end(self, token, details):
        kind, name, start = token
        elapsed = time.perf_counter_ns() - start
        name = str(name)
        if kind == "op":
            entry = self.ops[name]
            entry[0] += 1
            entry[1] += elapsed
        elif kind in ("compile", "graph_compile"):
            entry = self.compiles[name]
            entry[0] += 1
            entry[1] += elapsed
        elif kind == "execute":
            entry = self.programs[name]
            entry[0] += 1
            entry[1] += elapsed
            entry[2] = max(entry[2], elapsed)
        elif kind == "transfer":
            entry = self.transfers[name]
            entry[0] += 1
            entry[1] += details["bytes"]
            entry[2] += elapsed
        elif kind == "flush":
            self.flushes["flushes"] += 1
            self.flushes["ops"] += details["ops"]
            self.flushes["compiles"] += details["cache"] == "miss"
            self.flushes["op by op"] += details["cache"] == "op by op"
        elif kind == "graph_replay":
            self.replays["replays"] += 1
            self.replays["ops"] += details["ops"]
            self.replays["compiles"] += details["cache"] == "miss"

    def instant(self, kind, name, details):
        if kind == "alloc":
            self.live[id(name)] = (name.nbytes, name.device_index, name.dtype, call_site())
            self._note_memory()
        elif kind == "free":
            self.live.pop(id(name), None)
            self._note_memory()
        elif kind == "fallback":
            self.fallbacks[(str(name), call_site())] += 1
        elif kind == "signature":
            name, key = str(name), details["key"]
            known = self.signatures[name]
            if known:
                cause = _EVICTED if key in known else recompile_cause(details["what"], next(reversed(known)), key)
                self.recompiles.append((name, cause, call_site(), len(self.step_ends)))
            known.pop(key, None)
            known[key] = None  # the latest last

    def _note_memory(self):
        allocated = sum(a.allocated for a in memory.accounts.values())
        if len(self.timeline) < _TIMELINE_LIMIT:
            self.timeline.append(((time.perf_counter_ns() - self.started) / 1e9, allocated))
        else:  # thin out: keep every other point, then go on
            del self.timeline[::2]
        if allocated > self.peak:
            self.peak = allocated
            if allocated > self._noted_peak * _PEAK_SNAPSHOTS:
                self._noted_peak = allocated
                self.largest_at_peak = heapq.nlargest(_LARGEST, self.live.values(), key=lambda v: v[0])


class _RecompileLog(logging.Handler):
    """Dynamo's recompilation reasons (its `recompiles` log artifact), kept instead of printed."""

    _NAME = "torch._dynamo.guards.__recompiles"

    def __init__(self, sink: list):
        super().__init__(logging.DEBUG)
        self.sink = sink
        self.logger = logging.getLogger(self._NAME)
        self.state = torch._logging._internal.log_state
        self.was_enabled = self.state.is_artifact_enabled("recompiles")
        self.previous = (self.logger.level, self.logger.propagate)
        self.state.enable_artifact("recompiles")
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = self.was_enabled
        self.logger.addHandler(self)

    def emit(self, record):
        self.sink.append(record.getMessage())

    def close(self):
        self.logger.removeHandler(self)
        self.logger.setLevel(self.previous[0])
        self.logger.propagate = self.previous[1]
        if not self.was_enabled:
            self.state.artifact_names.discard("recompiles")
        super().close()


def recompile_cause(what: str, old, new) -> str:
    """Why a new executable was built for an op (eager key) or a compiled graph (graph key)."""
    old_specs, new_specs = _specs(what, old), _specs(what, new)
    if len(old_specs) != len(new_specs):
        return "number of tensor arguments"
    for index, label in ((0, "shape"), (3, "dtype"), (4, "device")):
        if any(a[index] != b[index] for a, b in zip(old_specs, new_specs)):
            return label
    if any(a[1:3] != b[1:3] for a, b in zip(old_specs, new_specs)):
        return "strides or storage offset"
    if what == "graph":
        return "symbolic size or other non-tensor input values (dynamic=True specialises on them)"
    return "scalar or static arguments"


def _specs(what, key) -> list:
    # eager: (op, args, kwargs, views, scalar types, default dtype); graph: (views, non-tensor inputs); a view
    # is (spec, storage number, storage size, storage dtype), spec = (shape, stride, offset, dtype, device)
    return [view[0] for view in key[3 if what == "eager" else 0]]
