"""Streams and events: `torch.Stream` and `torch.Event` of the neuron device.

PJRT orders each device's work itself, so all neuron streams of a device are
one in-order queue: work never overlaps across streams, `wait_stream` and
`wait_event` have nothing to wait for, and a stream's id only names it. Events
go through the native device guard: recording one with timing waits for the
work queued so far and notes the time, so `elapsed_time` measures real work.
"""
import functools
import itertools

import torch

from .guard import _all_ready, _index, synchronize

_current_streams = {}  # device index -> the stream set as current (else the default stream)
_stream_ids = itertools.count(1)  # 0 is each device's default stream
_NEURON = int(torch._C._autograd.DeviceType.PrivateUse1)  # c10::DeviceType, as torch.Stream takes it


class Stream(torch.Stream):
    def __new__(cls, device=None, priority: int = 0, *, stream_id=None, **kwargs):
        index = _index(device)
        stream_id = next(_stream_ids) if stream_id is None else stream_id
        return super().__new__(cls, stream_id=stream_id, device_index=index, device_type=_NEURON)

    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.priority = priority

    def wait_stream(self, stream) -> None:
        return None

    def wait_event(self, event) -> None:
        return None

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def synchronize(self) -> None:
        synchronize(self.device_index)

    def query(self) -> bool:
        return _all_ready(self.device_index)

    def __repr__(self):
        return f"<torch.neuron.Stream device={self.device} stream_id={self.stream_id}>"


class Event:
    """A neuron `torch.Event` (held, not subclassed: torch.Event's elapsed_time takes only its own type)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.event = torch.Event(device="neuron", enable_timing=enable_timing, blocking=blocking,
                                 interprocess=interprocess)

    @property
    def device(self):
        return self.event.device

    def record(self, stream=None) -> None:
        self.event.record(stream if stream is not None else current_stream())

    def query(self) -> bool:
        return self.event.query()

    def synchronize(self) -> None:
        self.event.synchronize()

    def wait(self, stream=None) -> None:
        return None

    def elapsed_time(self, end: "Event") -> float:
        return self.event.elapsed_time(end.event)


class StreamContext:
    def __init__(self, stream):
        self.stream = stream
        self.previous = None

    def __enter__(self):
        if self.stream is not None:
            self.previous = _current_streams.get(self.stream.device_index)
            _current_streams[self.stream.device_index] = self.stream
        return self.stream

    def __exit__(self, *exc):
        if self.stream is not None:
            _current_streams[self.stream.device_index] = self.previous
        return False


def current_stream(device=None) -> Stream:
    index = _index(device)
    return _current_streams.get(index) or default_stream(index)


@functools.cache
def _default_stream(index: int) -> Stream:
    return Stream(index, stream_id=0)


def default_stream(device=None) -> Stream:
    return _default_stream(_index(device))


def set_stream(stream) -> None:
    _current_streams[stream.device_index] = stream


def stream(stream) -> StreamContext:
    return StreamContext(stream)
