"""JAX's profiler trace of the same run, as Chrome trace events on Kineto's time axis.

jax.profiler records what XLA did (on XLA:CPU the thunks its threads ran, on a GPU the kernels) on a
clock of its own. Right after both profilers start, a few JAX annotations are made, each inside a
torch.profiler range: the two record the same moment, which ties the clocks. The annotation's middle
lies within the range, so the alignment error is at most half the range's duration (the tightest of
the few is used: the first pays for warming up); `alignment_error_us` reports it.
"""
import glob
import os
import shutil
import tempfile

import jax
from torch._C._profiler import _RecordFunctionFast

_ANCHOR = "torchneuron_clock_anchor"
_TORCH_ANCHOR = "neuron::clock_anchor"
_ANCHORS = 5


class JaxTrace:
    def __init__(self):
        self.directory = None
        self.data = None
        self.alignment_error_us = None

    def start(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="torchneuron_jax_trace_")
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 0  # torch's trace has the Python side; JAX's tracer would slow every call
        try:
            jax.profiler.start_trace(self.directory, profiler_options=options)
        except RuntimeError:  # a JAX trace the user started is running: it has these events already
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
            return
        for _ in range(_ANCHORS):
            with _RecordFunctionFast(_TORCH_ANCHOR):
                with jax.profiler.TraceAnnotation(_ANCHOR):
                    pass

    def stop(self) -> None:
        if self.directory is None:
            return
        jax.profiler.stop_trace()
        files = glob.glob(os.path.join(self.directory, "**", "*.xplane.pb"), recursive=True)
        if files:
            self.data = jax.profiler.ProfileData.from_file(files[0])
        shutil.rmtree(self.directory, ignore_errors=True)

    def chrome_events(self, torch_events: list) -> list:
        """The trace's device and XLA-thread events, on the time axis of Kineto's `torch_events`."""
        if self.data is None:
            return []
        offset = self._offset_us(torch_events)
        if offset is None:
            return []
        found = []
        for plane in self.data.planes:
            if not (plane.name.startswith("/device:") or plane.name == "/host:CPU"):
                continue
            pid = f"XLA {plane.name} (jax.profiler)"
            found.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": pid}})
            for line in plane.lines:
                for event in line.events:
                    if event.duration_ns <= 0 or event.name == _ANCHOR:
                        continue
                    found.append({
                        "ph": "X", "cat": "xla", "name": event.name, "pid": pid, "tid": line.name,
                        "ts": event.start_ns / 1e3 + offset, "dur": event.duration_ns / 1e3,
                        "args": {k: v for k, v in event.stats if isinstance(v, (int, float, str))},
                    })
        return found

    def _offset_us(self, torch_events):
        """Kineto's clock minus JAX's (µs), from the tightest anchor pair."""
        ranges = sorted((e["ts"], e["dur"]) for e in torch_events if e.get("name") == _TORCH_ANCHOR)
        for plane in self.data.planes:
            for line in plane.lines:
                anchors = sorted((e.start_ns / 1e3, e.duration_ns / 1e3) for e in line.events if e.name == _ANCHOR)
                if len(anchors) == len(ranges) == _ANCHORS:
                    k = min(range(_ANCHORS), key=lambda i: ranges[i][1])
                    self.alignment_error_us = ranges[k][1] / 2
                    return ranges[k][0] + ranges[k][1] / 2 - (anchors[k][0] + anchors[k][1] / 2)
        return None
