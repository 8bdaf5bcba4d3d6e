"""Host <-> device transfers."""
import jax
import numpy as np
import torch

from . import sync
from .dtypes import numpy_to_tensor, tensor_to_numpy
from .platform import jax_device


def host_to_device(tensor: torch.Tensor, device_index: int) -> jax.Array:
    """A CPU tensor's values (in row-major order) as a flat device buffer."""
    array = tensor_to_numpy(tensor.contiguous())
    device = jax_device(device_index)
    if device.platform == "cpu":
        # XLA:CPU adopts host memory without copying (even with may_alias=False): give it a private copy
        array = np.array(array, copy=True)
    buffer = jax.device_put(array.reshape(-1), device)
    sync.launched(device_index, buffer)
    return buffer


def device_to_host(array: jax.Array, dtype: torch.dtype) -> torch.Tensor:
    """A device array as a CPU tensor that owns its memory."""
    return numpy_to_tensor(np.asarray(array), dtype)


def device_to_device(array: jax.Array, device_index: int) -> jax.Array:
    moved = jax.device_put(array, jax_device(device_index))
    sync.launched(device_index, moved)
    return moved
