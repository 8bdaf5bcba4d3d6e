"""Indexing, gather/scatter, masked ops."""
import functools
import math

import jax
import jax.numpy as jnp
import torch

from . import checks
from ..runtime.dtypes import not_implemented_for, to_torch
from .promotion import cast
from .reductions import running_sum
from .registry import META, Prefix, checked_meta, lower, meta_kernel, rows_kept
from .shape import OVERLAPPING_WRITE

aten = torch.ops.aten


def _dim(x, dim):
    return dim % max(x.ndim, 1)


def _advanced_index(x, indices):
    """PyTorch's index list (None = full slice, bool masks already lowered to nonzero by PyTorch)."""
    return tuple(slice(None) if index is None else index for index in indices)


def _out_of_bounds(dim, size, prefix=""):
    """The CPU's message for an index beyond a dimension; `{}` is the index."""
    return prefix + f"index {{}} is out of bounds for dimension {dim} with size {size}"


def _check_indices(x, indices):
    for dim, index in enumerate(indices):
        if index is not None and index.dtype != jnp.bool_:
            checks.index_in_range(index, x.shape[dim], message=_out_of_bounds(dim, x.shape[dim]))


@lower(aten.index.Tensor)
def index(x, indices):
    _check_indices(x, indices)
    return x[_advanced_index(x, indices)]


@lower(aten.index_put)
def index_put(x, indices, values, accumulate=False):
    values = values.astype(x.dtype)
    masks = [dim for dim, index in enumerate(indices) if index is not None and index.dtype == jnp.bool_]
    if masks:
        if sum(index is not None for index in indices) > 1:
            raise NotImplementedError("torchneuron: index_put with a boolean mask and other index tensors in a "
                                      "compiled graph; please report it at the project's issue tracker")
        return _put_through_mask(x, masks[0], indices[masks[0]], values, accumulate)
    _check_indices(x, indices)
    key = _advanced_index(x, indices)
    if not accumulate:
        return x.at[key].set(values)
    return x.at[key].max(values) if x.dtype == jnp.bool_ else x.at[key].add(values)  # boolean addition is `or`


def _put_through_mask(x, dim, mask, values, accumulate):
    """x[..., mask] = values, in eager for a mask of x's leading dimensions and in compiled graphs, which keep
    masks: the number of selected elements is data, so the k-th selected element takes values' k-th row,
    found by a running count of the mask, at the mask's size (one program whatever the count)."""
    lead, rest = x.shape[:dim], x.shape[dim + mask.ndim:]
    flat = x.reshape(lead + (math.prod(mask.shape),) + rest)
    mask = mask.reshape(-1)
    rows = values.shape[-len(rest) - 1] if values.ndim > len(rest) else 1
    count = jnp.sum(mask, dtype=jnp.int64)
    result = [*lead, "{}", *rest]
    checks.require((rows == 1) | (count == rows), RuntimeError,
                   f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to indexing "
                   f"result of shape [{', '.join(map(str, result))}]", culprit=count)
    rows_taken = jnp.clip(jnp.cumsum(mask) - 1, 0, rows - 1)
    taken = jnp.take(jnp.broadcast_to(values, lead + (rows,) + rest), rows_taken, axis=dim)
    selected = mask.reshape((-1,) + (1,) * len(rest))
    if not accumulate:
        return jnp.where(selected, taken, flat).reshape(x.shape)
    added = jnp.where(selected, taken, jnp.zeros((), x.dtype))
    return (flat | added if x.dtype == jnp.bool_ else flat + added).reshape(x.shape)


def _vector_if_scalar(fn):
    """PyTorch's index_* ops treat a 0-dim self (and its 0-dim source) as a one-element vector."""

    def lowering(x, dim, index, *rest, **kwargs):
        index = index.reshape(-1)
        if x.ndim:
            return fn(x, _dim(x, dim), index, *rest, **kwargs)
        rest = [r.reshape(-1) if hasattr(r, "ndim") else r for r in rest]
        return fn(x.reshape(1), 0, index, *rest, **kwargs).reshape(())

    return lowering


def _check_index_add_shapes(x, dim, index, source, **kwargs):
    sliced = [list(t.shape[:dim % max(t.ndim, 1)]) + list(t.shape[dim % max(t.ndim, 1) + 1:]) for t in (x, source)]
    if x.ndim != source.ndim or sliced[0] != sliced[1]:
        raise RuntimeError("source tensor shape must match self tensor shape, excluding the specified dimension. "
                           f"Got self.shape = {list(x.shape)} source.shape = {list(source.shape)}")


