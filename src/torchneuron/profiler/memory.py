"""Neuron memory snapshots and history, in the format of torch.cuda.memory's.

    torch.neuron.memory._record_memory_history()        # start recording allocations and frees
    ...
    snapshot = torch.neuron.memory_snapshot()           # live storages + the recorded timeline
    torch.neuron.memory._dump_snapshot("snapshot.pickle")  # for https://pytorch.org/memory_viz
    torch.neuron.memory._record_memory_history(enabled=None)  # stop

Each neuron storage is one segment holding one block (PJRT allocates each buffer on its own). The
timeline (`device_traces`) has an "alloc" and a "free_completed" entry per storage with the Python
stack that made it, as CUDA's does; torch.cuda._memory_viz renders it.
"""
import os
import pickle
import sys
import time
import traceback

import torch

from ..runtime import events, storage as storages
from ..runtime.platform import device_count

_history = None
# torch.cuda.memory's allocator statistics: torch.neuron's own functions, found by name as torch.neuron.memory.X
_DEVICE_MODULE_FUNCTIONS = frozenset((
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_cached",
    "max_memory_cached", "reset_peak_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached",
    "memory_stats", "memory_stats_as_nested_dict", "reset_accumulated_memory_stats", "memory_summary",
    "mem_get_info", "empty_cache", "set_per_process_memory_fraction", "get_per_process_memory_fraction",
    "device_memory_used",
))


def __getattr__(name):
    if name in _DEVICE_MODULE_FUNCTIONS:
        return getattr(torch.neuron, name)
    raise AttributeError(f"module 'torch.neuron.memory' has no attribute {name!r}")


class _History:
    """The recording listener: a bounded list of (device, action, address, bytes, time, frames) entries."""

    wants_device_time = False

    def __init__(self, max_entries: int, stacks: bool):
        self.max_entries = max_entries
        self.stacks = stacks
        self.entries = []
        self.frames = {}  # address -> frames of the allocation, for the snapshot's blocks

    def begin(self, kind, name, details):
        return None

    def end(self, token, details):
        pass

    def instant(self, kind, name, details):
        if kind not in ("alloc", "free") or not name.nbytes:  # empty storages hold no memory
            return
        address = name.data_ptr()
        if kind == "alloc":
            frames = _frames() if self.stacks else []
            self.frames[address] = frames
            action = "alloc"
        else:
            frames = self.frames.pop(address, [])
            action = "free_completed"
        self.entries.append({"action": action, "addr": address, "size": name.nbytes, "stream": 0,
                             "time_us": time.time_ns() // 1000, "frames": frames, "device": name.device_index})
        if len(self.entries) > self.max_entries:
            del self.entries[: len(self.entries) - self.max_entries]


_PACKAGE = os.path.dirname(sys.modules["torchneuron"].__file__) + os.sep


def _frames() -> list:
    """The allocating stack, innermost first, from the first frame outside torchneuron."""
    stack = traceback.extract_stack()
    while stack and stack[-1].filename.startswith(_PACKAGE):
        stack.pop()
    return [{"filename": f.filename, "line": f.lineno, "name": f.name} for f in reversed(stack)]


def _record_memory_history(enabled="all", context=None, stacks="python", max_entries: int = 100_000) -> None:
    """Start (enabled="all" or "state") or stop (enabled=None) recording neuron allocations and frees, as
    torch.cuda.memory._record_memory_history does; stacks="python" records each allocation's stack."""
    global _history
    if _history is not None:
        events.stop_listening(_history)
        _history = None
    if enabled:
        _history = _History(max_entries, stacks is not None and stacks != "none")
        events.listen(_history)


def memory_snapshot() -> dict:
    """Every live neuron storage as a segment, and the recorded history per device (torch.cuda's format)."""
    segments = []
    for storage in storages.live_storages():
        if not storage.nbytes:
            continue
        address = storage.data_ptr()
        frames = _history.frames.get(address, []) if _history is not None else []
        block = {"address": address, "size": storage.nbytes, "requested_size": storage.nbytes,
                 "state": "active_allocated", "frames": frames}
        segments.append({"device": storage.device_index, "address": address, "total_size": storage.nbytes,
                         "allocated_size": storage.nbytes, "active_size": storage.nbytes,
                         "requested_size": storage.nbytes, "stream": 0, "segment_type": "large",
                         "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames, "blocks": [block]})
    traces = [[] for _ in range(device_count())]
    for entry in _history.entries if _history is not None else []:
        entry = dict(entry)
        traces[entry.pop("device")].append(entry)
    return {"segments": segments, "device_traces": traces, "allocator_settings": {}}


def _snapshot() -> dict:
    return memory_snapshot()


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    with open(filename, "wb") as f:
        pickle.dump(memory_snapshot(), f)
