"""Waiting for a device: the most recently launched work, plus every live buffer.

PJRT runs each device's programs asynchronously. A result nobody holds any
more is not among the live buffers, yet its program may still be running, so
the last array launched on each device is remembered (one reference, no
more) and waited on too.
"""
import jax

_last = {}


def launched(device_index: int, array) -> None:
    _last[device_index] = array


def _pending(device_index: int, device) -> list:
    arrays = [a for a in jax.live_arrays() if device in a.devices()]
    last = _last.get(device_index)
    if last is not None and not last.is_deleted():
        arrays.append(last)
    return arrays


def wait(device_index: int, device) -> None:
    jax.block_until_ready(_pending(device_index, device))
    _last.pop(device_index, None)


def ready(device_index: int, device) -> bool:
    return all(a.is_ready() for a in _pending(device_index, device))
