"""Reading and writing a strided view of a flat storage buffer, inside traced JAX code.

A view is (shape, stride, offset) over a 1-D buffer, exactly as in PyTorch.
Most views (contiguous blocks, transposes, slices with steps, diagonals,
expands) are a slice of the buffer reshaped into blocks, so they lower to
slice/reshape/transpose/broadcast, which XLA fuses into the consuming op. Only
overlapping views (`unfold` windows, odd `as_strided`) take a gather.
All arguments other than the buffer and value are static Python ints.
"""
import math

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .dtypes import convert_to, to_jax


def contiguous_strides(shape) -> tuple:
    strides, running = [], 1
    for size in reversed(shape):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))


def is_contiguous(shape, stride) -> bool:
    expected = 1
    for size, st in zip(reversed(shape), reversed(stride)):
        if size == 1:
            continue
        if st != expected:
            return False
        expected *= size
    return True


def storage_extent(shape, stride, offset: int = 0) -> int:
    """The elements a storage needs to hold this view (PyTorch's computeStorageNbytes, in elements)."""
    if not all(shape):
        return 0
    return offset + 1 + sum((size - 1) * step for size, step in zip(shape, stride))


def covers_storage(shape, stride, offset, storage_numel) -> bool:
    """True when the view is the whole storage in row-major order (reads are a reshape)."""
    return offset == 0 and math.prod(shape) == storage_numel and is_contiguous(shape, stride)


def _block_plan(shape, stride):
    """How to address a view as a block of the buffer, or None when it overlaps itself.

    Returns (order, sorted_sizes, sorted_strides, broadcast_dims).
    """
    dims = [d for d in range(len(shape)) if shape[d] != 1 and stride[d] != 0]
    broadcast_dims = tuple(d for d in range(len(shape)) if shape[d] != 1 and stride[d] == 0)
    order = sorted(dims, key=lambda d: -stride[d])
    sizes = [shape[d] for d in order]
    strides = [stride[d] for d in order]
    for k in range(len(order) - 1):
        if strides[k] % strides[k + 1] or strides[k] < sizes[k + 1] * strides[k + 1]:
            return None
    if strides and strides[-1] < 0:
        return None
    return order, sizes, strides, broadcast_dims


