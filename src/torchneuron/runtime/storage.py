"""Device storage: one flat PJRT buffer shared by every tensor that views it.

PyTorch tensors alias; JAX arrays are immutable. A Storage is the mutable
cell: tensors are (storage, sizes, strides, offset) exactly as in PyTorch, and
a write through any of them replaces the storage's buffer.
"""
import jax
import jax.numpy as jnp
import numpy as np

from . import memory
from .dtypes import to_jax
from .platform import jax_device


class Storage:
    __slots__ = ("_buffer", "device_index", "dtype", "numel", "nbytes", "__weakref__")

    def __init__(self, numel: int, dtype, device_index: int, buffer=None):
        self.numel = numel
        self.dtype = dtype  # torch dtype of the elements
        self.device_index = device_index
        self.nbytes = numel * dtype.itemsize
        self._buffer = buffer  # None: allocated but never written (reads as zeros)
        memory.on_alloc(device_index, self.nbytes)

    def __del__(self):
        memory.on_free(self.device_index, self.nbytes)

    @property
    def buffer(self) -> jax.Array:
        if self._buffer is None:
            with jax.default_device(jax_device(self.device_index)):
                self._buffer = jnp.zeros((self.numel,), to_jax(self.dtype))
        return self._buffer

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
        memory.on_free(self.device_index, self.nbytes)
        self.numel = numel
        self.nbytes = numel * self.dtype.itemsize
        memory.on_alloc(self.device_index, self.nbytes)
        self._buffer = jax.device_put(new, jax_device(self.device_index))


def host_copy(buffer: jax.Array) -> np.ndarray:
    """The buffer's values in host memory, never aliasing the device buffer (it may be donated later)."""
    return np.array(buffer, copy=True)
