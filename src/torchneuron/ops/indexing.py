"""Indexing, gather/scatter, masked ops."""
import jax.numpy as jnp
import torch

from . import checks
from .promotion import cast
from .registry import lower

aten = torch.ops.aten


def _dim(x, dim):
    return dim % max(x.ndim, 1)


def _advanced_index(x, indices):
    """PyTorch's index list (None = full slice, bool masks already lowered to nonzero by PyTorch)."""
    return tuple(slice(None) if index is None else index for index in indices)


def _check_indices(x, indices):
    for dim, index in enumerate(indices):
        if index is not None and index.dtype != jnp.bool_:
            checks.index_in_range(index, x.shape[dim], message=f"index out of bounds for dimension {dim} with size {x.shape[dim]}")


@lower(aten.index.Tensor)
def index(x, indices):
    _check_indices(x, indices)
    return x[_advanced_index(x, indices)]


@lower(aten.index_put)
def index_put(x, indices, values, accumulate=False):
    _check_indices(x, indices)
    key = _advanced_index(x, indices)
    values = values.astype(x.dtype)
    return x.at[key].add(values) if accumulate else x.at[key].set(values)


def _vector_if_scalar(fn):
    """PyTorch's index_* ops treat a 0-dim self (and its 0-dim source) as a one-element vector."""

    def lowering(x, dim, index, *rest, **kwargs):
        index = index.reshape(-1)
        if x.ndim:
            return fn(x, _dim(x, dim), index, *rest, **kwargs)
        rest = [r.reshape(-1) if hasattr(r, "ndim") else r for r in rest]
        return fn(x.reshape(1), 0, index, *rest, **kwargs).reshape(())

    return lowering


def _along_dim(x, dim, index):
    checks.index_in_range(index, x.shape[dim])
    key = [slice(None)] * x.ndim
    key[dim] = index
    return tuple(key)


@lower(aten.index_select)
@_vector_if_scalar
def index_select(x, dim, index):
    return x[_along_dim(x, dim, index)]


def _along(x, dim, index):
    """Full index tuple addressing x[..., index[i, j, k], ...] along dim (PyTorch gather/scatter semantics)."""
    grids = jnp.meshgrid(*[jnp.arange(s) for s in index.shape], indexing="ij")
    grids[_dim(x, dim)] = index
    return tuple(grids)


def _check_along(x, dim, index):
    size = x.shape[_dim(x, dim)] if x.ndim else 1
    checks.index_in_range(index, size, RuntimeError, f"index out of bounds for dimension {dim} with size {size}")


@lower(aten.gather)
def gather(x, dim, index, *, sparse_grad=False):
    _check_along(x, dim, index)
    if x.ndim == 0 or index.size == 0:  # PyTorch does not require matching ranks then
        return jnp.broadcast_to(x.reshape(-1)[0] if x.size else jnp.zeros((), x.dtype), index.shape)
    return x[_along(x, dim, index)]


@lower(aten.scatter.src, aten.scatter.value)
def scatter(x, dim, index, src):
    _check_along(x, dim, index)
    if x.ndim == 0:
        return jnp.broadcast_to(cast(src, x.dtype), ()) if index.size else x
    values = src[tuple(slice(0, s) for s in index.shape)] if hasattr(src, "ndim") and src.ndim else src
    return x.at[_along(x, dim, index)].set(cast(values, x.dtype))


@lower(aten.scatter_add)
def scatter_add(x, dim, index, src):
    _check_along(x, dim, index)
    if x.ndim == 0:
        return x + jnp.sum(src) if index.size else x
    values = src[tuple(slice(0, s) for s in index.shape)]
    return x.at[_along(x, dim, index)].add(values.astype(x.dtype))


@lower(aten.scatter_reduce.two)
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    values = src[tuple(slice(0, s) for s in index.shape)].astype(x.dtype)
    if reduce == "sum":
        base = x if include_self else x.at[_along(x, dim, index)].set(0)
        return base.at[_along(x, dim, index)].add(values)
    if reduce == "prod":
        base = x if include_self else x.at[_along(x, dim, index)].set(1)
        return base.at[_along(x, dim, index)].multiply(values)
    if reduce in ("amax", "amin"):
        fill = jnp.finfo(x.dtype).min if reduce == "amax" else jnp.finfo(x.dtype).max
        if jnp.issubdtype(x.dtype, jnp.integer):
            fill = jnp.iinfo(x.dtype).min if reduce == "amax" else jnp.iinfo(x.dtype).max
        base = x if include_self else x.at[_along(x, dim, index)].set(fill)
        return base.at[_along(x, dim, index)].max(values) if reduce == "amax" else base.at[_along(x, dim, index)].min(values)
    if reduce == "mean":
        base = x if include_self else x.at[_along(x, dim, index)].set(0)
        sums = base.at[_along(x, dim, index)].add(values)
        counts = jnp.ones_like(x) if include_self else jnp.zeros_like(x)
        counts = counts.at[_along(x, dim, index)].add(1)
        out = sums / jnp.maximum(counts, 1)
        return out if jnp.issubdtype(x.dtype, jnp.floating) else jnp.floor_divide(sums, jnp.maximum(counts, 1))
    raise NotImplementedError(f"torchneuron: scatter_reduce with reduce={reduce!r}")


@lower(aten.index_add)
@_vector_if_scalar
def index_add(x, dim, index, source, *, alpha=1):
    source = source if (isinstance(alpha, (int, float)) and alpha == 1) else source * cast(alpha, source.dtype)
    return x.at[_along_dim(x, dim, index)].add(source.astype(x.dtype))


@lower(aten.index_copy)
@_vector_if_scalar
def index_copy(x, dim, index, source):
    return x.at[_along_dim(x, dim, index)].set(source.astype(x.dtype))


@lower(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
@_vector_if_scalar
def index_fill(x, dim, index, value):
    return x.at[_along_dim(x, dim, index)].set(cast(value, x.dtype))


@lower(aten.nonzero, dynamic_shape=True)
def nonzero(x):
    return jnp.stack(jnp.nonzero(x), axis=1).astype(jnp.int64) if x.ndim else jnp.zeros((int(x != 0), 0), jnp.int64)


@lower(aten.masked_select, dynamic_shape=True)
def masked_select(x, mask):
    x, mask = jnp.broadcast_arrays(x, mask)
    return x[mask]
