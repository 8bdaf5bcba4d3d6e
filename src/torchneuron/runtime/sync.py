"""Waiting for a device: the most recently launched work, plus every live buffer.

PJRT runs each device's programs asynchronously. A result nobody holds any
more is not among the live buffers, yet its program may still be running, so
the last array launched on each device is remembered (one reference, no
more) and waited on too.

An operation that waits for the device in order to read values on the host (`.item()`, `.cpu()`, a
data-dependent shape, a CPU fallback) calls `host_read`, which warns or raises as
`torch.neuron.set_sync_debug_mode` asks, as CUDA's synchronizing operations do; `torch.neuron.synchronize()`
itself does not.
"""
import os
import sys
import warnings

import jax

# the most recently launched array per device (eager dispatch writes it directly: it is on every op's path)
last = {}


def launched(device_index: int, array) -> None:
    last[device_index] = array


def _pending(device_index: int, device, this_device_only: bool) -> list:
    backend = device.client
    arrays = backend.live_arrays()
    if this_device_only and backend.local_device_count() > 1:
        arrays = [a for a in arrays if device in a.devices()]
    newest = last.get(device_index)
    if newest is not None and not newest.is_deleted():
        arrays.append(newest)
    return arrays


def wait(device_index: int, device) -> None:
    # waits for the other devices' arrays too: asking each array its devices cost more than the wait (a
    # synchronize of an optimizer step's 270 arrays took 0.5 ms), and an idle device's arrays are ready
    jax.block_until_ready(_pending(device_index, device, this_device_only=False))
    last.pop(device_index, None)


def ready(device_index: int, device) -> bool:
    return all(a.is_ready() for a in _pending(device_index, device, this_device_only=True))


# torch.neuron.set_sync_debug_mode: 0 quiet, 1 warn, 2 raise
debug_mode = 0
_MESSAGE = "called a synchronizing neuron operation"
_OWN_CODE = tuple(os.path.dirname(sys.modules[name].__file__) + os.sep for name in ("torch", "torchneuron"))


def host_read() -> None:
    """Checked by callers only when `debug_mode` is set: it is on every transfer's path."""
    if debug_mode == 2:
        raise RuntimeError(_MESSAGE)
    if debug_mode == 1:
        warnings.warn(_MESSAGE, stacklevel=_caller_level())


def _caller_level() -> int:
    """The stack level of the first frame outside PyTorch and torchneuron: the warning is the user's line's,
    shown once per line as PyTorch's C++ warnings are."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_OWN_CODE):
        frame, level = frame.f_back, level + 1
    return level
