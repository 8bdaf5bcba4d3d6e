"""Which neuron device: the current device (per thread, in the native guard), indices, and waiting for one."""
import torch

from ..native import _C as native


def _runtime():
    from ..runtime import platform

    return platform


def device_count() -> int:
    return _runtime().device_count()


def current_device() -> int:
    """This thread's current neuron device (per thread, as CUDA's; the autograd engine's device
    threads each set their own)."""
    return native.current_device()


def _index(device=None) -> int:
    if device is None:
        return native.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "neuron":
        raise ValueError(f"Expected a neuron device, but got: {device}")
    return device.index if device.index is not None else native.current_device()


def set_device(device) -> None:
    index = _index(device)
    if index >= 0:
        native.set_device(index)


class device:
    """Context manager that changes the current neuron device."""

    def __init__(self, device):
        self.index = _index(device) if device is not None else -1
        self.previous = -1

    def __enter__(self):
        self.previous = native.exchange_device(self.index)

    def __exit__(self, *exc):
        if self.index >= 0:
            native.set_device(self.previous)
        return False


def device_of(tensor):
    return device(tensor.device.index if tensor.device.type == "neuron" else -1)


def _jax_device(index: int):
    return _runtime().jax_device(index)


def _adaptive():
    from ..eager import adaptive

    return adaptive


def _all_ready(index: int) -> bool:
    from ..runtime import sync

    _adaptive().flush()
    return sync.ready(index, _jax_device(index))


def synchronize(device=None) -> None:
    """Wait until every operation queued on the device has finished, and report failed device checks."""
    from ..runtime import pending_checks, sync

    index = _index(device)
    _adaptive().flush()
    sync.wait(index, _jax_device(index))
    pending_checks.raise_failures(index)
