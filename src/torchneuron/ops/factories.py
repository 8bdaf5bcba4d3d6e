"""Factories that arrive with a neuron tensor (`*_like`, `new_*`) or an out= neuron tensor (`arange`)."""
import math

import jax.numpy as jnp
import torch

from ..runtime.dtypes import to_jax
from .promotion import cast
from .registry import lower

aten = torch.ops.aten


def _dtype(x, dtype):
    return to_jax(dtype) if dtype is not None else x.dtype


@lower(aten.empty_like, aten.zeros_like)
def zeros_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(x.shape, _dtype(x, dtype))


@lower(aten.ones_like)
def ones_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones(x.shape, _dtype(x, dtype))


@lower(aten.full_like)
def full_like(x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    dt = _dtype(x, dtype)
    return jnp.full(x.shape, cast(fill_value, dt))


@lower(aten.empty.memory_format)
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(tuple(size), to_jax(dtype or torch.get_default_dtype()))


@lower(aten.empty_strided)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return empty(size, dtype=dtype)


@lower(aten.new_empty, aten.new_zeros)
def new_zeros(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _dtype(x, dtype))


@lower(aten.new_ones)
def new_ones(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), _dtype(x, dtype))


@lower(aten.new_full)
def new_full(x, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    dt = _dtype(x, dtype)
    return jnp.full(tuple(size), cast(fill_value, dt))


@lower(aten.new_empty_strided)
def new_empty_strided(x, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _dtype(x, dtype))


@lower(aten.arange.start_step, static_scalars=True)
def arange(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    # the dispatcher casts to the dtype PyTorch infers; values are computed as start + i * step
    if all(isinstance(v, int) for v in (start, end, step)):
        count = max(0, -(-(end - start) // step))
        return start + jnp.arange(count, dtype=jnp.int64) * step
    count = max(0, math.ceil((end - start) / step))
    return start + jnp.arange(count, dtype=jnp.float64) * step


@lower(aten.scalar_tensor)
def scalar_tensor(value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(value, to_jax(dtype or torch.get_default_dtype()))


@lower(aten.eye.default, aten.eye.m)
def eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, m, dtype=to_jax(dtype or torch.get_default_dtype()))


@lower(aten.linspace.default, aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar, aten.linspace.Scalar_Tensor,
       static_scalars=True)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.linspace(start, end, steps, dtype=jnp.float64).astype(to_jax(dtype or torch.get_default_dtype()))


@lower(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    dt = to_jax(dtype) if dtype is not None else None
    return jnp.full(tuple(size), fill_value, dtype=dt)


def _triangle_indices(indices):
    def lowering(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
        rows, cols = indices(row, offset, col)
        return jnp.stack([rows, cols]).astype(to_jax(dtype or torch.long))

    return lowering


def _on_meta(op):
    """Output metadata of a factory with no tensor argument: the same call on the meta device."""
    return lambda *args, **kwargs: op(*args, **{**kwargs, "device": "meta"})


# these take no tensor: registration.py routes their PrivateUse1 kernels to eager dispatch
lower(aten.tril_indices, meta=_on_meta(aten.tril_indices.default))(_triangle_indices(jnp.tril_indices))
lower(aten.triu_indices, meta=_on_meta(aten.triu_indices.default))(_triangle_indices(jnp.triu_indices))
