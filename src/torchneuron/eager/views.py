"""View ops: a new tensor over the same storage, metadata computed by PyTorch's meta kernels."""
import torch

from ..ops.shape import check_in_storage
from ..runtime.cache import ExecutableCache
from ..runtime.dtypes import check_supported
from ..runtime.layout import storage_extent
from ..runtime.tensor import NeuronTensor, view_of
from . import math_bits
from .arguments import fill, template

# view metadata depends only on the input's metadata and the static arguments
_view_cache = ExecutableCache(16384)


def meta_view(spec, storage, bases=None) -> torch.Tensor:
    """A meta tensor with the view metadata of `spec` over a meta stand-in for `storage`.

    Views sharing a storage share a meta base in `bases`, so overlap checks see the aliasing.
    """
    shape, stride, offset, dtype = spec[:4]
    base = None if bases is None else bases.get((id(storage), dtype))
    if base is None:
        base = torch.empty(storage.nbytes // dtype.itemsize, dtype=dtype, device="meta")
        if bases is not None:
            bases[(id(storage), dtype)] = base
    return base.as_strided(shape, stride, offset)


def meta_like(t: NeuronTensor) -> torch.Tensor:
    """A meta tensor with `t`'s view: what PyTorch's meta kernels need to know of it."""
    return meta_view(t._spec, t._storage)


def _check_in_storage(spec, storage) -> None:
    """Meta storages are not bounds-checked: as_strided beyond the storage raises the CPU's error here."""
    shape, stride, offset, dtype = spec[:4]
    check_in_storage(shape, stride, offset, dtype.itemsize, storage.nbytes)


def _spec_of(out: torch.Tensor, device_index: int) -> tuple:
    """The `_spec` of a view with `out`'s metadata, of a storage on device `device_index`."""
    return (tuple(out.shape), tuple(out.stride()), out.storage_offset(), out.dtype, device_index)


def view(func, args, kwargs):
    tensors, scalars = [], []
    targs = template(args, tensors, scalars, False)
    tkwargs = tuple((k, template(v, tensors, scalars, False)) for k, v in kwargs.items()) if kwargs else ()
    source = tensors[0]
    key = (func, targs, tkwargs, source._spec, source._storage.numel)
    specs = _view_cache.get(key)
    if specs is None:
        metas = [meta_like(t) if isinstance(t, NeuronTensor) else t for t in tensors]
        out = func(*fill(targs, metas, scalars), **{k: fill(v, metas, scalars) for k, v in tkwargs})
        device_index = source._spec[4]
        specs = ([_spec_of(o, device_index) for o in out] if isinstance(out, (list, tuple))
                 else _spec_of(out, device_index))
        for spec in specs if isinstance(specs, list) else [specs]:
            check_supported(spec[3])  # view(dtype) reinterprets the storage's bytes
            _check_in_storage(spec, source._storage)
        _view_cache.put(key, specs)
    return _views_of(func, source, specs)


# ops whose result is their input's own view, a new tensor over the same storage
ALIAS_OPS = (torch.ops.aten.detach.default, torch.ops.aten.alias.default)


def alias(func, args, kwargs):
    """detach and alias: the source's own view, with no meta kernel to ask (autograd detaches each gradient
    it accumulates)."""
    source = args[0]
    return _views_of(func, source, source._spec)


def _views_of(func, source, specs):
    if torch.is_inference_mode_enabled() and not source.is_inference():
        # a view of a normal tensor is a normal tensor: autograd gives it its base's version counter, which
        # an inference tensor (made in inference mode) cannot take
        with torch.inference_mode(False):
            out = _wrap_views(source._storage, specs)
    else:
        out = _wrap_views(source._storage, specs)
    math_bits.copy_bits(func, source, out)
    return out


def _wrap_views(storage, specs):
    if isinstance(specs, list):
        return [view_of(storage, spec) for spec in specs]
    return view_of(storage, specs)


_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


def reset_view(tensor: NeuronTensor, storage, spec) -> None:
    """Point `tensor` at (storage, spec) in place, as resize_/set_/out= resizing do on the CPU.

    The TensorImpl itself must change (C++ callers hold it, not the Python object), so PyTorch's
    device-independent meta kernel of `set_` updates it, onto the storage's shared native handle.
    """
    shape, stride, offset, dtype = spec[:4]
    torch.ops.aten.set_.source_Storage_storage_offset.redispatch(_META, tensor, storage.handle, offset, shape, stride)
    tensor._storage = storage
    tensor._spec = (tuple(shape), tuple(stride), offset, dtype, storage.device_index)


def resize_in_storage(tensor: NeuronTensor, spec) -> None:
    """Point `tensor` at `spec` over its own storage, grown if the view needs more bytes, as PyTorch's resize_
    keeps a tensor's storage (its other views see what is written there)."""
    shape, stride, offset, dtype = spec[:4]
    storage = tensor._storage
    needed = storage_extent(shape, stride, offset) * dtype.itemsize
    if needed > storage.nbytes:
        storage.resize(-(-needed // storage.dtype.itemsize))
    reset_view(tensor, storage, spec)


def inplace_view(func, args, kwargs):
    tensor = args[0]
    if func is torch.ops.aten.detach_.default:
        return tensor
    meta = meta_like(tensor)
    func(meta, *args[1:], **kwargs)
    spec = _spec_of(meta, tensor._spec[4])
    _check_in_storage(spec, tensor._storage)
    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Python)):
        torch.ops.aten.as_strided_.default(tensor, spec[0], spec[1], spec[2])
    tensor._spec = spec
    return tensor
