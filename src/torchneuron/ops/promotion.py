"""PyTorch's type promotion, applied at trace time to JAX values."""
import jax
import jax.numpy as jnp
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from ..runtime.dtypes import FLOAT8, convert, to_jax, to_torch

DEFAULT = ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
INT_TO_FLOAT = ELEMENTWISE_TYPE_PROMOTION_KIND.INT_TO_FLOAT
ALWAYS_BOOL = ELEMENTWISE_TYPE_PROMOTION_KIND.ALWAYS_BOOL
COMPLEX_TO_FLOAT = ELEMENTWISE_TYPE_PROMOTION_KIND.COMPLEX_TO_FLOAT
NO_OPMATH = ELEMENTWISE_TYPE_PROMOTION_KIND.NO_OPMATH
BOOL_TO_LONG = ELEMENTWISE_TYPE_PROMOTION_KIND.BOOL_TO_LONG


def is_array(value) -> bool:
    return isinstance(value, (jax.Array, jax.core.Tracer))


def _is_python_scalar(value) -> bool:
    """Dynamic Python scalars arrive as weakly typed 0-d values and promote like Python numbers."""
    return is_array(value) and value.ndim == 0 and getattr(jax.typeof(value), "weak_type", False)


def _example(value):
    if _is_python_scalar(value):
        kind = jnp.dtype(value.dtype).kind
        return {"b": True, "i": 1, "u": 1, "f": 1.0, "c": 1j}[kind]
    if is_array(value):
        return torch.empty(value.shape, dtype=to_torch(value.dtype), device="meta")
    return value


def dtypes(*values, kind=DEFAULT):
    """(computation dtype, result dtype) as JAX dtypes, by PyTorch's rules."""
    examples = [_example(v) for v in values if v is not None]
    compute, result = elementwise_dtypes(*examples, type_promotion_kind=kind)
    if compute in FLOAT8:
        # the CPU computes float8 in float32 and rounds the result with saturation; XLA's float8 arithmetic
        # overflows e4m3fn to nan. The runtime converts float32 results to the op's dtype, saturating.
        return jnp.float32, jnp.float32 if result in FLOAT8 else to_jax(result)
    return to_jax(compute), to_jax(result)


def cast(value, dtype):
    if is_array(value):
        return convert(value, dtype) if value.dtype != dtype else value
    return jnp.asarray(value, dtype=dtype)


def promote(*values, kind=DEFAULT):
    """The values cast to their computation dtype, and the result dtype."""
    compute, result = dtypes(*values, kind=kind)
    return [None if v is None else cast(v, compute) for v in values], result


def elementwise(fn, kind=DEFAULT):
    """Lift `fn` of arrays in the computation dtype to a lowering with PyTorch's promotion."""

    def lowering(*values):
        cast_values, result = promote(*values, kind=kind)
        return fn(*cast_values).astype(result)

    lowering.__name__ = getattr(fn, "__name__", "elementwise")
    return lowering


# the C++ types' names (caffe2::TypeMeta, as GCC spells them) that messages printing `tensor.dtype()` give
_TYPE_META_NAMES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16",
    torch.int64: "long int", torch.int32: "int", torch.int16: "short int", torch.int8: "signed char",
    torch.uint8: "unsigned char", torch.bool: "bool", torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
}


def type_meta_name(dtype) -> str:
    """A dtype as PyTorch's C++ messages print `tensor.dtype()` ("float", "long int")."""
    return _TYPE_META_NAMES.get(dtype, str(dtype))


def torch_dtype(value) -> torch.dtype:
    return to_torch(value.dtype)


def opmath(x):
    """Half-precision values widened to float32 for arithmetic, as PyTorch's CPU and CUDA kernels compute them."""
    return x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x


def accumulation_type(x):
    """The type products (matmuls, convolutions) of `x` accumulate in, for `preferred_element_type`: float32
    for half-precision inputs, as PyTorch's CPU and CUDA kernels accumulate; None keeps the input's."""
    return jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else None
