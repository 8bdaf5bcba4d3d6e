"""Matrix products and linear algebra."""
import functools

import jax.numpy as jnp
import torch

from .promotion import accumulation_type, cast, opmath, promote
from .registry import META, lower
from .rules import MissingLowering

aten = torch.ops.aten


def _product(a, b):
    """a @ b unrounded: float32 for half-precision inputs."""
    return jnp.matmul(a, b, preferred_element_type=accumulation_type(a))


@lower(aten.mm, aten.bmm, aten.matmul)
def mm(a, b):
    return _product(a, b).astype(a.dtype)


@lower(aten._int_mm)
def int_mm(a, b):
    """8-bit integer products summed in int32 (torchao's int8 dynamic quantization)."""
    return jnp.matmul(a, b, preferred_element_type=jnp.int32)


@lower(aten.mv)
def mv(a, v):
    return _product(a, v).astype(a.dtype)


@lower(aten.dot)
def dot(a, b):
    return jnp.dot(a, b, preferred_element_type=accumulation_type(a)).astype(a.dtype)


@lower(aten.vdot)
def vdot(a, b):
    return dot(jnp.conj(a), b)


def _scaled_sum(x, product, beta, alpha, dtype):
    """beta * x + alpha * product, rounded to dtype once at the end (the CPU's and CUDA's half-precision
    kernels round their float32 sums once too)."""
    product = product if _is_one(alpha) else product * cast(alpha, product.dtype)
    if _is_zero(beta):
        return product.astype(dtype)
    x = opmath(x) if _is_one(beta) else opmath(x) * cast(beta, opmath(x).dtype)
    out = x + product
    # beta == 0 ignores the input, nan and inf included (a traced beta is only known on device)
    return (out if isinstance(beta, (int, float)) else jnp.where(beta == 0, product, out)).astype(dtype)


def _is_one(value) -> bool:
    return isinstance(value, (int, float)) and value == 1


def _is_zero(value) -> bool:
    return isinstance(value, (int, float)) and value == 0


@lower(aten.addmm, aten.baddbmm, aten.addmv)
def addmm(x, a, b, *, beta=1, alpha=1):
    return _scaled_sum(x, _product(a, b), beta, alpha, a.dtype)


@lower(aten.addbmm)
def addbmm(x, a, b, *, beta=1, alpha=1):
    return _scaled_sum(x, jnp.sum(_product(a, b), axis=0), beta, alpha, a.dtype)


def _addbmm_inplace_meta(x, a, b, *, beta=1, alpha=1):
    """PyTorch's CPU and CUDA addbmm_ is addbmm's out= kernel writing `self`, which resizes a `self` of another
    shape (a 0-dim or one-element bias) to the result's; the meta kernel, a decomposition, refuses it."""
    shape = aten.addbmm.default(x, a, b, beta=beta, alpha=alpha).shape
    if x.shape != shape:
        return x.resize_(shape)
    return aten.addbmm_.default(x, a, b, beta=beta, alpha=alpha)


META[aten.addbmm_.default] = _addbmm_inplace_meta


@lower(aten.addr)
def addr(x, a, b, *, beta=1, alpha=1):
    return _scaled_sum(x, jnp.outer(opmath(a), opmath(b)), beta, alpha, a.dtype)


@lower(aten.outer)
def outer(a, b):
    (a, b), result = promote(a, b)
    return jnp.outer(a, b).astype(result)


def _group_masks(offs, n, dtype):
    """(groups, n) one-hot of the group each position along the ragged dimension falls in (none past the end)."""
    group = jnp.searchsorted(offs, jnp.arange(n, dtype=offs.dtype), side="right")
    return (group[None, :] == jnp.arange(offs.shape[0])[:, None]).astype(dtype)


def _grouped_mm_meta(a, b, offs=None, bias=None, out_dtype=None):
    """PyTorch's meta kernel enforces the CUDA kernel's bf16-only and 16-byte-stride rules; the CPU kernel
    (Hugging Face's MoE path on any non-CUDA device) takes every float dtype and stride, and so does neuron."""
    from torch._meta_registrations import _create_grouped_mm_output_tensor

    return _create_grouped_mm_output_tensor(a, b, offs, out_dtype)


@lower(aten._grouped_mm, meta=_grouped_mm_meta)
def grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    if bias is not None:
        raise MissingLowering(aten._grouped_mm.default)
    if a.ndim == 3 and b.ndim == 3:
        return mm(a, b)
    product = functools.partial(jnp.einsum, preferred_element_type=accumulation_type(a))
    if a.ndim == 2 and b.ndim == 3:  # rows of `a` in groups, each times its group's matrix
        out = product("sk,gkn,gs->sn", a, b, _group_masks(offs, a.shape[0], a.dtype))
    elif a.ndim == 2:  # the contracted dimension in groups: one product per group (weight gradients)
        out = product("mk,gk,kn->gmn", a, _group_masks(offs, a.shape[1], a.dtype), b)
    else:  # columns of `b` in groups, each times its group's matrix of `a`
        out = product("gmk,kn,gn->mn", a, b, _group_masks(offs, b.shape[1], a.dtype))
    return out.astype(a.dtype)
