"""The dtypes an op's out= tensors may have: what its CPU kernel accepts.

Meta kernels accept any out dtype the result can be cast to safely; CPU kernels
differ per op (`neg` wants exactly its input's dtype, `add` any safe cast,
`nonzero` exactly int64), and a wrong one must raise, not return a result of
another dtype. The CPU kernel itself is asked, on zeros of the same shapes, and
only when an out dtype differs from the functional result's: correct code never
pays for it, and each signature asks once (its executable is then cached).
"""
import warnings

import torch
from ..ops import registry
from . import fallback


def outs(func, kwargs) -> list:
    """The out= tensors, in the order the functional variant returns their values."""
    return [o for name in registry.out_arguments(func) for o in _tensors(kwargs[name])]


def check(func, args, kwargs, result_dtypes) -> None:
    """Raise the CPU kernel's error if it refuses out= tensors of these dtypes for results of `result_dtypes`."""
    out_tensors = outs(func, kwargs)
    if len(out_tensors) != len(result_dtypes) or all(o.dtype == d for o, d in zip(out_tensors, result_dtypes)):
        return
    try:
        _on_cpu(func, args, kwargs, {})
    except RuntimeError as refused:
        try:
            _on_cpu(func, args, kwargs, {id(o): d for o, d in zip(out_tensors, result_dtypes)})
        except Exception:
            return  # zeros are no valid input to this op: the trial says nothing about dtypes
        raise RuntimeError(str(refused)) from None


def check_with_meta(func, target, args, kwargs) -> None:
    """`check`, the result dtypes from the functional variant's meta kernel (meta tensor arguments)."""
    names = set(registry.out_arguments(func))
    try:
        results = registry.META.get(target, target)(*args, **{k: v for k, v in kwargs.items() if k not in names})
    except Exception:
        return  # the out= overload's own meta kernel reports bad input
    check(func, args, kwargs, [r.dtype for r in _tensors(results)])


def _tensors(value) -> list:
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return [value] if isinstance(value, torch.Tensor) else []


def _on_cpu(func, args, kwargs, out_dtypes: dict) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an out= resize warns; the real call does that
        fallback.on_cpu_zeros(func, args, kwargs, out_dtypes)
