"""Shape ops: views as functional ops (for traced graphs), concatenation, padding, flips.

Eager views never come here (they alias through the dispatcher's view
handler); these lowerings serve decompositions and compiled graphs.
"""
import math

import jax.numpy as jnp
import torch
from jax import lax
from torch._prims_common import is_non_overlapping_and_dense_or_false

from ..runtime import layout
from ..runtime.dtypes import to_torch
from .promotion import dtypes
from .registry import META, checked_meta, lower

aten = torch.ops.aten


def _dim(x, dim):
    return dim % max(x.ndim, 1)


@lower(aten.view, aten._unsafe_view, aten.reshape, aten.view_copy, aten._reshape_alias, aten._reshape_alias_copy)
def view(x, size, *rest):
    return x.reshape(_infer(x, size))


@lower(aten.view.dtype)
def view_dtype(x, dtype):
    """`x.view(dtype)` in a traced graph: x's bytes as `dtype`, its last dimension scaled by the ratio of the
    element sizes (PyTorch's meta kernel has checked that it divides)."""
    values = layout.as_view_dtype(x.reshape(-1), to_torch(x.dtype), dtype)
    if x.ndim == 0:
        return values.reshape(())
    return values.reshape(x.shape[:-1] + (x.shape[-1] * x.dtype.itemsize // dtype.itemsize,))


def _infer(x, size):
    size = list(size)
    if -1 in size:
        known = math.prod(s for s in size if s != -1)
        size[size.index(-1)] = x.size // known if known else 0
    return tuple(size)


@lower(aten.permute, aten.permute_copy)
def permute(x, dims):
    return jnp.transpose(x, [_dim(x, d) for d in dims])


@lower(aten.transpose.int, aten.transpose_copy.int)
def transpose(x, dim0, dim1):
    if x.ndim < 2:
        return x
    return jnp.swapaxes(x, _dim(x, dim0), _dim(x, dim1))


@lower(aten.t, aten.t_copy, aten.numpy_T)
def t(x):
    return x.T


@lower(aten.expand, aten.expand_copy)
def expand(x, size, *, implicit=False):
    size = list(size)
    lead = len(size) - x.ndim
    shape = [x.shape[i - lead] if s == -1 else s for i, s in enumerate(size)]
    return jnp.broadcast_to(x, shape)


@lower(aten.unsqueeze, aten.unsqueeze_copy)
def unsqueeze(x, dim):
    return jnp.expand_dims(x, dim % (x.ndim + 1))


@lower(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze_copy.default,
       aten.squeeze_copy.dim, aten.squeeze_copy.dims)
def squeeze(x, dim=None):
    if x.ndim == 0:
        return x
    dims = range(x.ndim) if dim is None else (dim if isinstance(dim, (list, tuple)) else [dim])
    return jnp.squeeze(x, tuple(_dim(x, d) for d in dims if x.shape[_dim(x, d)] == 1))


@lower(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(x, dim=0, start=None, end=None, step=1):
    dim = _dim(x, dim)
    start, stop, step = slice(start, end, step).indices(x.shape[dim])
    stop = max(stop, start)
    return lax.slice_in_dim(x, start, stop, step, axis=dim)


@lower(aten.select.int, aten.select_copy.int)
def select(x, dim, index):
    dim = _dim(x, dim)
    return lax.index_in_dim(x, index % x.shape[dim], axis=dim, keepdims=False)


@lower(aten.alias, aten.alias_copy, aten.detach, aten.detach_copy, aten.lift_fresh)
def alias(x):
    return x


@lower(aten.as_strided, aten.as_strided_copy)
def as_strided(x, size, stride, storage_offset=None):
    return layout.read(x.reshape(-1), tuple(size), tuple(stride), storage_offset or 0)


@lower(aten.diagonal, aten.diagonal_copy)
def diagonal(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, _dim(x, dim1), _dim(x, dim2))


@lower(aten.unfold, aten.unfold_copy)
def unfold(x, dimension, size, step):
    if x.ndim == 0:
        return x.reshape(1)
    dim = _dim(x, dimension)
    count = (x.shape[dim] - size) // step + 1
    index = jnp.arange(count)[:, None] * step + jnp.arange(size)[None, :]
    return jnp.moveaxis(jnp.take(x, index, axis=dim), dim + 1, -1)


@lower(aten.split.Tensor, aten.split_copy.Tensor)
def split(x, split_size, dim=0):
    dim = _dim(x, dim)
    n = x.shape[dim]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] if split_size else [n]
    return split_with_sizes(x, sizes, dim)


@lower(aten.split_with_sizes, aten.split_with_sizes_copy)
def split_with_sizes(x, split_sizes, dim=0):
    dim = _dim(x, dim)
    offsets = [0]
    for s in split_sizes:
        offsets.append(offsets[-1] + s)
    return [lax.slice_in_dim(x, a, b, axis=dim) for a, b in zip(offsets[:-1], offsets[1:])]


@lower(aten.unbind.int, aten.unbind_copy.int)
def unbind(x, dim=0):
    dim = _dim(x, dim)
    return [lax.index_in_dim(x, i, axis=dim, keepdims=False) for i in range(x.shape[dim])]


def _check_cat_ranks(tensors, dim=0):
    for i, t in enumerate(tensors):
        if t.ndim == 0:
            raise RuntimeError(f"zero-dimensional tensor (at position {i}) cannot be concatenated")


def overlap(a, b):
    """PyTorch's get_overlap_status of two views: "full" (the same elements in the same order), "partial", or
    None (none, or too hard to tell: a view that is not dense, which PyTorch lets pass)."""
    if a is b:
        return "full"
    if not a.numel() or not b.numel() or a.untyped_storage()._cdata != b.untyped_storage()._cdata:
        return None
    if not all(map(is_non_overlapping_and_dense_or_false, (a, b))):
        return None
    (a_begin, a_end), (b_begin, b_end) = [(t.storage_offset(), t.storage_offset() + t.numel()) for t in (a, b)]
    if (a_begin, a_end) == (b_begin, b_end):
        return "full" if a.stride() == b.stride() else "partial"
    return "partial" if a_begin < b_end and b_begin < a_end else None


OVERLAPPING_WRITE = ("unsupported operation: more than one element of the written-to tensor refers to a single "
                     "memory location. Please clone() the tensor before performing the operation.")
SHARED_MEMORY = ("unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
                 "single memory location. Please clone() the tensor before performing the operation.")


def _check_cat_out(tensors, dim=0, *, out):
    _check_cat_ranks(tensors, dim)
    if any(overlap(out, t) for t in tensors):
        raise RuntimeError(SHARED_MEMORY)


META[aten.cat.out] = checked_meta(_check_cat_out, aten.cat.out)


@lower(aten.cat, meta=checked_meta(_check_cat_ranks, aten.cat.default))
def cat(tensors, dim=0):
    _, result = dtypes(*tensors)
    tensors = [t.astype(result) for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not tensors:
        return jnp.zeros((0,), result)
    return jnp.concatenate(tensors, axis=dim % tensors[0].ndim)


@lower(aten.stack)
def stack(tensors, dim=0):
    _, result = dtypes(*tensors)
    return jnp.stack([t.astype(result) for t in tensors], axis=dim % (tensors[0].ndim + 1))


@lower(aten.constant_pad_nd)
def constant_pad_nd(x, pad, value=0):
    widths = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value, x.dtype), widths)


@lower(aten.flip)
def flip(x, dims):
    return jnp.flip(x, [_dim(x, d) for d in dims]) if x.ndim else x


@lower(aten.roll)
def roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts).reshape(x.shape)
    return jnp.roll(x, shifts, [_dim(x, d) for d in dims])


