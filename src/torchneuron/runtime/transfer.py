"""Host <-> device transfers."""
import functools

import jax
import numpy as np
import torch
from jax.sharding import SingleDeviceSharding

from . import events, sync
from .dtypes import numpy_to_tensor, tensor_to_numpy
from .platform import devices, jax_device

try:
    from jax._src.lib import xla_client

    _batched_device_put = xla_client.batched_device_put
except (ImportError, AttributeError):  # a JAX release without it: jax.device_put, slower
    _batched_device_put = None


def put(array: np.ndarray, device) -> jax.Array:
    """`jax.device_put(array, device)` of a host array, by the jaxlib call it ends in: 3 us, where device_put's
    Python takes 50-60 (an `x.to("neuron")`, a small op run on the host, a zero buffer for a storage never
    written)."""
    global _batched_device_put
    if _batched_device_put is not None:
        try:
            return _batched_device_put(_aval(array.shape, array.dtype), _sharding(device), [array], [device], True)
        except TypeError:  # its signature changed in this jaxlib: from now on the public call
            _batched_device_put = None
    return jax.device_put(array, device)


@functools.lru_cache(maxsize=None)
def _sharding(device) -> SingleDeviceSharding:
    return SingleDeviceSharding(device)


@functools.lru_cache(maxsize=1024)
def _aval(shape, dtype) -> jax.core.ShapedArray:
    """Made once per shape and dtype: 2 us of a 5 us put."""
    return jax.core.ShapedArray(shape, dtype)


def host_to_device(tensor: torch.Tensor, device_index: int) -> jax.Array:
    """A CPU tensor's values (in row-major order) as a flat device buffer."""
    if events.listening:
        nbytes = tensor.numel() * tensor.element_size()
        return events.transfer("h2d", nbytes, device_index, _host_to_device, tensor, device_index)
    return _host_to_device(tensor, device_index)


def _host_to_device(tensor: torch.Tensor, device_index: int) -> jax.Array:
    array = tensor_to_numpy(tensor.contiguous())
    device = jax_device(device_index)
    if device.platform == "cpu":
        # XLA:CPU adopts host memory without copying (even with may_alias=False): give it a private copy
        array = np.array(array, copy=True)
    buffer = put(array.reshape(-1), device)
    sync.launched(device_index, buffer)
    return buffer


def device_to_host(array: jax.Array, dtype: torch.dtype) -> torch.Tensor:
    """A device array as a CPU tensor that owns its memory."""
    if sync.debug_mode:
        sync.host_read()
    if events.listening:
        return events.transfer("d2h", array.nbytes, _device_index(array), _device_to_host, array, dtype)
    return _device_to_host(array, dtype)


def _device_to_host(array: jax.Array, dtype: torch.dtype) -> torch.Tensor:
    return numpy_to_tensor(np.asarray(array), dtype)


def device_to_device(array: jax.Array, device_index: int) -> jax.Array:
    if events.listening:
        return events.transfer("d2d", array.nbytes, device_index, _device_to_device, array, device_index)
    return _device_to_device(array, device_index)


def _device_to_device(array: jax.Array, device_index: int) -> jax.Array:
    moved = jax.device_put(array, jax_device(device_index))
    sync.launched(device_index, moved)
    return moved


def _device_index(array: jax.Array) -> int:
    return devices().index(next(iter(array.devices())))


# device copies of scalars by value: Python numbers (device_scalars) and 0-dim CPU tensors (host_scalar_to_device)
_scalars = {}
_MAX_SCALARS = 4096
# Python numbers given to one call of device_scalars and not yet to another (key -> True); popped, not
# tested then deleted, as the autograd engine's thread calls it too
_sighted_once = {}


def device_scalars(values: list, device_index: int) -> list:
    """Python numbers as a program's arguments, each a weakly typed 0-d value (weak typing keeps the
    number's promotion, a float32 tensor plus it stays float32, and the executable's signature).
    A number that an earlier call was given too is put on the device once and kept: given the number
    itself, a jitted call copies it on every call (3-7 us each on XLA:CPU). A number new to this call is
    given as itself: `jax.device_put` runs 30-50 us of Python, and ten times that while the device's
    programs occupy the host's cores, and numbers such as an optimizer's bias corrections are new each
    step and never come back. Put as host values, not made by `jnp.asarray`: that runs a device
    computation, which waits behind the programs queued before it."""
    arguments, new = [], []
    for value in values:
        key = scalar_key(type(value), value, device_index)  # the type: 1, 1.0 and True are equal otherwise
        array = _scalars.get(key)
        if array is None:
            if _sighted_once.pop(key, False):
                array = _remember(key, jax.device_put(value, jax_device(device_index)))
            else:
                array = value
                new.append(key)
        arguments.append(array)
    if new:
        if len(_sighted_once) >= _MAX_SCALARS:
            _sighted_once.clear()
        _sighted_once.update(dict.fromkeys(new, True))
    return arguments


def host_scalar_to_device(tensor: torch.Tensor, device_index: int) -> jax.Array:
    """A 0-dim CPU tensor's value as a flat device buffer, one per dtype and value: such a tensor is only
    ever an op's input (CPU scalars mix with device tensors as inputs, never as results), so the buffer is
    never written or donated, and an op given the same scalar again reads it without a transfer."""
    key = scalar_key(tensor.dtype, tensor.item(), device_index)
    array = _scalars.get(key)
    if array is None:
        array = _remember(key, host_to_device(tensor, device_index))
    return array


def scalar_key(kind, value, device_index) -> tuple:
    """Zeros and NaNs are keyed by their bits: equality cannot tell 0.0 from -0.0, and NaN equals nothing."""
    return kind, value if value and value == value else np.asarray(value).tobytes(), device_index


def _remember(key, array: jax.Array) -> jax.Array:
    if len(_scalars) >= _MAX_SCALARS:
        _scalars.clear()
    _scalars[key] = array
    return array
