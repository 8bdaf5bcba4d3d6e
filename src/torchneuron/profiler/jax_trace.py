"""JAX's profiler trace of the same run, as Chrome trace events on the host clock.

jax.profiler records what XLA did (on XLA:CPU the thunks its threads ran, on a GPU the kernels) with
timestamps of its own origin. An annotation made right after the trace starts is found in the trace
and ties the two clocks: its time on the host clock is known to within half the time taken to make
it, which is the alignment error reported (`alignment_error_ns`).
"""
import glob
import os
import shutil
import tempfile
import time

import jax

_ANCHOR = "torchneuron_clock_anchor"
_ANCHORS = 5


class JaxTrace:
    def __init__(self):
        self.directory = None
        self.anchor_ns = self.anchor_index = None
        self.alignment_error_ns = None
        self.data = None

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
        windows = []
        for _ in range(_ANCHORS):
            before = time.time_ns()
            with jax.profiler.TraceAnnotation(_ANCHOR):
                pass
            windows.append((time.time_ns() - before, before))
        # the tightest of a few: the first annotation pays for warming up
        self.anchor_index = windows.index(min(windows))
        width, before = windows[self.anchor_index]
        self.anchor_ns = before + width / 2
        self.alignment_error_ns = width / 2

    def stop(self) -> None:
        if self.directory is None:
            return
        jax.profiler.stop_trace()
        files = glob.glob(os.path.join(self.directory, "**", "*.xplane.pb"), recursive=True)
        if files:
            self.data = jax.profiler.ProfileData.from_file(files[0])
        shutil.rmtree(self.directory, ignore_errors=True)

    def chrome_events(self, base_ns: int) -> list:
        """The trace's device and XLA-thread events, on Kineto's time axis (`base_ns` its origin)."""
        if self.data is None:
            return []
        offset = self._offset()
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
                        "ts": (event.start_ns + offset - base_ns) / 1e3, "dur": event.duration_ns / 1e3,
                        "args": {k: v for k, v in event.stats if isinstance(v, (int, float, str))},
                    })
        return found

    def _offset(self):
        """Host clock minus the trace's clock, from the tightest anchor annotation."""
        for plane in self.data.planes:
            for line in plane.lines:
                anchors = sorted((e.start_ns, e.duration_ns) for e in line.events if e.name == _ANCHOR)
                if len(anchors) == _ANCHORS:
                    start, duration = anchors[self.anchor_index]
                    return self.anchor_ns - (start + duration / 2)
        return None
