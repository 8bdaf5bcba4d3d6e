"""Registering `neuron` with PyTorch: PrivateUse1 renamed, device module, native hooks and guard, factories."""
import functools
import sys

import torch

from ..native import _C as native
from ..runtime import storage
from ..runtime.layout import contiguous_strides
from ..runtime.tensor import NeuronTensor, new_storage_for, wrap
from . import module

_registered = []


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    size = tuple(size)
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        strides = torch.empty(size, device="meta", memory_format=memory_format).stride()
    else:
        strides = contiguous_strides(size)
    return _empty_strided(size, strides, dtype, layout, device, pin_memory)


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    if layout not in (None, torch.strided):
        raise NotImplementedError(f"torchneuron: layout {layout} is not supported on neuron")
    dtype = dtype or torch.get_default_dtype()
    index = device.index if device is not None and device.index is not None else module.current_device()
    native.check_device(index)
    size, stride = tuple(size), tuple(stride)
    for s in size:
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {list(size)}")
    return wrap(new_storage_for(size, stride, dtype, index), size, stride, 0, dtype)


def _efficient_zero_tensor(size, dtype=None, layout=None, device=None, pin_memory=None):
    """Autograd formulas return these for gradients known to be zero (sgn of a real input); plain zeros
    are what any consumer of a ZeroTensor reads."""
    return torch.zeros(size, dtype=dtype, layout=layout, device=device)


# ops PyTorch calls on the device's own kernel, below the Python key: factories with neither a tensor argument
# nor a device-generic kernel, and reading a 0-d tensor's value, which torch.tensor([t0, t1]) and
# torch.as_tensor of a list of 0-d tensors do for each element
_DEVICE_KERNELS = ("tril_indices", "triu_indices", "_local_scalar_dense",
                   # called with Python dispatch off (FSDP's _no_dispatch_record_stream)
                   "record_stream")
# composite ops whose decomposition skips, for devices other than the CPU, checks the CPU makes
_UNCHECKED_COMPOSITES = ("one_hot", "max_pool1d")


def _dispatched(op):
    def kernel(*args, **kwargs):
        from ..eager.dispatch import dispatch

        return dispatch(op, args, kwargs)

    return kernel


def _sparse_factory(name):
    def kernel(*args, **kwargs):
        from ..eager import sparse

        return sparse.FACTORIES[name](*args, **kwargs)

    return kernel


# ops with a kernel for every device (CompositeExplicitAutograd) that PyTorch's CPU kernels for compressed layouts
# override: a compressed neuron tensor would run the generic one (torch 2.13's list; tests/test_sparse_compressed.py
# checks it against the running torch)
COMPRESSED_OVERRIDES = (
    "_conj_physical", "_pin_memory", "abs", "abs_", "ccol_indices", "clone", "col_indices", "conj_physical_",
    "copy_", "crow_indices", "deg2rad", "deg2rad.out", "deg2rad_", "dense_dim", "empty_like", "is_pinned",
    "isinf", "mul.Scalar", "mul_.Scalar", "rad2deg", "rad2deg.out", "rad2deg_", "row_indices", "select.int",
    "sparse_dim", "sum", "values")


def _compressed(op, *args, **kwargs):
    """The kernel of every op for neuron's compressed layouts, which only a compressed neuron tensor PyTorch made
    below the Python key reaches (a CPU kernel given device="neuron"): it is seen as eager/sparse_compressed.py's
    and `op` runs again."""
    from ..eager import sparse_compressed

    return sparse_compressed.adopted(op, args, kwargs)


def _compressed_empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """`torch.empty(..., layout=torch.sparse_csr, device="neuron")`: the CPU's (its checks; no entries), moved."""
    return torch.empty(size, dtype=dtype, layout=layout, memory_format=memory_format).to(device)


def _copy_from(source, destination, non_blocking=False):
    """`copy_` as PyTorch internals issue it below the Python key: torch.tensor(data, device=...), and the legacy
    serialization's storage writer and reader (pickling a storage), with tensors made of the storage's data
    pointer."""
    from ..eager.dispatch import dispatch

    return dispatch(torch.ops.aten.copy_.default, (_as_neuron_tensor(destination), _as_neuron_tensor(source)), {})


def _as_neuron_tensor(tensor):
    """A neuron tensor PyTorch made below the Python key of a neuron data pointer, as the NeuronTensor viewing the
    same bytes of the Storage there."""
    if isinstance(tensor, NeuronTensor) or tensor.device.type != "neuron":
        return tensor
    found, start = storage.at_address(tensor.untyped_storage().data_ptr())
    offset = start // tensor.element_size() + tensor.storage_offset()
    return wrap(found, tensor.shape, tensor.stride(), offset, tensor.dtype)


def register() -> None:
    """Make `neuron` a PyTorch device. Safe to call more than once."""
    if _registered:
        return
    from ..runtime import dtypes, platform

    # what _setup_privateuseone_for_python_backend does, with the native guard and hooks in place of
    # torch._C._acc's Python ones (docs/native.md says why)
    torch.utils.rename_privateuse1_backend("neuron")
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    torch._register_device_module("neuron", module)
    native.install(platform.device_count, module.synchronize, module._all_ready, storage.resize_native,
                   module.NeuronGraph, dtypes.SUPPORTED)
    sys.modules["torch.neuron"] = module
    library = torch.library.Library("aten", "IMPL")
    library.impl("empty.memory_format", _empty, "PrivateUse1")
    library.impl("empty_strided", _empty_strided, "PrivateUse1")
    library.impl("_copy_from", _copy_from, "PrivateUse1")
    library.impl("_efficientzerotensor", _efficient_zero_tensor, "PrivateUse1")
    for name in _DEVICE_KERNELS:
        library.impl(name, _dispatched(getattr(torch.ops.aten, name).default), "PrivateUse1")
    for name in ("empty.memory_format", "_sparse_coo_tensor_with_dims"):
        library.impl(name, _sparse_factory(name), "SparsePrivateUse1")
    library.impl("empty.memory_format", _compressed_empty, "SparseCsrPrivateUse1")
    for name in COMPRESSED_OVERRIDES:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        library.impl(name, functools.partial(_compressed, op), "SparseCsrPrivateUse1")
    fallbacks = torch.library.Library("_", "IMPL")
    fallbacks.fallback(_compressed, "SparseCsrPrivateUse1")
    _registered.append(fallbacks)
    for name in _UNCHECKED_COMPOSITES:
        library.impl(name, _dispatched(getattr(torch.ops.aten, name).default), "AutogradPrivateUse1")
    _registered.append(library)
    from .. import patches
    from . import autocast

    autocast.register()
    patches.apply()
