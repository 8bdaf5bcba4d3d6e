"""Waiting for a device: the most recently launched work, plus every live buffer.

PJRT runs each device's programs asynchronously. A result nobody holds any
more is not among the live buffers, yet its program may still be running, so
the last array launched on each device is remembered (one reference, no
more) and waited on too.
"""
import jax

# the most recently launched array per device (eager dispatch writes it directly: it is on every op's path)
last = {}


def launched(device_index: int, array) -> None:
    last[device_index] = array


def _pending(device_index: int, device) -> list:
    arrays = [a for a in jax.live_arrays() if device in a.devices()]
    newest = last.get(device_index)
    if newest is not None and not newest.is_deleted():
        arrays.append(newest)
    return arrays


def wait(device_index: int, device) -> None:
    jax.block_until_ready(_pending(device_index, device))
    last.pop(device_index, None)


def ready(device_index: int, device) -> bool:
    return all(a.is_ready() for a in _pending(device_index, device))
