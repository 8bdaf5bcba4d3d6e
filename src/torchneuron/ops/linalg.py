"""Matrix products and linear algebra."""
import jax.numpy as jnp
import torch
from jax import lax

from .promotion import cast, promote
from .registry import lower

aten = torch.ops.aten


def _accumulate(x):
    """Matmuls accumulate half-precision inputs in float32, as PyTorch's CPU and CUDA kernels do."""
    return jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else None


def _matmul(a, b):
    return jnp.matmul(a, b, preferred_element_type=_accumulate(a)).astype(a.dtype)


@lower(aten.mm, aten.bmm, aten.matmul)
def mm(a, b):
    return _matmul(a, b)


@lower(aten.mv)
def mv(a, v):
    return _matmul(a, v)


@lower(aten.dot, aten.vdot)
def dot(a, b):
    return jnp.dot(a, b, preferred_element_type=_accumulate(a)).astype(a.dtype)


def _scaled_sum(x, product, beta, alpha):
    product = product if _is_one(alpha) else product * cast(alpha, product.dtype)
    if _is_zero(beta):
        return product
    x = x if _is_one(beta) else x * cast(beta, x.dtype)
    return (x + product).astype(product.dtype)


def _is_one(value) -> bool:
    return isinstance(value, (int, float)) and value == 1


def _is_zero(value) -> bool:
    return isinstance(value, (int, float)) and value == 0


@lower(aten.addmm, aten.baddbmm, aten.addmv)
def addmm(x, a, b, *, beta=1, alpha=1):
    return _scaled_sum(x, _matmul(a, b), beta, alpha)


@lower(aten.addbmm)
def addbmm(x, a, b, *, beta=1, alpha=1):
    return _scaled_sum(x, jnp.sum(_matmul(a, b), axis=0), beta, alpha)


@lower(aten.addr)
def addr(x, a, b, *, beta=1, alpha=1):
    return _scaled_sum(x, jnp.outer(a, b), beta, alpha)


@lower(aten.outer)
def outer(a, b):
    (a, b), result = promote(a, b)
    return jnp.outer(a, b).astype(result)


@lower(aten.linalg_inv_ex)
def inv_ex(a, *, check_errors=False):
    return jnp.linalg.inv(a), jnp.zeros(a.shape[:-2], jnp.int32)


@lower(aten.linalg_cholesky_ex)
def cholesky_ex(a, *, upper=False, check_errors=False):
    lower_factor = jnp.linalg.cholesky(a)
    out = jnp.swapaxes(lower_factor, -1, -2).conj() if upper else lower_factor
    return out, jnp.zeros(a.shape[:-2], jnp.int32)


@lower(aten._linalg_check_errors)
def linalg_check_errors(info, api_name, *, is_matrix):
    # our factorizations report no errors (check_errors=False semantics); nothing to check on device
    return None
