"""Device storage: one flat PJRT buffer shared by every tensor that views it.

PyTorch tensors alias; JAX arrays are immutable. A Storage is the mutable
cell: tensors are (storage, sizes, strides, offset) exactly as in PyTorch, and
a write through any of them replaces the storage's buffer.
"""
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..native import _C as native
from . import events
from .memory import accounts, check_fits
from .dtypes import to_jax
from .platform import jax_device
from .transfer import put


class Pending:
    """A storage's next buffer, queued by adaptive eager and not computed yet: reading it runs the queue.

    It stands in for the flat buffer wherever one is only described (its `shape`), so output tensors of
    queued ops are built exactly as those of executed ones.
    """

    __slots__ = ("shape", "number", "array", "_run_queue", "__weakref__")

    def __init__(self, numel: int, number: int, run_queue):
        self.shape = (numel,)
        self.number = number  # its number among the queue's values
        self.array = None
        self._run_queue = run_queue

    def resolve(self) -> jax.Array:
        if self.array is None:
            self._run_queue()
            if self.array is None:
                raise RuntimeError(
                    "neuron: this tensor's value was never computed because running the queued ops failed "
                    "(adaptive eager; see the first error). Please report it with the failing code."
                )
        return self.array


# taken by a program that donates buffers from taking them until their storages hold its new ones (once several
# threads run neuron ops), and by adaptive eager's queues to record and run (eager/adaptive.py)
buffers_lock = threading.RLock()


def read_buffers(storages, use):
    """`use(buffers)` of the storages' buffers, done again on their newer buffers where another thread's program
    donated one being read meanwhile: a read racing a write gets the old values or the new ones (on CUDA, either
    or a mix of the two), not "Array has been deleted"."""
    while True:
        buffers = [storage.buffer for storage in storages]
        try:
            return use(buffers)
        except Exception:
            deleted = [(storage, buffer) for storage, buffer in zip(storages, buffers) if buffer.is_deleted()]
            if not deleted:
                raise
            with buffers_lock:  # a donor lets go once the storage holds its new buffer
                if all(storage._buffer is buffer for storage, buffer in deleted):
                    raise  # deleted, not donated: there is nothing newer to read


def _zeros(numel: int, dtype, device_index: int) -> jax.Array:
    """A zero buffer for a storage read before it is written (an out= tensor from `torch.empty`): a host
    array put on the device (transfer.put), a fraction of `jnp.zeros`'s cost, which runs an eager computation,
    and with no compile per size as a jitted program would have. Committed to its device: programs reading
    only uncommitted arrays run on the default device."""
    return put(np.zeros(numel, dtype), jax_device(device_index))


# every live Storage, by id, for the memory snapshot
_live = {}


class Storage:
    """The device buffer shared by every tensor viewing it. Its native storage (a torch.UntypedStorage:
    data_ptr, resize_, storage identity), made for the first tensor and shared by the rest, keeps this
    Storage alive, and this Storage refers to it only weakly (`native`): a tensor or a storage object the
    user holds keeps the bytes, as on CUDA (native/storage.cpp)."""

    __slots__ = ("_buffer", "device_index", "dtype", "numel", "nbytes", "account", "native", "address",
                 "__weakref__")

    def __init__(self, numel: int, dtype, device_index: int, buffer=None):
        self.numel = numel
        self.dtype = dtype  # torch dtype of the elements
        self.device_index = device_index
        self.nbytes = nbytes = numel * dtype.itemsize
        self._buffer = buffer  # None: allocated but never written (reads as zeros); or Pending
        self.account = accounts[device_index]
        self.account.allocate(nbytes)
        self.native = None  # no native storage yet
        self.address = None  # its data pointer, given when first asked
        _live[id(self)] = weakref.ref(self)
        if events.listening:
            events.alloc(self)

    # bound here: storages still alive at interpreter exit are freed after module globals are cleared
    def __del__(self, events=events, live=_live):
        self.account.allocated -= self.nbytes
        if events.listening:
            events.free(self)
        live.pop(id(self), None)

    @property
    def handle(self):
        """The native storage (a torch.UntypedStorage) every tensor viewing this one shares."""
        return native.native_storage(self)

    def data_ptr(self) -> int:
        return native.storage_address(self)

    @property
    def buffer(self) -> jax.Array:
        buffer = self._buffer
        if buffer is None:
            value = _zeros(self.numel, to_jax(self.dtype), self.device_index)
        elif type(buffer) is Pending:
            value = buffer.resolve()
        else:
            return buffer
        # kept only if no other thread has written the storage meanwhile (its op, queued while this one ran a
        # queue, gave it a newer buffer): a read never undoes a write
        if self._buffer is buffer:
            self._buffer = value
        return value

    @buffer.setter
    def buffer(self, value: jax.Array) -> None:
        self._buffer = value

    def resize(self, numel: int) -> None:
        """Grow or shrink in place, keeping the leading elements (UntypedStorage.resize_); growing an
        empty storage allocates lazily, as a new one does, and shrinking to 0 frees the buffer."""
        if numel == self.numel:
            return
        if numel > self.numel:
            check_fits((numel - self.numel) * self.dtype.itemsize, self.device_index)
        if numel == 0 or self.numel == 0:
            new = None
        else:
            old = self.buffer
            if numel < self.numel:
                new = old[:numel]
            else:
                new = jnp.concatenate([old, jnp.zeros((numel - self.numel,), old.dtype)])
            new = jax.device_put(new, jax_device(self.device_index))
        self.account.allocated -= self.nbytes
        if events.listening:
            events.free(self)
        self.numel = numel
        self.nbytes = numel * self.dtype.itemsize
        if numel:
            self.account.allocate(self.nbytes)
            if events.listening:
                events.alloc(self)
        self._buffer = new
        native.set_storage_nbytes(self, self.nbytes)


def live_storages() -> list:
    """Every Storage alive now."""
    return [s for s in (ref() for ref in list(_live.values())) if s is not None]


def at_address(pointer: int):
    """The live Storage whose bytes hold the neuron data pointer `pointer`, and the pointer's byte offset in it: for
    a tensor PyTorch made of a data pointer (at::from_blob, as the legacy serialization's storage writer does),
    whose native storage is none of ours."""
    for storage in live_storages():
        if storage.address is not None and storage.address <= pointer < storage.address + max(storage.nbytes, 1):
            return storage, pointer - storage.address
    raise RuntimeError(f"neuron: no storage holds the data pointer {pointer:#x}")


def of_handle(untyped) -> Storage:
    """The Storage of a neuron torch.UntypedStorage. One PyTorch allocated itself (`torch.UntypedStorage(n,
    device="neuron")`) gets one now: its bytes, zero."""
    storage = native.owner_of(untyped)
    if storage is None:
        storage = Storage(untyped.nbytes(), torch.uint8, untyped.device.index)
        native.adopt(untyped, storage)
    return storage


def resize_native(untyped, nbytes: int) -> None:
    """`UntypedStorage.resize_(nbytes)` on a neuron storage, called by the native hooks."""
    storage = of_handle(untyped)
    itemsize = storage.dtype.itemsize
    if nbytes % itemsize:
        raise RuntimeError(
            f"neuron: cannot resize a storage of {storage.dtype} elements to {nbytes} bytes, "
            f"not a multiple of the element size {itemsize}"
        )
    storage.resize(nbytes // itemsize)


def host_copy(buffer: jax.Array) -> np.ndarray:
    """The buffer's values in host memory, never aliasing the device buffer (it may be donated later)."""
    return np.array(buffer, copy=True)
