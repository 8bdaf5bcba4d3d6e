"""torch.neuron.nvtx: torch.cuda.nvtx's annotations, as ranges of torch.profiler's trace.

Neuron has no NVTX. Code written for CUDA marks its phases with torch.cuda.nvtx; on neuron the same calls
open record_function ranges, which torch.profiler (and its Chrome trace) shows around the backend's own
neuron:: ranges. Outside a profiler session a range records nothing.
"""
import contextlib
import itertools
import threading

from torch.autograd.profiler import record_function

_nested = threading.local()  # each thread's stack of ranges opened by range_push, as NVTX keeps one per thread
_started = {}  # range_start's ranges by id: they may end on another thread, in any order
_ids = itertools.count(1)


def _opened(msg: str) -> record_function:
    annotation = record_function(msg)
    annotation.__enter__()
    return annotation


def _stack() -> list:
    if not hasattr(_nested, "ranges"):
        _nested.ranges = []
    return _nested.ranges


def range_push(msg: str) -> int:
    """Opens a range nested in this thread's open ones; returns its depth (0: the outermost), as NVTX."""
    ranges = _stack()
    ranges.append(_opened(msg))
    return len(ranges) - 1


def range_pop() -> int:
    """Closes this thread's innermost range; returns the depth it had, or -1 when none was open, as NVTX."""
    ranges = _stack()
    if not ranges:
        return -1
    ranges.pop().__exit__(None, None, None)
    return len(ranges)


def range_start(msg: str) -> int:
    """Opens a range that need not nest (it may end on another thread); returns the id `range_end` takes."""
    range_id = next(_ids)
    _started[range_id] = _opened(msg)
    return range_id


def range_end(range_id: int) -> None:
    _started.pop(range_id).__exit__(None, None, None)


def mark(msg: str) -> None:
    """An instant: a range of no length."""
    _opened(msg).__exit__(None, None, None)


@contextlib.contextmanager
def range(msg: str, *args, **kwargs):
    """A range around a block or a function (as a decorator); `msg.format(*args, **kwargs)` names it."""
    range_push(msg.format(*args, **kwargs))
    try:
        yield
    finally:
        range_pop()