def _along_dim(x, dim, index, message="index out of range in self", negative=False, error_type=IndexError):
    checks.index_in_range(index, x.shape[dim], error_type, message, negative=negative)
    key = [slice(None)] * x.ndim
    key[dim] = index
    return tuple(key)


def _check_index_is_a_vector(x, dim, index, **kwargs):
    """The CPU kernel refuses an index of more than one dimension, which the meta kernel takes."""
    if index.dim() > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")


@lower(aten.index_select, meta=checked_meta(_check_index_is_a_vector, aten.index_select.default))
@_vector_if_scalar
def index_select(x, dim, index):
    if dim == 1 and x.ndim > 1:  # the CPU kernel's own path for dim 1, and its message
        message = f"INDICES element is out of DATA bounds, id={{}} axis_dim={x.shape[1]}"
        return x[_along_dim(x, dim, index, message, error_type=RuntimeError)]
    return x[_along_dim(x, dim, index)]


def _along(x, dim, index):
    """Full index tuple addressing x[..., index[i, j, k], ...] along dim (PyTorch gather/scatter semantics)."""
    grids = list(jnp.meshgrid(*[jnp.arange(s) for s in index.shape], indexing="ij"))  # a tuple from JAX 0.11
    grids[_dim(x, dim)] = index
    return tuple(grids)


def _check_along(x, dim, index):
    size = x.shape[_dim(x, dim)] if x.ndim else 1
    checks.index_in_range(index, size, RuntimeError, _out_of_bounds(_dim(x, dim), size), negative=False)


@lower(aten.gather)
def gather(x, dim, index, *, sparse_grad=False):
    _check_along(x, dim, index)
    if x.ndim == 0 or index.size == 0:  # PyTorch does not require matching ranks then
        return jnp.broadcast_to(x.reshape(-1)[0] if x.size else jnp.zeros((), x.dtype), index.shape)
    return x[_along(x, dim, index)]


def _lowest(dtype):
    if dtype == jnp.bool_:
        return False
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _highest(dtype):
    if dtype == jnp.bool_:
        return True
    return jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).max


def _reduce_into(x, key, values, reduce, include_self):
    """x with `values` written or reduced into x[key] (scatter_reduce / index_reduce semantics)."""
    values = values.astype(x.dtype)
    at = x.at[key]
    if reduce == "set":
        return at.set(values)
    if x.dtype == jnp.bool_ and reduce in ("sum", "prod"):  # boolean addition is `or`, multiplication `and`
        reduce = "amax" if reduce == "sum" else "amin"
    if reduce in ("sum", "mean"):
        sums = (x if include_self else at.set(0)).at[key].add(values)
        if reduce == "sum":
            return sums
        counts = (jnp.ones_like(x) if include_self else jnp.ones_like(x).at[key].set(0)).at[key].add(1)
        counts = jnp.maximum(counts, 1)
        return sums / counts if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.floor_divide(sums, counts)
    if reduce == "prod":
        return (x if include_self else at.set(1)).at[key].multiply(values)
    if reduce == "amax":
        return (x if include_self else at.set(_lowest(x.dtype))).at[key].max(values)
    if reduce == "amin":
        return (x if include_self else at.set(_highest(x.dtype))).at[key].min(values)
    raise NotImplementedError(f"torchneuron: reduce={reduce!r}")


def _scatter(x, dim, index, src, reduce, include_self=True):
    """x with src (a tensor, or a scalar for every index) reduced into the positions index addresses along dim."""
    _check_along(x, dim, index)
    if index.size == 0:  # PyTorch does not require matching ranks then
        return x
    if hasattr(src, "ndim") and src.ndim:
        values = src[tuple(slice(0, s) for s in index.shape)]
    else:
        values = jnp.full(index.shape, src, x.dtype)
    if x.ndim == 0:
        return _reduce_into(x.reshape(1), jnp.zeros(index.size, int), values.reshape(-1), reduce, include_self).reshape(())
    return _reduce_into(x, _along(x, dim, index), values, reduce, include_self)


@lower(aten.scatter.src, aten.scatter.value)
def scatter(x, dim, index, src):
    return _scatter(x, dim, index, src, "set")


