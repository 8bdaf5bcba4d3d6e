"""FP8 matrix products: `torch._scaled_mm` as the CPU computes it.

The CPU (and this lowering) dequantises both operands to float32 with their scales (one per tensor, or
one per row of `self` and per column of `mat2`), multiplies in float32, adds the bias, divides by
`scale_result` for a float8 `out_dtype`, and converts to `out_dtype` (saturating to e4m3fn as conversions
do). `use_fast_accum` changes nothing here. The dequantise-then-dot form is the one XLA's GPU compiler
rewrites into an FP8 GEMM (not checked on a GPU yet).
"""
import jax.numpy as jnp
from jax import lax
import torch
from torch._prims_common.wrappers import _maybe_resize_out

from ..runtime.dtypes import FLOAT8, convert, scalar_type_name, to_jax, to_torch
from . import registry
from .registry import lower

aten = torch.ops.aten


def _scaling(a, b, scale_a, scale_b) -> str:
    """'tensorwise' or 'rowwise', or the CPU's ValueError for any other combination."""
    m, n = a.shape[0] if a.dim() else 1, b.shape[-1] if b.dim() else 1
    if a.dtype in FLOAT8 and b.dtype in FLOAT8 and scale_a.dtype == scale_b.dtype == torch.float32:
        if scale_a.numel() == 1 and scale_b.numel() == 1:
            return "tensorwise"
        if (tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (1, n)
                and scale_a.is_contiguous() and scale_b.is_contiguous()):
            return "rowwise"
    a_name, b_name, sa_name, sb_name = (scalar_type_name(t.dtype) for t in (a, b, scale_a, scale_b))
    raise ValueError(
        "Invalid scaling configuration.\n"
        "- For TensorWise scaling, a and b should be float8, scales should be float and singletons.\n"
        f"- For RowWise scaling, a and b should be float8, scales should be float, scale_a should be ({m}, 1) "
        f"and scale_b should be (1, {n}), and both should be contiguous.\n"
        f"Got mat_a.dtype()={a_name}, scale_a.dtype()={sa_name}, scale_a.size()={list(scale_a.shape)}, "
        f"scale_a.stride()={list(scale_a.stride())}, mat_b.dtype()={b_name}, scale_b.dtype()={sb_name}, "
        f"scale_b.size()={list(scale_b.shape)} and scale_b.stride()={list(scale_b.stride())}"
    )


def scaled_mm_meta(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
    """Output metadata, with the errors (type and order) of the CPU kernel: PyTorch's meta kernel checks
    what CUDA needs instead (a column-major `mat2`) and lets a mismatched inner size through."""
    scaling = _scaling(a, b, scale_a, scale_b)
    for name, t in (("mat1", a), ("mat2", b)):
        if t.dim() != 2:
            raise RuntimeError(f"{name} must be a matrix")
    if a.shape[1] != b.shape[0]:
        raise RuntimeError(
            f"mat_a and mat_b shapes cannot be multiplied ({a.shape[0]}x{a.shape[1]} and {b.shape[0]}x{b.shape[1]})"
        )
    if scaling == "rowwise":
        for name, scale in (("scale_a", scale_a), ("scale_b", scale_b)):
            if scale.stride(1) != 1:
                raise ValueError(f"expected {name}.stride(1) to be 1, but got {scale.stride(1)}")
    if bias is not None:
        if bias.numel() != b.shape[1]:
            raise RuntimeError(f"Bias must be size {b.shape[1]} but got {bias.numel()}")
        if bias.dtype in FLOAT8:
            raise RuntimeError("Promotion for Float8 Types is not supported, attempted to promote Float and "
                               f"{scalar_type_name(bias.dtype)}")
    return torch.empty((a.shape[0], b.shape[1]), dtype=out_dtype or a.dtype, device="meta")


def scaled_mm_out_meta(*args, out, **kwargs):
    """PyTorch has no meta kernel for the out= overload: `out` resized to the result, as the CPU does."""
    return _maybe_resize_out(out, scaled_mm_meta(*args, **kwargs).shape)


registry.META[aten._scaled_mm.out] = scaled_mm_out_meta


def _meta(x):
    return None if x is None else torch.empty(x.shape, dtype=to_torch(x.dtype), device="meta")


@lower(aten._scaled_mm, meta=scaled_mm_meta)
def scaled_mm(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
    # compiled graphs arrive checked by PyTorch's meta kernel only (CUDA's rules): check as the CPU does,
    # strides aside (a traced array has none), once per traced signature
    scaled_mm_meta(*map(_meta, (a, b, scale_a, scale_b, bias, scale_result)), out_dtype)
    result_dtype = to_jax(out_dtype) if out_dtype is not None else a.dtype
    a = a.astype(jnp.float32) * scale_a.reshape(-1, 1)  # a tensorwise scale broadcasts as one row's
    b = b.astype(jnp.float32) * scale_b.reshape(1, -1)
    out = jnp.matmul(a, b, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    if scale_result is not None and out_dtype in FLOAT8:  # the CPU ignores it unless out_dtype is given
        out = out * (1 / scale_result.astype(jnp.float32).reshape(()))
    return convert(out, result_dtype)