@lower(aten.repeat)
def repeat(x, repeats):
    x = x.reshape((1,) * (len(repeats) - x.ndim) + x.shape)
    return jnp.tile(x, repeats)


@lower(aten.tril)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lower(aten.triu)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@lower(aten.slice_scatter)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    dim = _dim(x, dim)
    start, stop, step = slice(start, end, step).indices(x.shape[dim])
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, stop, step)
    return x.at[tuple(index)].set(src.astype(x.dtype))


@lower(aten.select_scatter)
def select_scatter(x, src, dim, index):
    dim = _dim(x, dim)
    position = [slice(None)] * x.ndim
    position[dim] = index % x.shape[dim]
    return x.at[tuple(position)].set(src.astype(x.dtype))


@lower(aten.diagonal_scatter)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    d1, d2 = _dim(x, dim1), _dim(x, dim2)
    n = jnp.diagonal(x, offset, d1, d2).shape[-1]
    rows = jnp.arange(n) + max(-offset, 0)
    cols = jnp.arange(n) + max(offset, 0)
    moved = jnp.moveaxis(x, (d1, d2), (-2, -1))
    moved = moved.at[..., rows, cols].set(src.astype(x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


def check_in_storage(size, stride, offset: int, itemsize: int, storage_nbytes: int) -> None:
    """PyTorch's error for a view that reaches beyond its storage's bytes."""
    needed = layout.storage_extent(size, stride, offset) * itemsize
    if needed > storage_nbytes:
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, and itemsize "
            f"{itemsize} requiring a storage size of {needed} are out of bounds for storage of size {storage_nbytes}"
        )


def _check_strided_bounds(x, src, size, stride, storage_offset=None):
    """The view as_strided_scatter writes through must lie inside (a contiguous copy of) self."""
    check_in_storage(size, stride, storage_offset or 0, x.element_size(), x.numel() * x.element_size())


@lower(aten.as_strided_scatter, meta=checked_meta(_check_strided_bounds, aten.as_strided_scatter.default))
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    flat = layout.write(x.reshape(-1), src.astype(x.dtype), tuple(size), tuple(stride), storage_offset or 0)
    return flat.reshape(x.shape)


@lower(aten.sym_size.int)
def sym_size(x, dim):
    return x.shape[dim]


@lower(aten.sym_numel)
def sym_numel(x):
    return math.prod(x.shape)


def _check_narrow_dim(x, dim, start, length):
    # the CPU kernel asserts (RuntimeError) where the meta kernel wraps the dimension (IndexError)
    if x.ndim and dim >= x.ndim:
        raise RuntimeError("Expected dim < static_cast<int64_t>(self_sizes.size()) to be true, but got false.")


META[aten.narrow_copy.default] = checked_meta(_check_narrow_dim, aten.narrow_copy.default)
