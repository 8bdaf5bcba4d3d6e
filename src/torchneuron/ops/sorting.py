"""Sorting and what builds on it (order statistics, searches, unique) with PyTorch's NaN order."""
import functools
import math

import jax
import jax.numpy as jnp
import torch
from jax import lax
from torch._prims_common import canonicalize_dim

from .indexing import true_positions
from .reductions import running_sum
from .registry import Prefix, checked_meta, lower

aten = torch.ops.aten


def _check_sort_dim(x, *args, stable=None, dim=-1, descending=False):
    """The CPU kernel's IndexError for a dimension out of range, which the meta kernel wraps round."""
    canonicalize_dim(x.ndim, args[0] if args else dim)


@lower(aten.sort.default, aten.sort.stable, meta=checked_meta(_check_sort_dim, aten.sort))
def sort(x, *args, stable=False, dim=-1, descending=False):
    if args:  # sort.default(self, dim=-1, descending=False)
        dim, descending = (list(args) + [descending])[:2]
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = dim % x.ndim
    order = _stable_order(x, axis, descending)
    return jnp.take_along_axis(x, order, axis=axis), order.astype(jnp.int64)


def _stable_order(x, axis, descending):
    """A stable argsort in PyTorch's order, which is jnp's: NaNs of either sign above +inf, the two zeros equal."""
    keys = x.astype(jnp.int8) if x.dtype == jnp.bool_ else x
    return jnp.argsort(keys, axis=axis, stable=True, descending=descending)


@lower(aten.topk)
def topk(x, k, dim=-1, largest=True, sorted=True):
    """XLA's TopK (ties: the lower index first, as the stable sort gives) on keys in PyTorch's order; a full
    sort took 90 times as long on XLA:CPU for k=8 of 1024x1024 float32."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = dim % x.ndim
    order = _first_positions(x, axis, k, largest)
    return jnp.take_along_axis(x, order, axis=axis), order.astype(jnp.int64)


def _first_positions(x, axis, count, largest):
    """The positions along axis of x's `count` largest (or smallest) elements, in that order."""
    return jnp.moveaxis(lax.top_k(jnp.moveaxis(_descending_keys(x, largest), axis, -1), count)[1], -1, axis)


def _descending_keys(x, largest):
    """Keys whose descending order is x's largest-first (`largest`) or smallest-first order in PyTorch's terms:
    every NaN above +inf and the two zeros equal, where XLA orders floats totally (a NaN with its sign bit
    set lowest, -0 below +0)."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x if largest else ~x  # ~x reverses the order of integers and booleans without overflow
    keys = jnp.where(jnp.isnan(x), jnp.nan, jnp.where(x == 0, 0, x))
    if keys.dtype != jnp.float64:
        keys = keys.astype(jnp.float32)  # exact for the narrower floats; XLA:CPU's TopK is fast for float32 only
    return keys if largest else -keys


def _pick(x, dim, keepdim, position, count):
    """The value and index at `position` (an array broadcast against the reduced shape, below `count`) of x
    sorted along dim: XLA's TopK of the `count` smallest, in the stable sort's order. A full sort took 3-4
    times as long on XLA:CPU for the medians of 1024x1024 float32."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = dim % x.ndim
    order = _first_positions(x, axis, count, False)
    position = jnp.expand_dims(jnp.broadcast_to(position, order.shape[:axis] + order.shape[axis + 1:]), axis)
    index = jnp.take_along_axis(order, position, axis=axis)
    value = jnp.take_along_axis(x, index, axis=axis)
    if not keepdim:
        value, index = value.squeeze(axis), index.squeeze(axis)
    return value, index.astype(jnp.int64)


@lower(aten.kthvalue)
def kthvalue(x, k, dim=-1, keepdim=False):
    return _pick(x, dim, keepdim, k - 1, k)


@lower(aten.median.dim)
def median_dim(x, dim, keepdim=False):
    """The lower median; along a slice holding NaN, that NaN (the first one) and its index."""
    middle = (x.shape[dim % x.ndim] - 1) // 2 if x.ndim else 0
    value, index = _pick(x, dim, keepdim, middle, middle + 1)
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.ndim == 0:
        return value, index
    nan = jnp.isnan(x)
    axis = dim % x.ndim
    has_nan = jnp.any(nan, axis=axis, keepdims=keepdim)
    first_nan = jnp.argmax(nan, axis=axis, keepdims=keepdim)
    return jnp.where(has_nan, jnp.nan, value).astype(x.dtype), jnp.where(has_nan, first_nan, index).astype(jnp.int64)


