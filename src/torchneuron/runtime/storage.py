"""Device storage: one flat PJRT buffer shared by every tensor that views it.

PyTorch tensors alias; JAX arrays are immutable. A Storage is the mutable
cell: tensors are (storage, sizes, strides, offset) exactly as in PyTorch, and
a write through any of them replaces the storage's buffer.
"""
import jax
import jax.numpy as jnp
import numpy as np

from .memory import accounts
from .dtypes import to_jax
from .platform import jax_device


class Pending:
    """A storage's next buffer, queued by adaptive eager and not computed yet: reading it runs the queue.

    It stands in for the flat buffer wherever one is only described (its `shape`), so output tensors of
    queued ops are built exactly as those of executed ones.
    """

    __slots__ = ("shape", "value", "array", "_run_queue", "__weakref__")

    def __init__(self, numel: int, value: int, run_queue):
        self.shape = (numel,)
        self.value = value  # its number among the queue's values
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


class Storage:
    __slots__ = ("_buffer", "device_index", "dtype", "numel", "nbytes", "account", "__weakref__")

    def __init__(self, numel: int, dtype, device_index: int, buffer=None):
        self.numel = numel
        self.dtype = dtype  # torch dtype of the elements
        self.device_index = device_index
        self.nbytes = nbytes = numel * dtype.itemsize
        self._buffer = buffer  # None: allocated but never written (reads as zeros); or Pending
        self.account = accounts[device_index]
        self.account.allocate(nbytes)

    def __del__(self):
        self.account.allocated -= self.nbytes

    def __deepcopy__(self, memo):
        # a new allocation, counted as one, with its own buffer: a shared one could be donated under it
        return Storage(self.numel, self.dtype, self.device_index, None if self._buffer is None else jnp.copy(self.buffer))

    @property
    def buffer(self) -> jax.Array:
        buffer = self._buffer
        if buffer is None:
            # committed to its device: programs reading only uncommitted arrays run on the default device
            buffer = self._buffer = jnp.zeros((self.numel,), to_jax(self.dtype), device=jax_device(self.device_index))
        elif type(buffer) is Pending:
            buffer = self._buffer = buffer.resolve()
        return buffer

    @buffer.setter
    def buffer(self, value: jax.Array) -> None:
        self._buffer = value

    def resize(self, numel: int) -> None:
        """Grow or shrink in place, keeping the leading elements (UntypedStorage.resize_)."""
        if numel == self.numel:
            return
        old = self.buffer
        if numel < self.numel:
            new = old[:numel]
        else:
            new = jnp.concatenate([old, jnp.zeros((numel - self.numel,), old.dtype)])
        self.account.allocated -= self.nbytes
        self.numel = numel
        self.nbytes = numel * self.dtype.itemsize
        self.account.allocate(self.nbytes)
        self._buffer = jax.device_put(new, jax_device(self.device_index))


def host_copy(buffer: jax.Array) -> np.ndarray:
    """The buffer's values in host memory, never aliasing the device buffer (it may be donated later)."""
    return np.array(buffer, copy=True)
