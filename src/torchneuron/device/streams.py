"""Streams and events over asynchronous PJRT execution.

PJRT orders each device's work itself, so every neuron stream is one ordered
queue: work never overlaps across streams, and waiting on a stream or event
means waiting for the device buffers produced so far.
"""
import time

import torch

from . import module


class Stream:
    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.device = torch.device("neuron", module._index(device))
        self.priority = priority

    def synchronize(self) -> None:
        module.synchronize(self.device)

    def query(self) -> bool:
        return module._all_ready(self.device.index)

    def wait_stream(self, stream) -> None:
        # one ordered queue per device: later work already follows earlier work
        return None

    def wait_event(self, event) -> None:
        return None

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def __eq__(self, other):
        return isinstance(other, Stream) and other.device == self.device

    def __hash__(self):
        return hash(self.device)

    def __repr__(self):
        return f"<torch.neuron.Stream device={self.device}>"


class Event:
    """Records a point in the device's queue; with enable_timing, the time that point completed."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self.device = None
        self._time = None

    def record(self, stream=None) -> None:
        self.device = (stream.device if stream is not None else torch.device("neuron", module.current_device()))
        if self.enable_timing:
            # completion time needs the queue drained; timing events are for measuring, where that is wanted
            module.synchronize(self.device)
            self._time = time.perf_counter()

    def query(self) -> bool:
        return self.device is None or module._all_ready(self.device.index)

    def synchronize(self) -> None:
        if self.device is not None:
            module.synchronize(self.device)

    def wait(self, stream=None) -> None:
        return None

    def elapsed_time(self, end: "Event") -> float:
        if self._time is None or end._time is None:
            raise RuntimeError("Both events must be recorded with enable_timing=True before elapsed_time()")
        return (end._time - self._time) * 1000.0


class StreamContext:
    def __init__(self, stream):
        self.stream = stream
        self.previous = None

    def __enter__(self):
        if self.stream is not None:
            self.previous = module._current_streams.get(self.stream.device.index)
            module._current_streams[self.stream.device.index] = self.stream
        return self.stream

    def __exit__(self, *exc):
        if self.stream is not None:
            module._current_streams[self.stream.device.index] = self.previous
        return False
