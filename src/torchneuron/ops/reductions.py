"""Reductions: sums, means, extrema, statistics, scans."""
import jax.numpy as jnp
import torch
from jax import lax

from ..runtime.dtypes import to_jax
from .registry import lower

aten = torch.ops.aten


def _axes(x, dim):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    return tuple(d % max(x.ndim, 1) for d in dims) if x.ndim else None


def _accumulate_dtype(x, dtype):
    if dtype is not None:
        return to_jax(dtype)
    if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_:
        return jnp.int64
    return x.dtype


@lower(aten.sum.default, aten.sum.dim_IntList)
def sum_(x, dim=None, keepdim=False, *, dtype=None):
    out = _accumulate_dtype(x, dtype)
    compute = jnp.float32 if out in (jnp.bfloat16, jnp.float16) else out
    return jnp.sum(x.astype(compute), axis=_axes(x, dim), keepdims=keepdim).astype(out)


@lower(aten.mean.default, aten.mean.dim)
def mean(x, dim=None, keepdim=False, *, dtype=None):
    out = to_jax(dtype) if dtype is not None else x.dtype
    compute = jnp.float32 if out in (jnp.bfloat16, jnp.float16) else out
    return jnp.mean(x.astype(compute), axis=_axes(x, dim), keepdims=keepdim).astype(out)


@lower(aten.prod.default, aten.prod.dim_int)
def prod(x, dim=None, keepdim=False, *, dtype=None):
    out = _accumulate_dtype(x, dtype)
    return jnp.prod(x.astype(out), axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.amax)
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.amin)
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.max.default)
def max_(x):
    return jnp.max(x)


@lower(aten.min.default)
def min_(x):
    return jnp.min(x)


def _arg_extreme(x, dim, keepdim, pick):
    if dim is None:
        index = pick(x.reshape(-1), axis=0).astype(jnp.int64)
        return index.reshape((1,) * x.ndim) if keepdim else index
    axis = dim % max(x.ndim, 1)
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    return pick(x, axis=axis, keepdims=keepdim).astype(jnp.int64)


def _nan_first(pick):
    # PyTorch propagates NaN: the index of the first NaN wins
    def chosen(x, axis, keepdims=False):
        if jnp.issubdtype(x.dtype, jnp.floating):
            has_nan = jnp.isnan(x)
            nan_index = jnp.argmax(has_nan, axis=axis, keepdims=keepdims)
            return jnp.where(jnp.any(has_nan, axis=axis, keepdims=keepdims), nan_index, pick(x, axis=axis, keepdims=keepdims))
        return pick(x, axis=axis, keepdims=keepdims)

    return chosen


_argmax = _nan_first(jnp.argmax)
_argmin = _nan_first(jnp.argmin)


@lower(aten.argmax)
def argmax(x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, _argmax)


@lower(aten.argmin)
def argmin(x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, _argmin)


@lower(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    return amax(x, [dim], keepdim) if x.ndim else x, _arg_extreme(x, dim, keepdim, _argmax)


@lower(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    return amin(x, [dim], keepdim) if x.ndim else x, _arg_extreme(x, dim, keepdim, _argmin)


@lower(aten.all.default, aten.all.dim, aten.all.dims)
def all_(x, dim=None, keepdim=False):
    return jnp.all(x, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.any.default, aten.any.dim, aten.any.dims)
def any_(x, dim=None, keepdim=False):
    return jnp.any(x, axis=_axes(x, dim), keepdims=keepdim)


def _correction(correction, unbiased):
    if correction is not None:
        return correction
    return 1 if unbiased is None or unbiased else 0


@lower(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    compute = jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else x.dtype
    return jnp.var(x.astype(compute), axis=_axes(x, dim), ddof=_correction(correction, None), keepdims=keepdim).astype(x.dtype)


@lower(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    return var(x, dim, correction=correction, keepdim=keepdim), mean(x, dim, keepdim)


@lower(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(var(x, dim, correction=correction, keepdim=keepdim))


@lower(aten.logsumexp)
def logsumexp(x, dim, keepdim=False):
    from jax.scipy.special import logsumexp as lse

    v = x.astype(jnp.float32) if not jnp.issubdtype(x.dtype, jnp.floating) else x
    return lse(v, axis=_axes(x, dim), keepdims=keepdim)


# ord picks the computation, so it must be a Python number
@lower(aten.linalg_vector_norm, static_scalars=True)
def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    v = x.astype(to_jax(dtype)) if dtype is not None else x
    v = jnp.abs(v)
    axes = _axes(x, dim)
    if ord == float("inf"):
        return jnp.max(v, axis=axes, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(v, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum(v != 0, axis=axes, keepdims=keepdim).astype(v.dtype)
    if ord == 1:
        return jnp.sum(v, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(v * v, axis=axes, keepdims=keepdim))
    return jnp.sum(v**ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


def _scan(fn):
    def lowering(x, dim, *, dtype=None):
        out = _accumulate_dtype(x, dtype)
        return x.astype(out) if x.ndim == 0 else fn(x.astype(out), axis=dim % x.ndim)

    return lowering


lower(aten.cumsum)(_scan(jnp.cumsum))
lower(aten.cumprod)(_scan(jnp.cumprod))


@lower(aten.logcumsumexp)
def logcumsumexp(x, dim):
    return x if x.ndim == 0 else lax.cumlogsumexp(x, axis=dim % x.ndim)


@lower(aten.cummax)
def cummax(x, dim):
    return _cum_extreme(x, dim, lax.cummax)


@lower(aten.cummin)
def cummin(x, dim):
    return _cum_extreme(x, dim, lax.cummin)


def _cum_extreme(x, dim, scan):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = dim % x.ndim
    values = scan(x, axis=axis)
    positions = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    hits = jnp.where(x == values, positions, -1)
    return values, lax.cummax(hits, axis=axis)


@lower(aten.histc)
def histc(x, bins=100, min=0, max=0):
    values = x.astype(jnp.float32 if x.dtype != jnp.float64 else x.dtype)
    # min == max means the data's own range (and a unit-wide one when that is empty too)
    low = jnp.where(min == max, jnp.min(values), min)
    high = jnp.where(min == max, jnp.max(values), max)
    low, high = jnp.where(low == high, low - 1, low), jnp.where(low == high, high + 1, high)
    position = jnp.floor((values - low) * bins / (high - low)).astype(jnp.int32)
    inside = (values >= low) & (values <= high)
    # the top edge belongs to the last bin
    index = jnp.where(inside, jnp.clip(position, 0, bins - 1), bins)
    return jnp.zeros(bins + 1, x.dtype).at[index.reshape(-1)].add(1)[:bins]
