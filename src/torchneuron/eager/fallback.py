"""CPU fallback for ops without a lowering: visible, counted, and optionally an error.

`TORCHNEURON_FALLBACK=error` turns every fallback into NotImplementedError.
"""
import collections
import contextlib
import os
import warnings

import torch
from torch.utils._pytree import tree_map

from ..runtime import events
from ..runtime.dtypes import UnsupportedDtype
from ..runtime.layout import storage_extent
from ..runtime.storage import buffers_lock
from ..runtime.tensor import NeuronTensor
from . import host_run, math_bits, transfers

counts = collections.Counter()
failures = {}
_warned = set()


def strict() -> bool:
    return os.environ.get("TORCHNEURON_FALLBACK", "").lower() == "error"


@contextlib.contextmanager
def as_error():
    """Within the block, falling back is an error (as TORCHNEURON_FALLBACK=error makes it everywhere)."""
    previous = os.environ.get("TORCHNEURON_FALLBACK")
    os.environ["TORCHNEURON_FALLBACK"] = "error"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TORCHNEURON_FALLBACK"]
        else:
            os.environ["TORCHNEURON_FALLBACK"] = previous


class FallbackError(NotImplementedError):
    pass


def announce(func, stacklevel: int) -> None:
    """`func` is about to run on the CPU: counted and reported (warned once), or refused (TORCHNEURON_FALLBACK=error)."""
    name = str(func)
    if strict():
        cause = f" (its lowering failed: {failures[name]})" if name in failures else ""
        raise FallbackError(
            f"torchneuron: {name} has no working neuron lowering{cause} and CPU fallback is disabled "
            "(TORCHNEURON_FALLBACK=error). Please report the op name at the project's issue tracker."
        )
    counts[name] += 1
    if events.listening:
        events.fallback(func)
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"torchneuron: {name} is not lowered for neuron yet; running it on the CPU",
                      stacklevel=stacklevel + 1)


def run_on_cpu(func, args, kwargs):
    """`func` run by its CPU kernel on host copies of its neuron tensors (host_run.HostCopies): what it writes
    is written back, what it returns is put on their device."""
    # the same frame with a listener as without: its span around the op (runtime.events.op) adds two
    announce(func, stacklevel=5 if events.listening else 3)
    tensors = [leaf for leaf in host_run.leaves(args, kwargs)
               if isinstance(leaf, NeuronTensor) or _is_neuron_sparse(leaf)]
    device = kwargs.get("device")
    device = torch.device(device) if _is_neuron(device) else tensors[0].device if tensors else None
    if device is None:  # no neuron tensor nor device: nothing to copy, nowhere to put the results
        return func(*args, **kwargs)
    device_index = device.index if device.index is not None else torch.neuron.current_device()
    # no other thread may write the storages read between their reading and their writing back (whole)
    with buffers_lock:
        copies = host_run.HostCopies(tensors, device_index, by_storage=_by_storage)
        cpu_args, cpu_kwargs = copies.arguments(args, kwargs)
        if "device" in cpu_kwargs and _is_neuron(cpu_kwargs["device"]):
            cpu_kwargs["device"] = "cpu"
        return copies.results(func, cpu_args, cpu_kwargs, func(*cpu_args, **cpu_kwargs))


def _by_storage(tensor) -> bool:
    return type(tensor) is NeuronTensor and not math_bits.flagged(tensor) and transfers.read_through_storage(tensor)


def _is_neuron_sparse(value) -> bool:
    """A sparse tensor on neuron (eager/sparse.py and sparse_compressed.py, whose unhandled ops come here)."""
    return isinstance(value, torch.Tensor) and value.layout in host_run.SPARSE_LAYOUTS and value.device.type == "neuron"


def _is_neuron(device) -> bool:
    return device is not None and torch.device(device).type == "neuron"


def note_failure(func, cause) -> None:
    """A lowering that failed to trace or compile: kept for the report, and the op falls back."""
    failures[str(func)] = f"{type(cause).__name__}: {cause}"[:500]


def report() -> dict:
    """Ops that ran on the CPU and how often, most frequent first."""
    return dict(counts.most_common())


def reset() -> None:
    counts.clear()
    failures.clear()


# inputs larger than this are not copied to the CPU just to learn its error message
_CPU_ERROR_BYTES = 8 << 20


# ops whose integer tensors are LAPACK pivots (row numbers from 1): zeros would send the CPU kernel down its
# invalid-pivot path (torch 2.11's ldl_solve then corrupts the heap), where ones are valid pivots
_TAKES_PIVOTS = {torch.ops.aten.linalg_ldl_solve, torch.ops.aten.linalg_lu_solve, torch.ops.aten.lu_solve,
                 torch.ops.aten.lu_unpack}


def on_cpu_zeros(func, args, kwargs, dtypes=None, empty=False):
    """`func` run on the CPU with zeros standing for each tensor argument (its shape, strides and dtype, or
    the dtype `dtypes` gives for its id): what the CPU kernel says of arguments like these. `empty`: each
    stands in with its rank and dtype but no elements (what the kernel says of the dtypes alone)."""
    dtypes = dtypes or {}
    pivots = getattr(func, "overloadpacket", None) in _TAKES_PIVOTS

    def zeros(value):
        if isinstance(value, torch.Tensor):
            dtype = dtypes.get(id(value), value.dtype)
            if empty:
                return torch.empty((0,) * value.dim(), dtype=dtype)
            fill = 1 if pivots and not (dtype.is_floating_point or dtype.is_complex) else 0
            # the view's own extent: a small view of a large storage costs its size, not the storage's
            return torch.full((storage_extent(value.shape, value.stride()),), fill, dtype=dtype).as_strided(
                value.shape, value.stride())
        if isinstance(value, torch.device) or value in ("meta", "neuron"):
            return torch.device("cpu")
        return value

    return func(*tree_map(zeros, args), **tree_map(zeros, kwargs))


def is_final(rule, failure) -> bool:
    """A lowering's failure the CPU must not be tried for: a library lowering's is its author's to see, and an
    unsupported dtype has no CPU kernel either."""
    return rule.checked_outputs or isinstance(failure, UnsupportedDtype)


def cpu_error(func, args, kwargs, empty_when_large=False):
    """The exception the CPU kernel raises for these arguments (zeros in place of the tensors), or None when
    it accepts them, they are too large to try (unless `empty_when_large`: then empty tensors of their ranks
    and dtypes are tried), or the op has no CPU kernel (CUDA's flash attention and SyncBatchNorm kernels,
    which neuron lowers: the CPU has nothing to say)."""
    tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
    large = sum(t.untyped_storage().nbytes() for t in tensors) > _CPU_ERROR_BYTES
    if large and not empty_when_large:
        return None
    try:
        on_cpu_zeros(func, args, kwargs, empty=large)
    except Exception as error:
        return None if _NO_CPU_KERNEL in str(error) else error
    return None


_NO_CPU_KERNEL = "with arguments from the 'CPU' backend"
