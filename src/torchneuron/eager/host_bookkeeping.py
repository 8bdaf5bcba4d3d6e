"""Small integer ops whose shapes keep changing run on the host: a shape that recurs is compiled, unless the op
keeps growing.

An XLA device compiles a program for each new signature (50-200 ms on XLA:CPU), and a signature that never
comes back pays that for one run. Hugging Face's generate() is made of them: the sequence's int64 tensors grow
by one token at each step, so the few ops on them (cat, isin, clone, add) are new signatures at every token, four
compiles a token with the static cache. Such ops are cheap on the host and exact there (integer and bool values
are the same on any device). So where a signature is new, its tensors are all small integer or bool ones, and
the op was seen before with the same arguments but for its tensors' shapes (its "shapes change"), PyTorch's CPU
kernel runs it (its inputs read from the device, its outputs put back, as a fallback's); a signature seen a
third time is compiled. Two host runs, not one: such bookkeeping often runs an op twice a step on tensors of one
shape (generate()'s input_ids and position_ids grow together). An op's first shape compiles at once, as every
op's does, so a training loop's fixed shapes fuse from its third step as before.

An op seen with more than GROWING new shapes in a row, each larger than the last, is a growing sequence's: its
new shapes stay on the host however often they recur. generate() called again with the same lengths would
otherwise compile each length's ops at its third call, and each token's adaptive eager queue, holding its own
length's programs, would be a structure of its own, fused only after three more calls; on the host they are
outside the queues, which recur token after token. Shapes that recur among new ones (a training loop's buckets
of sequence lengths, in any order) keep compiling at their third sighting: a host run reads its inputs, which
cuts the step's queue and waits for the device. Not counted as a fallback: the op has a lowering.

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
from ..runtime.storage import buffers_lock
from .host_run import HostCopies

# tensors (their storages' elements, together) small enough that a round trip through the host costs less than
# a compile
MAX_ELEMENTS = 1 << 14

enabled = os.environ.get("TORCHNEURON_HOST_BOOKKEEPING", "1") != "0"

# runs on the host a signature gets before it is compiled
HOST_RUNS = 2

# new shapes in a row, each larger than the last, beyond which an op is growing: its new signatures are never compiled
GROWING = 8

counts = collections.Counter()  # op name -> its runs on the host

_sighted = collections.Counter()  # signatures run on the host -> how often

_ops = {}  # an op's signature without its tensors' shapes -> _Shapes

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


def run(rule, key, signature, storages, views, tensors, filled, queue):
    """The op's results from the CPU, if this run of `rule`'s op, of the new signature `signature` (`key`, or the
    same with offsets as arguments) whose tensors `tensors` view `storages` as `views` say (program.storage_views),
    is small and integer enough, its shapes change, it has not run on the host twice yet (or the op is growing),
    and the CPU takes it; else NOT_RUN. `filled(values)` gives the op's arguments and keyword arguments with
    `values` for its tensors."""
    if not enabled or not views or rule.random or rule.checked_outputs or queue.capture is not None or sync.debug_mode:
        return NOT_RUN
    elements = sum(v[2] for v in views)
    if elements > MAX_ELEMENTS or not all(_exact(v[3]) and v[0][3] == v[3] for v in views):
        return NOT_RUN
    # the signature but for its views' shapes, strides, offsets and storage sizes (eager.executable's key)
    shapeless = (key[:3], tuple((v[0][3], v[1], v[3]) for v in views), key[4:])
    shapes = _ops.get(shapeless)
    if shapes is None:
        if len(_ops) >= eager_cache.capacity:
            _ops.clear()
        _ops[shapeless] = _Shapes(signature)
        return NOT_RUN
    if shapes.first == signature:
        return NOT_RUN
    if getattr(_this_thread, "on_host", False):
        return NOT_RUN  # the host run's own device ops: copying an out= the kernel resized back to the device
    runs = _sighted.pop(signature, 0)
    shapes.sighted(signature, runs == 0, elements)
    if runs >= HOST_RUNS and not shapes.growing:
        return NOT_RUN
    _this_thread.on_host = True
    try:
        # no other thread may write these storages between their reading and the results' writing back
        with buffers_lock:
            result = _on_host(rule.op, storages, views, tensors, filled)
    finally:
        _this_thread.on_host = False
    if result is NOT_RUN:
        return NOT_RUN
    if len(_sighted) >= eager_cache.capacity:
        _sighted.clear()
    _sighted[signature] = runs + 1
    counts[str(rule.op)] += 1
    return result


class _Shapes:
    """What an op's new signatures have shown: its first (compiled at once), and whether it is growing."""

    def __init__(self, first):
        self.first = first
        self.growing = False
        self._larger_in_a_row = 0  # new signatures in a row, each with more elements than the one before
        self._last = None  # the signature seen last, and its elements
        self._last_elements = 0

    def sighted(self, signature, new: bool, elements: int) -> None:
        """`signature`, with `elements` in its storages, seen again (not `new`) or for the first time."""
        if self.growing or signature == self._last:
            return  # the same signature twice in a row: generate() grows its ids and its mask together
        self._larger_in_a_row = self._larger_in_a_row + 1 if new and elements > self._last_elements else 0
        self._last, self._last_elements = signature, elements
        self.growing = self._larger_in_a_row > GROWING


def _on_host(func, storages, views, tensors, filled):
    """`func` run by its CPU kernel on host copies of its tensors, read through their storages (host_run); NOT_RUN
    where the CPU refuses it (a dtype it lacks a kernel for, as histc of ints, which CUDA and neuron run; bad
    input): the device gives its answer or its error, raised where it would be (at synchronisation for a
    device-side check)."""
    copies = HostCopies(tensors, storages[0].device_index, storages=storages, views=views)
    args, kwargs = filled(copies.copies)
    if "device" in kwargs:
        kwargs["device"] = "cpu"
    try:
        out = func(*args, **kwargs)
    except Exception:  # noqa: BLE001
        return NOT_RUN
    return copies.results(func, args, kwargs, out)


def _exact(dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex)