def _region(buffer, offset, sizes, strides):
    """The buffer region the block spans, reshaped so the view is a leading-corner slice of it."""
    length = sizes[0] * strides[0]
    available = buffer.shape[0] - offset
    region = lax.slice(buffer, (offset,), (offset + min(length, available),))
    if length > available:
        region = jnp.pad(region, (0, length - available))
    block_shape = [sizes[0]] + [strides[k - 1] // strides[k] for k in range(1, len(sizes))] + [strides[-1]]
    return region.reshape(block_shape)


def _corner(sizes):
    return tuple(slice(0, s) for s in sizes) + (0,)


def _gather_indices(shape, stride, offset):
    index = jnp.full(shape, offset, dtype=jnp.int64)
    for d, (size, st) in enumerate(zip(shape, stride)):
        if size != 1 and st != 0:
            index = index + lax.broadcasted_iota(jnp.int64, shape, d) * st
    return index


def read(buffer, shape, stride, offset):
    """The view's values as an array of `shape`."""
    shape = tuple(shape)
    if covers_storage(shape, stride, offset, buffer.shape[0]):
        return buffer.reshape(shape)
    if math.prod(shape) == 0:
        return jnp.zeros(shape, buffer.dtype)
    plan = _block_plan(shape, stride)
    if plan is None:
        return buffer[_gather_indices(shape, stride, offset)]
    order, sizes, strides, broadcast_dims = plan
    if not order:
        values = buffer[offset]
    else:
        values = _region(buffer, offset, sizes, strides)[_corner(sizes)]
        values = jnp.transpose(values, np.argsort(order))
    kept_shape = tuple(1 if d in broadcast_dims else s for d, s in enumerate(shape))
    return jnp.broadcast_to(values.reshape(kept_shape), shape)


def write(buffer, value, shape, stride, offset):
    """The buffer after writing `value` (already of `shape` and the buffer's dtype) through the view."""
    shape = tuple(shape)
    value = jnp.broadcast_to(value, shape)
    if covers_storage(shape, stride, offset, buffer.shape[0]):
        return value.reshape(-1)
    if math.prod(shape) == 0:
        return buffer
    plan = _block_plan(shape, stride)
    if plan is None or plan[3]:
        # elements of the view share memory (unfold's windows): only those the op changed are written, so that
        # an op writing some of them (index_put_, masked_fill_) is not undone by another element of the same
        # memory still holding the old value, as the CPU and CUDA write only what they compute
        index = _gather_indices(shape, stride, offset)
        kept = ~_differs(value, buffer[index])
        return buffer.at[jnp.where(kept, buffer.shape[0], index)].set(value, mode="drop")
    order, sizes, strides, _ = plan
    if not order:
        return buffer.at[offset].set(value.reshape(()))
    squeezed = value.reshape([shape[d] for d in sorted(order)])
    ordered = jnp.transpose(squeezed, [sorted(order).index(d) for d in order])
    region = _region(buffer, offset, sizes, strides)
    region = region.at[_corner(sizes)].set(ordered).reshape(-1)
    region = region[: min(region.shape[0], buffer.shape[0] - offset)]
    return lax.dynamic_update_slice(buffer, region, (offset,))


def _differs(a, b):
    """Where a and b differ in their bits (a NaN equals itself, -0.0 differs from 0.0)."""
    if jnp.issubdtype(a.dtype, jnp.complexfloating):
        return _differs(a.real, b.real) | _differs(a.imag, b.imag)
    if jnp.issubdtype(a.dtype, jnp.floating):
        bits = jnp.dtype(f"uint{8 * a.dtype.itemsize}")
        return lax.bitcast_convert_type(a, bits) != lax.bitcast_convert_type(b, bits)
    return a != b


def lay_out(value, shape, stride, offset: int = 0):
    """A new storage buffer holding `value` (an array of `shape`) laid out as the view (shape, stride, offset)
    says: what an executable returns for each tensor it makes."""
    if offset == 0 and is_contiguous(shape, stride):
        return value.reshape(-1)
    return write(jnp.zeros((storage_extent(shape, stride, offset),), value.dtype), value, shape, stride, offset)


def read_view(buffer, spec, storage_dtype, offset=None):
    """The values of the tensor described by spec (shape, stride, offset, dtype, device) over `buffer`
    (of storage_dtype); `offset`, when given, is a traced element offset that replaces the spec's."""
    shape, stride, static_offset, dtype, _ = spec
    flat = as_view_dtype(buffer, storage_dtype, dtype)
    if offset is None:
        return read(flat, shape, stride, static_offset)
    return read(_window(flat, offset, shape, stride), shape, stride, 0)


def write_view(buffer, value, spec, storage_dtype, offset=None):
    """`buffer` (of storage_dtype) after writing `value` through the tensor described by spec (`offset`
    as in read_view)."""
    shape, stride, static_offset, dtype, _ = spec
    flat, value = as_view_dtype(buffer, storage_dtype, dtype), convert_to(value, dtype)
    if offset is None:
        written = write(flat, value, shape, stride, static_offset)
    else:
        window = write(_window(flat, offset, shape, stride), value, shape, stride, 0)
        written = lax.dynamic_update_slice(flat, window, (offset,))
    return as_view_dtype(written, dtype, storage_dtype)


def _window(flat, offset, shape, stride):
    """The elements a view starting at the traced `offset` spans."""
    return lax.dynamic_slice(flat, (offset,), (storage_extent(shape, stride),))


def as_view_dtype(flat, from_dtype, to_dtype):
    """A flat buffer of the torch dtype `from_dtype` as one of `to_dtype` over the same bytes; complex32,
    carried as complex64, is float16 pairs in memory."""
    if from_dtype == to_dtype:
        return flat
    if from_dtype == torch.complex32:
        flat = jnp.stack([flat.real, flat.imag], axis=-1).reshape(-1).astype(jnp.float16)
    if to_dtype == torch.complex32:
        pairs = _reinterpret(flat, jnp.float16).reshape(-1, 2).astype(jnp.float32)
        return lax.complex(pairs[:, 0], pairs[:, 1])
    return _reinterpret(flat, to_jax(to_dtype))


def _reinterpret(flat, dtype):
    """A flat storage buffer's bytes as a flat buffer of `dtype` (views such as view_as_real, .view(dtype))."""
    if flat.dtype == dtype:
        return flat
    if jnp.issubdtype(flat.dtype, jnp.complexfloating):
        flat = jnp.stack([flat.real, flat.imag], axis=-1).reshape(-1)
        return _reinterpret(flat, dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        part = jnp.finfo(dtype).dtype
        pairs = _reinterpret(flat, part).reshape(-1, 2)
        return lax.complex(pairs[:, 0], pairs[:, 1])
    if flat.dtype == jnp.bool_ or dtype == jnp.bool_:
        through = jnp.uint8
        flat = flat.astype(through) if flat.dtype == jnp.bool_ else _reinterpret(flat, through)
        return flat if dtype == through else (flat != 0 if dtype == jnp.bool_ else _reinterpret(flat, dtype))
    ratio = jnp.dtype(dtype).itemsize / jnp.dtype(flat.dtype).itemsize
    if ratio > 1:
        flat = flat.reshape(-1, int(ratio))
    return lax.bitcast_convert_type(flat, dtype).reshape(-1)


def conv_memory_format(input: torch.Tensor, weight: torch.Tensor) -> torch.memory_format:
    """The memory format of a convolution's result (and of its input and weight gradients), as the CPU's
    oneDNN and CUDA's cudnn give it: channels-last when the input or the weight is channels-last."""
    for t in (input, weight):
        layout = torch._prims_common.suggest_memory_format(t)
        if layout in (torch.channels_last, torch.channels_last_3d):
            return layout
    return torch.contiguous_format
