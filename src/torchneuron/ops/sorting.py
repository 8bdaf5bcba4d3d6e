"""Sorting: sort (and so argsort, msort, topk's decomposition) with PyTorch's NaN order."""
import jax.numpy as jnp
import torch

from .registry import lower

aten = torch.ops.aten


@lower(aten.sort.default, aten.sort.stable)
def sort(x, *args, stable=False, dim=-1, descending=False):
    if args:  # sort.default(self, dim=-1, descending=False)
        dim, descending = (list(args) + [descending])[:2]
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = dim % x.ndim
    order = _stable_order(x, axis, descending)
    return jnp.take_along_axis(x, order, axis=axis), order.astype(jnp.int64)


def _stable_order(x, axis, descending):
    """A stable argsort in which NaN ranks above +inf, as in PyTorch (last ascending, first descending)."""
    keys = x.astype(jnp.int8) if x.dtype == jnp.bool_ else x
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.argsort(keys, axis=axis, stable=True, descending=descending)
    nan = jnp.isnan(x)
    order = jnp.argsort(jnp.where(nan, jnp.inf, x), axis=axis, stable=True, descending=descending)
    # a second stable pass moves NaNs past the infinities they tied with
    nan_order = jnp.argsort(jnp.take_along_axis(nan, order, axis=axis), axis=axis, stable=True, descending=descending)
    return jnp.take_along_axis(order, nan_order, axis=axis)


@lower(aten.topk)
def topk(x, k, dim=-1, largest=True, sorted=True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = dim % x.ndim
    order = jnp.take(_stable_order(x, axis, largest), jnp.arange(k), axis=axis)
    return jnp.take_along_axis(x, order, axis=axis), order.astype(jnp.int64)
