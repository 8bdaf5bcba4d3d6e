"""Small integer ops whose shapes keep changing run on the host, until a shape of theirs recurs.

An XLA device compiles a program for each new signature (50-200 ms on XLA:CPU), and a signature that never
comes back pays that for one run. Hugging Face's generate() is made of them: the sequence's int64 tensors grow
by one token at each step, so the few ops on them (cat, isin, clone, add) are new signatures at every token, four
compiles a token with the static cache. Such ops are cheap on the host and exact there (integer and bool values
are the same on any device). So where a signature is new, its tensors are all small integer or bool ones, and
the op was seen before with the same arguments but for its tensors' shapes (its "shapes change"), PyTorch's CPU
kernel runs it (its inputs read from the device, its outputs put back, as a fallback's); only a signature seen a
third time is compiled. Two host runs, not one: such bookkeeping often runs an op twice a step on tensors of one
shape (generate()'s input_ids and position_ids grow together). An op's first shape compiles at once, as every
op's does, so a training loop's fixed shapes fuse from its third step as before. Not counted as a fallback: the
op has a lowering.

`TORCHNEURON_HOST_BOOKKEEPING=0` or `torch.neuron.host_bookkeeping(False)` turns it off (the OpInfo sweep
does, to test each lowering at its first sighting). It never applies while a graph is captured, nor under
`torch.neuron.set_sync_debug_mode`, as reading the inputs waits for the device.
"""
import collections
import contextlib
import os
import threading

from ..runtime import sync
from ..runtime.cache import eager_cache
from . import fallback

# tensors (their storages' elements, together) small enough that a round trip through the host costs less than
# a compile
MAX_ELEMENTS = 1 << 14

enabled = os.environ.get("TORCHNEURON_HOST_BOOKKEEPING", "1") != "0"

# runs on the host a signature gets before it is compiled
HOST_RUNS = 2

counts = collections.Counter()  # op name -> its runs on the host

_sighted = collections.Counter()  # signatures run on the host -> how often

_first_shapes = {}  # an op's signature without its tensors' shapes -> the first signature it was seen with

_this_thread = threading.local()


def set_enabled(on: bool) -> None:
    global enabled
    enabled = bool(on)


@contextlib.contextmanager
def enabled_within(on: bool = True):
    previous = enabled
    set_enabled(on)
    try:
        yield
    finally:
        set_enabled(previous)


# what `run` gives for a run left to the device
NOT_RUN = object()


def run(rule, key, signature, views, queue, func, args, kwargs):
    """The op's results from the CPU, if this run of `rule`'s op, of the new signature `signature` (`key`, or the
    same with offsets as arguments) whose tensors' views are `views` (program.storage_views), is small and
    integer enough, its shapes change, it has not run on the host twice yet, and the CPU takes it; else NOT_RUN."""
    if not enabled or not views or rule.random or rule.checked_outputs or queue.capture is not None or sync.debug_mode:
        return NOT_RUN
    if sum(v[2] for v in views) > MAX_ELEMENTS or not all(_exact(v[0][3]) and _exact(v[3]) for v in views):
        return NOT_RUN
    # the signature but for its views' shapes, strides, offsets and storage sizes (eager.executable's key)
    shapeless = (key[:3], tuple((v[0][3], v[1], v[3]) for v in views), key[4:])
    first = _first_shapes.get(shapeless)
    if first is None:
        if len(_first_shapes) >= eager_cache.capacity:
            _first_shapes.clear()
        _first_shapes[shapeless] = signature
    if first is None or first == signature:
        return NOT_RUN
    if getattr(_this_thread, "on_host", False):
        return NOT_RUN  # the host run's own device ops: writing its results back through a view is a copy_
    runs = _sighted.pop(signature, 0)
    if runs == HOST_RUNS:
        return NOT_RUN
    _this_thread.on_host = True
    try:
        result = fallback.on_cpu(func, args, kwargs)
    except Exception:  # noqa: BLE001
        # a dtype the CPU lacks a kernel for (histc of ints, which CUDA and neuron run), or bad input: the device
        # gives its answer or its error (raised where it would be, at synchronisation for a device-side check)
        return NOT_RUN
    finally:
        _this_thread.on_host = False
    if len(_sighted) >= eager_cache.capacity:
        _sighted.clear()
    _sighted[signature] = runs + 1
    counts[str(rule.op)] += 1
    return result


def _exact(dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex)
