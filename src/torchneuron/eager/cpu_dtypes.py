"""Dtypes PyTorch's CPU kernels refuse are refused on neuron too, with the CPU's error.

XLA computes in nearly every dtype: it orders complex numbers, multiplies bool matrices, takes the softmax
of integers. PyTorch's CPU (and CUDA) kernels refuse many such calls, and an answer where PyTorch raises
is a silent wrong result. Whether the CPU refuses a call is asked of its kernel itself, on zeros, when the
call's executable is built (once per signature). Only calls with bool, integer or complex inputs are asked
about (the dtypes whose support differs between kernels), matrix products mixing floating dtypes
(float32 against float64: the meta kernels of these take it, CPU and CUDA kernels refuse it; asked on empty
tensors where zeros of their sizes would be large), and the kernels of integers alone (gcd, lcm). Other CPU
kernels refuse mixtures CUDA's take (FSDP2's bfloat16 gradients against float32 parameters), so only these
are asked.

Code written for accelerators relies on what CUDA's kernels take, so neuron takes it too where CUDA's
kernel takes more than the CPU's: float8 and complex32 (computed in complex64, as CUDA does) are never
asked about, nor are the few ops OpInfo lists with more bool, integer or complex dtypes on CUDA.
"""
import re
import warnings

import torch
from torch.utils._pytree import tree_leaves

from ..runtime.dtypes import FLOAT8
from . import fallback

# what the CPU's dtype refusals say (AT_DISPATCH's "not implemented for 'Bool'", the kernels' own checks);
# other errors on zeros are about the values, which are not the caller's
_DTYPE_REFUSAL = re.compile(r"not implemented for '|complex|bool|integ|floating|dtype|scalar type|can't be cast",
                            re.IGNORECASE)


# OpInfo's dtypesIfCUDA beyond its CPU dtypes, by op (Hugging Face's Mixtral counts tokens per expert with an
# int32 histc off the CPU)
_CUDA_TAKES_MORE = {
    torch.ops.aten.histc: lambda dtype: not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool),
    torch.ops.aten.abs: lambda dtype: dtype == torch.bool,
    torch.ops.aten.trace: lambda dtype: dtype == torch.bool,
    torch.ops.aten.nansum: lambda dtype: dtype.is_complex,
}
_NEVER_ASKED = (*FLOAT8, torch.complex32)
_MIXED_FLOATS_ASKED = {torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.mv, torch.ops.aten.addmv,
                       torch.ops.aten.addbmm}
# kernels of integers alone, asked about floating inputs too
_INTEGERS_ONLY = {torch.ops.aten.gcd, torch.ops.aten.gcd_, torch.ops.aten.lcm, torch.ops.aten.lcm_}
_accepted = set()


def _dtypes(func, args, kwargs) -> tuple:
    """The tensors' dtypes, the dtypes given, and bool for a Python bool given as an operand (`x - True` is
    refused as `x - mask` is; a flag such as keepdim is none)."""
    dtypes = tuple(v.dtype if isinstance(v, torch.Tensor) else v for v in tree_leaves((args, kwargs))
                   if isinstance(v, (torch.Tensor, torch.dtype)))
    return dtypes + (torch.bool,) if _bool_scalar(func, args, kwargs) else dtypes


def _bool_scalar(func, args, kwargs) -> bool:
    schema = getattr(func, "_schema", None)
    if schema is None:
        return False
    given = [*zip(schema.arguments, args), *((a, kwargs[a.name]) for a in schema.arguments if a.name in kwargs)]
    # a Python number where a Tensor is declared is a wrapped scalar (`x - True` reaches sub.Tensor)
    return any(type(value) is bool and isinstance(argument.type, (torch.NumberType, torch.TensorType))
               for argument, value in given)


def _tensor_dtypes(args, kwargs) -> list:
    return [v.dtype for v in tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]


def refusal(func, args, kwargs):
    """The CPU kernel's error if it refuses the dtypes of these (meta) arguments, else None."""
    dtypes = _dtypes(func, args, kwargs)
    cuda_takes = _CUDA_TAKES_MORE.get(func.overloadpacket)
    mixed_floats = (func.overloadpacket in _MIXED_FLOATS_ASKED
                    and len({d for d in _tensor_dtypes(args, kwargs) if d.is_floating_point}) > 1)
    floats_asked = mixed_floats or func.overloadpacket in _INTEGERS_ONLY
    if (func.namespace != "aten" or (all(d.is_floating_point for d in dtypes) and not floats_asked)
            or any(d in _NEVER_ASKED for d in dtypes) or (cuda_takes is not None and cuda_takes(dtypes[0]))):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the call's own warnings come from its own run
        error = fallback.cpu_error(func, args, kwargs, empty_when_large=mixed_floats)
    message = str(error)
    return error if error is not None and _DTYPE_REFUSAL.search(message) else None


def check(func, args, kwargs) -> None:
    error = refusal(func, args, kwargs)
    if error is not None:
        raise error


def check_once_per_dtypes(func, args, kwargs) -> None:
    """`check` before a cached executable's key (data-dependent ops, which have none; out= sums before their
    `dtype` is filled in): asked once per op and dtypes, not on every call, once the CPU accepted them."""
    key = (func, _dtypes(func, args, kwargs))
    if key not in _accepted:
        check(func, args, kwargs)
        _accepted.add(key)