@lower(aten.nanmedian.dim)
def nanmedian_dim(x, dim, keepdim=False):
    """The lower median of the non-NaN values (NaNs sort last); of all of them where all are NaN."""
    if x.ndim == 0 or not jnp.issubdtype(x.dtype, jnp.floating):
        return median_dim(x, dim, keepdim)
    axis = dim % x.ndim
    count = jnp.sum(~jnp.isnan(x), axis=axis)
    count = jnp.where(count == 0, x.shape[axis], count)
    return _pick(x, dim, keepdim, (count - 1) // 2, (x.shape[axis] - 1) // 2 + 1)


def _median_of_nothing(dtype):
    """The CPU's median of no elements: NaN, converted as x86 converts it for integers (the lowest 32- and
    64-bit integer; narrower ones keep the low bits of the 32-bit one, 0)."""
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.array(jnp.nan, dtype)
    return jnp.array(jnp.iinfo(dtype).min if dtype in (jnp.int32, jnp.int64) else 0, dtype)


@lower(aten.median.default)
def median(x):
    return median_dim(x.reshape(-1), 0)[0] if x.size else _median_of_nothing(x.dtype)


@lower(aten.nanmedian.default)
def nanmedian(x):
    return nanmedian_dim(x.reshape(-1), 0)[0] if x.size else _median_of_nothing(x.dtype)


@lower(aten.mode)
def mode(x, dim=-1, keepdim=False):
    """The most frequent value (the smallest among ties; NaNs never equal) and the index of its last occurrence."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = dim % x.ndim
    order = _stable_order(x, axis, False)
    values = jnp.take_along_axis(x, order, axis=axis)
    positions = lax.broadcasted_iota(jnp.int32, x.shape, axis)
    previous = jnp.concatenate([lax.slice_in_dim(values, 0, 1, axis=axis), lax.slice_in_dim(values, 0, -1, axis=axis)], axis)
    starts = (positions == 0) | (values != previous)
    run_length = positions - lax.cummax(jnp.where(starts, positions, 0), axis=axis)
    # the first longest run ends where its length is first reached
    end = jnp.argmax(run_length, axis=axis, keepdims=True)
    value, index = jnp.take_along_axis(values, end, axis=axis), jnp.take_along_axis(order, end, axis=axis)
    if not keepdim:
        value, index = value.squeeze(axis), index.squeeze(axis)
    return value, index.astype(jnp.int64)


def _side(right, side):
    return side if side is not None else ("right" if right else "left")


def _bound(sequence, values, side):
    """The CPU's lower (upper) bound: a binary search stepping right while not sequence[mid] >= (>) value. Its
    comparisons put a nan value past every element, where jnp.searchsorted orders nan as sort does (a nan value
    found the first nan)."""
    size = sequence.shape[0]
    start = jnp.zeros(values.shape, jnp.int32)
    end = jnp.full(values.shape, size, jnp.int32)
    for _ in range(size.bit_length()):
        middle = start + (end - start) // 2
        middle_value = sequence[jnp.minimum(middle, size - 1)]
        right = ~(middle_value > values) if side == "right" else ~(middle_value >= values)
        searching = start < end
        start = jnp.where(searching & right, middle + 1, start)
        end = jnp.where(searching & ~right, middle, end)
    return start


@lower(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(sorted_sequence, values, *, out_int32=False, right=False, side=None, sorter=None):
    if sorter is not None:
        sorted_sequence = jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    values = jnp.asarray(values, sorted_sequence.dtype if not hasattr(values, "dtype") else values.dtype)
    search = functools.partial(_bound, side=_side(right, side))
    if sorted_sequence.ndim <= 1:
        found = search(sorted_sequence.reshape(-1), values)
    else:
        # one search per leading index: the sequences' and the values' leading dimensions match
        rows = sorted_sequence.reshape(-1, sorted_sequence.shape[-1])
        found = jax.vmap(search)(rows, values.reshape(rows.shape[0], -1)).reshape(values.shape)
    return found.astype(jnp.int32 if out_int32 else jnp.int64)


def _check_boundaries(values, boundaries, **kwargs):
    if boundaries.ndim != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})")


@lower(aten.bucketize.Tensor, aten.bucketize.Scalar, meta=checked_meta(_check_boundaries, aten.bucketize))
def bucketize(values, boundaries, *, out_int32=False, right=False):
    return searchsorted(boundaries, values, out_int32=out_int32, right=right)


@functools.partial(jax.jit, static_argnames="consecutive")
def _padded_unique_rows(rows, consecutive):
    """Unique rows of a 2-d array (sorted unless `consecutive`) at the array's own size: the unique rows and
    their counts, padded to the number of rows, the inverse, and how many are unique."""
    n = rows.shape[0]
    order = jnp.arange(n) if consecutive or not rows.shape[1] else jnp.lexsort(_sort_keys(rows))
    rows = rows[order]
    new = jnp.concatenate([jnp.ones((min(n, 1),), bool), jnp.any(rows[1:] != rows[:-1], axis=1)])
    starts, count = true_positions(new)
    inverse = jnp.zeros((n,), jnp.int64).at[order].set(running_sum(new.astype(jnp.int64), 0) - 1)
    ends = jnp.where(jnp.arange(1, n + 1) < count, jnp.roll(starts, -1), n)
    return rows[starts], inverse, (ends - starts).astype(jnp.int64), count


def _sort_keys(rows):
    """lexsort keys, the first column last (it sorts by the last key first); NaNs compare above +inf."""
    keys = rows.astype(jnp.int8) if rows.dtype == jnp.bool_ else rows
    return tuple(keys[:, i] for i in reversed(range(rows.shape[1])))


def _check_unique_of_empty(shape, axis):
    """The CPU kernel's checks of unique slices along `axis` of an empty tensor, with its messages."""
    if shape[axis] != 0:
        raise RuntimeError("There are 0 sized dimensions, and they aren't selected, so unique cannot be applied")
    if shape.count(0) > 1:
        raise RuntimeError("Number of zero sized dimensions is more than one, so unique cannot be applied ")


def _unique(x, dim, return_inverse, return_counts, consecutive):
    empty = jnp.zeros((0,), jnp.int64)
    axis = None if dim is None else _unique_axis(x.ndim, dim)
    if axis is not None and x.size == 0:
        _check_unique_of_empty(x.shape, axis)
    moved = x.reshape(-1, 1) if axis is None else jnp.moveaxis(x, axis, 0)
    rows, inverse, counts, count = _padded_unique_rows(moved.reshape(moved.shape[0], math.prod(moved.shape[1:])),
                                                         consecutive)
    count = int(count)
    if axis is None:
        values, inverse = Prefix(rows.reshape(-1), count), inverse.reshape(x.shape)
    elif axis == 0:
        values = Prefix(rows.reshape(-1), count, moved.shape[1:])
    else:  # the unique slices along another dimension: cut to their number (a program per number)
        values = jnp.moveaxis(rows[:count].reshape((count,) + moved.shape[1:]), 0, axis)
    return values, inverse if return_inverse else empty, Prefix(counts, count) if return_counts else empty


def _unique_axis(ndim: int, dim: int) -> int:
    """`dim` counted from the front, or the CPU's IndexError (unique has no meta kernel to raise it)."""
    if ndim == 0:
        raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
    return canonicalize_dim(ndim, dim)


@lower(aten._unique2, dynamic_shape=True)
def unique2(x, sorted=True, return_inverse=False, return_counts=False):
    return _unique(x, None, return_inverse, return_counts, consecutive=False)


@lower(aten._unique, dynamic_shape=True)
def unique(x, sorted=True, return_inverse=False):
    return _unique(x, None, return_inverse, False, consecutive=False)[:2]


@lower(aten.unique_dim, dynamic_shape=True)
def unique_dim(x, dim, sorted=True, return_inverse=False, return_counts=False):
    return _unique(x, dim, return_inverse, return_counts, consecutive=False)


@lower(aten.unique_consecutive, dynamic_shape=True)
def unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    return _unique(x, dim, return_inverse, return_counts, consecutive=True)


@lower(aten.unique_dim_consecutive, dynamic_shape=True)
def unique_dim_consecutive(x, dim, return_inverse=False, return_counts=False):
    return _unique(x, dim, return_inverse, return_counts, consecutive=True)
