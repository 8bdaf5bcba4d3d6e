"""torch.profiler on neuron code: the backend's work as named ranges, memory events, a device track.

While a torch.profiler session runs (patches.py tells `Sessions`), every runtime event becomes a
record_function range under the ATen op that caused it:

    neuron::<op>             host dispatch of one op on neuron tensors (e.g. neuron::aten.add.Tensor)
    neuron::compile          an executable's first run: trace and XLA compile (a cache miss)
    neuron::launch           a cached executable's run (a cache hit)
    neuron::execute          waiting for the device to finish it: its device time
    neuron::transfer_h2d/_d2h/_d2d   a transfer, with its bytes (record_shapes=True shows them)
    neuron::cpu_fallback     an op run on the CPU
    neuron::adaptive_flush   adaptive eager's run of its queue (fused, or op by op the first time a
                             structure is seen), with its op count
    neuron::graph_replay     a captured graph's replay (torch.neuron.graph), with its op count
    neuron::graph_compile    a torch.compile graph compiled or loaded from the disk cache

so `key_averages()` sums them. Executables are waited for while a session runs, so their device time is
measured (and the run is serialised, as CUDA_LAUNCH_BLOCKING would). With profile_memory=True every
neuron allocation and free reaches the profiler as a PrivateUse1 memory event. With the neuron activity
(ProfilerActivity.PrivateUse1, named NEURON once the backend is registered) JAX's own profiler records
the same run, and `export_chrome_trace` adds its XLA events and a per-device track of the executions.
"""
import json

import torch
from torch._C._profiler import _RecordFunctionFast

from ..native import _C as native
from ..runtime import events
from . import jax_trace

_SPAN_NAMES = {
    "compile": "neuron::compile",
    "launch": "neuron::launch",
    "execute": "neuron::execute",
    "flush": "neuron::adaptive_flush",
    "graph_replay": "neuron::graph_replay",
    "graph_compile": "neuron::graph_compile",
}
_KEPT_SESSIONS = 4


class _Session:
    """The listener of one torch.profiler session."""

    wants_device_time = True

    def __init__(self, with_jax: bool):
        self.jax = jax_trace.JaxTrace() if with_jax else None

    def begin(self, kind, name, details):
        if kind == "op":
            record = _RecordFunctionFast(f"neuron::{name}")
        elif kind == "transfer":
            record = _RecordFunctionFast(f"neuron::transfer_{name}", (), details)
        else:
            record = _RecordFunctionFast(_SPAN_NAMES[kind], (), {"op": str(name), **details})
        record.__enter__()
        return record

    def end(self, record, details):
        record.__exit__(None, None, None)

    def instant(self, kind, name, details):
        if kind == "fallback":
            with _RecordFunctionFast("neuron::cpu_fallback", (), {"op": str(name)}):
                pass
        elif kind in ("alloc", "free"):
            nbytes = name.nbytes if kind == "alloc" else -name.nbytes
            native.report_memory(name.data_ptr(), nbytes, name.account.allocated, name.device_index)


class Sessions:
    """events.session_handler: one _Session per torch.profiler session, kept until its trace is exported."""

    def __init__(self):
        self.current = None
        self.finished = {}  # id(kineto results) -> (results, session); the results kept so ids stay unique

    def start(self, activities, config):
        neuron = torch.profiler.ProfilerActivity.PrivateUse1
        self.current = _Session(with_jax=neuron in set(activities))
        events.listen(self.current)
        if self.current.jax is not None:
            self.current.jax.start()

    def stop(self):
        if self.current is not None:
            events.stop_listening(self.current)
            if self.current.jax is not None:
                self.current.jax.stop()

    def stopped(self, results):
        if self.current is None:
            return
        self.finished[id(results)] = (results, self.current)
        while len(self.finished) > _KEPT_SESSIONS:
            self.finished.pop(next(iter(self.finished)))
        self.current = None

    def exported(self, results, path):
        found = self.finished.get(id(results))
        if found is not None and str(path).endswith(".json"):
            add_device_tracks(path, found[1])


def add_device_tracks(path, session: _Session) -> None:
    """Complete a Chrome trace Kineto wrote with a track per neuron device (its executions, named by op or
    graph, from the neuron::execute ranges) and, when recorded, JAX's trace."""
    with open(path) as f:
        trace = json.load(f)
    added, devices = [], set()
    for event in trace["traceEvents"]:
        if event.get("name") == "neuron::execute" and event.get("ph") == "X":
            device = event["args"].get("device", 0)
            devices.add(device)
            added.append({"ph": "X", "cat": "neuron_device", "name": event["args"].get("op", "?"),
                          "pid": f"neuron:{device}", "tid": "executions", "ts": event["ts"], "dur": event["dur"]})
    for device in sorted(devices):
        added.append({"ph": "M", "name": "process_name", "pid": f"neuron:{device}",
                      "args": {"name": f"neuron:{device} (device time: the wait for each execution)"}})
    if session.jax is not None:
        added += session.jax.chrome_events(trace["traceEvents"])
        trace["torchneuron"] = {"jax_trace_alignment_error_us": session.jax.alignment_error_us}
    trace["traceEvents"] += added
    with open(path, "w") as f:
        json.dump(trace, f)