@lower(aten.scatter_add)
def scatter_add(x, dim, index, src):
    return _scatter(x, dim, index, src, "sum")


@lower(aten.scatter_reduce.two)
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    return _scatter(x, dim, index, src, reduce, include_self)


_SCATTER_REDUCTIONS = {"add": "sum", "multiply": "prod"}


@lower(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_with_reduce(x, dim, index, src, *, reduce):
    return _scatter(x, dim, index, src, _SCATTER_REDUCTIONS[reduce])


@lower(aten.index_reduce)
def index_reduce(x, dim, index, source, reduce, *, include_self=True):
    return _vector_if_scalar(_index_reduce)(x, dim, index, source, reduce, include_self)


def _index_reduce(x, dim, index, source, reduce, include_self):
    return _reduce_into(x, _along_dim(x, dim, index), source, reduce, include_self)


def _alpha_dropped(op):
    """`op`'s meta kernel, not given alpha: PyTorch's refuses a float alpha for integers, which the CPU kernel
    truncates (alpha does not change the output's metadata)."""
    def meta(x, dim, index, source, *, alpha=1, **out):
        return op(x, dim, index, source, **out)
    return meta


for _overload in (aten.index_add.default, aten.index_add.out, aten.index_add_.default):
    META[_overload] = checked_meta(_check_index_add_shapes, _alpha_dropped(_overload))


@lower(aten.index_add)
@_vector_if_scalar
def index_add(x, dim, index, source, *, alpha=1):
    source = source if (isinstance(alpha, (int, float)) and alpha == 1) else source * cast(alpha, source.dtype)
    if x.ndim > 1 and dim in (0, x.ndim - 1):  # the CPU kernel's paths for the outer and inner dimensions
        key = _along_dim(x, dim, index, _out_of_bounds(dim, x.shape[dim]), error_type=RuntimeError)
    else:
        key = _along_dim(x, dim, index)
    return _reduce_into(x, key, source, "sum", True)


@lower(aten.index_copy)
@_vector_if_scalar
def index_copy(x, dim, index, source):
    key = _along_dim(x, dim, index, _out_of_bounds(dim, x.shape[dim], "index_copy_(): "))
    return x.at[key].set(source.astype(x.dtype))


@lower(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
@_vector_if_scalar
def index_fill(x, dim, index, value):
    return x.at[_along_dim(x, dim, index, _out_of_bounds(dim, x.shape[dim]), negative=True)].set(cast(value, x.dtype))


def _check_fill_value(x, dim, index, value):
    """The CPU kernel's check (its meta kernel has none; a bool tensor would take True)."""
    complex_value = value.is_complex() if isinstance(value, torch.Tensor) else isinstance(value, complex)
    if complex_value and not x.is_complex():
        raise RuntimeError("index_fill_(): Converting complex Scalar to non-complex type is not supported")


for _op in (aten.index_fill.int_Scalar, aten.index_fill.int_Tensor, aten.index_fill_.int_Scalar,
            aten.index_fill_.int_Tensor):
    META[_op] = checked_meta(_check_fill_value, _op)


def _check_out_overlap(*args, out, **kwargs):
    """index_select's CPU kernel refuses an out whose elements overlap before resizing it (its meta resizes)."""
    _check_index_is_a_vector(*args, **kwargs)
    if torch._debug_has_internal_overlap(out) == 1:  # 1: it does (2: too costly to tell)
        raise RuntimeError(OVERLAPPING_WRITE)


META[aten.index_select.out] = checked_meta(_check_out_overlap, aten.index_select.out)


@lower(aten.nonzero, dynamic_shape=True)
def nonzero(x):
    if not x.ndim:
        return jnp.zeros((int(x != 0), 0), jnp.int64)
    coordinates, count = _padded_nonzero(x)
    return Prefix(coordinates, int(count), (x.ndim,))


@jax.jit
def _padded_nonzero(x):
    positions, count = true_positions((x != 0).reshape(-1))
    return _coordinates(positions, x.shape).reshape(-1), count


def _coordinates(positions, shape):
    """The row-major flat positions as one row of int64 coordinates each."""
    return jnp.stack(jnp.unravel_index(positions, shape), axis=1).astype(jnp.int64)


def true_positions(flat_mask):
    """Where a flat mask is true, in order, padded with zeros to the mask's length; and how many there are.
    In int32 where the positions fit: XLA:CPU's scatter of int32 at unique indices takes about half the time
    (1M elements: 5-7 ms against 8-21)."""
    size = flat_mask.size
    index = jnp.int32 if 2 * size < 2**31 else jnp.int64
    everywhere = jnp.arange(size, dtype=index)
    counts = running_sum(flat_mask.astype(index), 0)
    slots = jnp.where(flat_mask, counts - 1, size + everywhere)  # past the end, each its own: dropped
    positions = jnp.zeros(size, index).at[slots].set(everywhere, mode="drop", unique_indices=True)
    return positions, counts[-1].astype(jnp.int64) if size else jnp.int64(0)


def masked_rows(x, mask):
    """x[mask] for a boolean mask of x's leading dimensions: the rows (the elements past the mask's
    dimensions) where it is true, in row-major order."""
    if mask.size == 0:
        return jnp.zeros((0,) + x.shape[mask.ndim:], x.dtype)
    rows, count = _padded_masked_rows(x, mask)
    return Prefix(rows, int(count), x.shape[mask.ndim:])


@jax.jit
def _padded_masked_rows(x, mask):
    positions, count = true_positions(mask.reshape(-1))
    return x.reshape((mask.size, math.prod(x.shape[mask.ndim:])))[positions].reshape(-1), count


def _check_bincount(x, weights, minlength):
    """The CPU kernel's checks, in its order (it has no meta kernel to make them)."""
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise not_implemented_for("bincount", to_torch(x.dtype))
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if x.ndim != 1 or (x.size and int(jnp.min(x)) < 0):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and weights.shape != x.shape:
        raise RuntimeError("weights should be 1-d and have the same length as input")


@lower(aten.bincount, dynamic_shape=True)
def bincount(x, weights=None, minlength=0):
    """One bin per value up to the largest: the output's length is the data's."""
    _check_bincount(x, weights, minlength)
    if x.size == 0:
        # the CPU kernel returns long zeros for an empty input, weights or not
        return jnp.zeros(minlength, jnp.int64)
    # counted into a power of two of bins: one program per such size, not per largest value
    length = max(int(jnp.max(x)) + 1, minlength)
    return Prefix(_bin_counts(x, weights, rows_kept(length)), length)


@functools.partial(jax.jit, static_argnums=2)
def _bin_counts(x, weights, bins):
    if weights is None:
        return jnp.zeros(bins, jnp.int64).at[x].add(1)
    dtype = jnp.float32 if weights.dtype == jnp.float32 else jnp.float64
    return jnp.zeros(bins, dtype).at[x].add(weights.astype(dtype))


@lower(aten.masked_select, dynamic_shape=True)
def masked_select(x, mask):
    torch._check(mask.dtype == jnp.bool_, lambda: "masked_select: expected BoolTensor for mask")
    torch._C._infer_size(torch.Size(mask.shape), torch.Size(x.shape))  # the CPU's error where they do not broadcast
    return masked_rows(*_flat_broadcast(x, mask))


@jax.jit
def _flat_broadcast(*arrays):
    return [a.reshape(-1) for a in jnp.broadcast_arrays(*arrays)]


_OUT_OF_RANGE = "out of range: tried to access index {{}} on a tensor of {} elements."


@lower(aten.take)
def take(x, index):
    checks.index_in_range(index, x.size, message=_OUT_OF_RANGE.format(x.size))
    return x.reshape(-1)[index] if x.size else jnp.zeros(index.shape, x.dtype)


@lower(aten.put)
def put(x, index, source, accumulate=False):
    checks.index_in_range(index, x.size, message=_OUT_OF_RANGE.format(x.size))
    flat = _reduce_into(x.reshape(-1), index.reshape(-1), source.reshape(-1), "sum" if accumulate else "set", True)
    return flat.reshape(x.shape)


def _masked_scatter_meta(op):
    """PyTorch's meta kernels accept non-boolean masks and, in place, a mask that self must broadcast to."""

    def meta(x, mask, source):
        if mask.dtype != torch.bool:
            raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with dtype {mask.dtype}")
        if op is aten.masked_scatter_.default and torch.broadcast_shapes(x.shape, mask.shape) != x.shape:
            raise RuntimeError(f"expand({list(mask.shape)}, size={list(x.shape)}): the mask must broadcast to self")
        return op(x, mask, source)

    return meta


META[aten.masked_scatter_.default] = _masked_scatter_meta(aten.masked_scatter_.default)


@lower(aten.masked_scatter, meta=_masked_scatter_meta(aten.masked_scatter.default))
def masked_scatter(x, mask, source):
    """The masked positions take source's leading elements in row-major order."""
    x, mask = jnp.broadcast_arrays(x, mask)
    flat = source.reshape(-1)
    checks.require(jnp.sum(mask) <= flat.size, RuntimeError,
                   "masked_scatter: expected source to have at least as many elements as ones in mask")
    if flat.size == 0:
        return x
    taken = jnp.clip(running_sum(mask.reshape(-1).astype(jnp.int64), 0) - 1, 0, flat.size - 1)
    return jnp.where(mask, flat[taken].reshape(x.shape).astype(x.dtype), x)


@lower(aten.masked_scatter_backward)
def masked_scatter_backward(grad, mask, sizes):
    """The gradient of source: grad at the masked positions, in order, then zeros."""
    grad, mask = jnp.broadcast_arrays(grad, mask)
    size = math.prod(sizes)
    mask = mask.reshape(-1)
    slots = jnp.where(mask, running_sum(mask.astype(jnp.int64), 0) - 1, size)
    return jnp.zeros(size, grad.dtype).at[slots].set(grad.reshape(-1), mode="drop").reshape(sizes)


@lower(aten.nonzero_static)
def nonzero_static(x, *, size, fill_value=-1):
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    positions, count = true_positions((x != 0).reshape(-1))
    positions = jnp.pad(positions[:size], (0, max(size - x.size, 0)))  # as many rows as asked for
    return jnp.where((jnp.arange(size) < count)[:, None], _coordinates(positions, x.shape), fill_value)


@lower(aten.repeat_interleave.Tensor, dynamic_shape=True)
def repeat_interleave(repeats, *, output_size=None):
    """The positions of `repeats`, each repeated as often as it says, in its dtype (the CPU's checks)."""
    if repeats.ndim != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype not in (jnp.int32, jnp.int64):
        raise not_implemented_for("repeat_interleave_cpu", to_torch(repeats.dtype))
    if repeats.size and int(jnp.min(repeats)) < 0:
        raise RuntimeError("repeats can not be negative")
    if output_size is not None:
        return _repeated_positions(repeats, output_size)
    # computed at a power of two of the total: one program per such size, not per total
    total = int(jnp.sum(repeats))
    return Prefix(_repeated_positions(repeats, rows_kept(total)), total)


@functools.partial(jax.jit, static_argnums=1)
def _repeated_positions(repeats, length):
    return jnp.repeat(jnp.arange(repeats.size, dtype=repeats.dtype), repeats, total_repeat_length=length)


# Nested (jagged) tensors' conversions between their packed values (total, ...) and a padded batch
# (batch, longest, ...), whose rows each sequence of `offsets` fills from its start.

@lower(aten._jagged_to_padded_dense_forward)
def jagged_to_padded(values, offsets, max_lengths, padding_value=0.0):
    (starts,), (longest,) = offsets, max_lengths
    lengths = starts[1:] - starts[:-1]
    positions = jnp.arange(longest)
    rows = jnp.clip(starts[:-1, None] + positions, 0, max(values.shape[0] - 1, 0))
    kept = (positions < lengths[:, None]).reshape(lengths.shape + (longest,) + (1,) * (values.ndim - 1))
    return jnp.where(kept, values[rows], jnp.asarray(padding_value, values.dtype))


@meta_kernel(aten._padded_dense_to_jagged_forward.default)
def _packed_rows(dense, offsets, total_L=None):
    if total_L is None:
        # eager reads it from the offsets first (eager/handlers.py); a graph would need it as a data-dependent size
        raise NotImplementedError("aten::_padded_dense_to_jagged_forward without total_L under torch.compile on "
                                  "neuron; pass total_L (nested tensors' own ops do)")
    return dense.new_empty((total_L, *dense.shape[2:]))


@lower(aten._padded_dense_to_jagged_forward)
def padded_to_jagged(dense, offsets, total_L=None):
    (starts,) = offsets
    rows = jnp.arange(total_L)
    sequence = jnp.clip(jnp.searchsorted(starts, rows, side="right") - 1, 0, dense.shape[0] - 1)
    return dense[sequence, jnp.clip(rows - starts[sequence], 0, dense.shape[1] - 1)]
