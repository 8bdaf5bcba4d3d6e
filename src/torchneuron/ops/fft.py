"""FFTs: the three primitives PyTorch's torch.fft functions reduce to."""
import math

import jax.numpy as jnp
import torch

from .registry import lower

aten = torch.ops.aten


def _scale(x, sizes, normalization):
    """PyTorch's normalization codes: 0 none, 1 by 1/sqrt(n), 2 by 1/n (n = the transformed signal size)."""
    n = math.prod(sizes)
    if normalization == 0 or n == 0:
        return x
    return x * (1 / math.sqrt(n) if normalization == 1 else 1 / n)


@lower(aten._fft_r2c)
def fft_r2c(x, dim, normalization, onesided):
    axes = tuple(d % x.ndim for d in dim)
    out = jnp.fft.fftn(x, axes=axes)
    if onesided:
        last = axes[-1]
        out = out[(slice(None),) * last + (slice(0, x.shape[last] // 2 + 1),)]
    return _scale(out, [x.shape[a] for a in axes], normalization)


@lower(aten._fft_c2c)
def fft_c2c(x, dim, normalization, forward):
    axes = tuple(d % x.ndim for d in dim)
    sizes = [x.shape[a] for a in axes]
    # norm="forward" leaves the inverse unscaled; _scale applies PyTorch's normalization
    out = jnp.fft.fftn(x, axes=axes) if forward else jnp.fft.ifftn(x, axes=axes, norm="forward")
    return _scale(out, sizes, normalization)


@lower(aten._fft_c2r)
def fft_c2r(x, dim, normalization, last_dim_size):
    axes = tuple(d % x.ndim for d in dim)
    sizes = [x.shape[a] for a in axes[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(x, s=sizes, axes=axes, norm="forward")
    return _scale(out, sizes, normalization)
