"""Registering `neuron` with PyTorch: PrivateUse1 renamed, device module, hooks, guard, factories."""
import sys

import torch

_registered = []


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        from . import module

        return module.is_available()

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    from ..runtime.layout import contiguous_strides

    size = tuple(size)
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        strides = torch.empty(size, device="meta", memory_format=memory_format).stride()
    else:
        strides = contiguous_strides(size)
    return _empty_strided(size, strides, dtype, layout, device, pin_memory)


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    from ..runtime.tensor import new_storage_for, wrap
    from . import module

    if layout not in (None, torch.strided):
        raise NotImplementedError(f"torchneuron: layout {layout} is not supported on neuron")
    dtype = dtype or torch.get_default_dtype()
    index = device.index if device is not None and device.index is not None else module.current_device()
    size, stride = tuple(size), tuple(stride)
    for s in size:
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {list(size)}")
    return wrap(new_storage_for(size, stride, dtype, index), size, stride, 0, dtype)


def _efficient_zero_tensor(size, dtype=None, layout=None, device=None, pin_memory=None):
    """Autograd formulas return these for gradients known to be zero (sgn of a real input); plain zeros
    are what any consumer of a ZeroTensor reads."""
    return torch.zeros(size, dtype=dtype, layout=layout, device=device)


# factories with neither a tensor argument nor a device-generic kernel: PyTorch calls the device's own kernel
_TENSORLESS_FACTORIES = ("tril_indices", "triu_indices")


def _dispatched(op):
    def kernel(*args, **kwargs):
        from ..eager.dispatch import dispatch

        return dispatch(op, args, kwargs)

    return kernel


def _copy_from(source, destination, non_blocking=False):
    """`copy_` as PyTorch internals issue it below the Python key (torch.tensor(data, device=...))."""
    from ..eager.dispatch import dispatch

    return dispatch(torch.ops.aten.copy_.default, (destination, source), {})


def register() -> None:
    """Make `neuron` a PyTorch device. Safe to call more than once."""
    if _registered:
        return
    from . import module

    torch.utils.backend_registration._setup_privateuseone_for_python_backend(
        rename="neuron", backend_module=module, hook=_Hooks(), device_guard=_Guard()
    )
    sys.modules["torch.neuron"] = module
    library = torch.library.Library("aten", "IMPL")
    library.impl("empty.memory_format", _empty, "PrivateUse1")
    library.impl("empty_strided", _empty_strided, "PrivateUse1")
    library.impl("_copy_from", _copy_from, "PrivateUse1")
    library.impl("_efficientzerotensor", _efficient_zero_tensor, "PrivateUse1")
    for name in _TENSORLESS_FACTORIES:
        library.impl(name, _dispatched(getattr(torch.ops.aten, name).default), "PrivateUse1")
    _registered.append(library)
    from .. import patches
    from . import autocast

    autocast.register()
    patches.apply()
