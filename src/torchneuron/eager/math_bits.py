"""PyTorch's lazy conjugate and negative bits on neuron tensors.

`x.conj()` of a complex tensor, and `imag` of such a view, are views that flag a bit on the tensor instead of
computing: they alias `x`, so later writes to either show in both. PyTorch's Conjugate and Negative
fallbacks resolve a flagged input (through `clone`) before an op that does not know the bits. Only the ops
that fall through those keys see a flagged neuron tensor: views, whose results keep the bits; `clone` and
`copy_`, which apply them; and a few that CPU and CUDA kernels resolve themselves (matmuls, norms), whose
flagged inputs are resolved here.
"""
import torch

from ..native import _C as native
from ..ops import registry

aten = torch.ops.aten


# any of the tensors among some values flagged (other values are skipped): one native call, asked of every
# call of a compiled graph and of the ops that pass the bits through
any_flagged = native.any_flagged


def flagged(tensor) -> bool:
    # asked of every view's source: the native call costs a third of two tensor methods on a subclass
    return any_flagged((tensor,))


def set_bits(tensor, conj: bool, neg: bool) -> None:
    torch._C._set_conj(tensor, conj)
    torch._C._set_neg(tensor, neg)


def copy_bits(func, source, views) -> None:
    """Views of a flagged tensor are flagged alike, as PyTorch's own views are."""
    if not flagged(source):
        return
    if func is aten.view_as_real.default and source.is_conj():
        raise RuntimeError(
            "view_as_real doesn't work on unresolved conjugated tensors.  To resolve the conjugate tensor so you "
            "can view it as real, use self.resolve_conj(); however, be warned that the resulting tensor will NOT "
            "alias the original."
        )
    for view in views if isinstance(views, list) else [views]:
        set_bits(view, source.is_conj(), source.is_neg())


def lazy_bit_view(func, args, kwargs):
    """_conj and _neg_view: an alias with the bit flipped."""
    x = args[0]
    out = aten.alias.default(x)
    if func is aten._conj.default:
        torch._C._set_conj(out, not x.is_conj())
    else:
        torch._C._set_neg(out, not x.is_neg())
    return out


def _stored(tensor):
    """An alias of a flagged tensor with its bits cleared: the values its storage holds."""
    raw = aten.alias.default(tensor)
    set_bits(raw, False, False)
    return raw


def _apply_bits(values, conj: bool, neg: bool):
    if conj:
        values = aten._conj_physical.default(values)
    return aten.neg.default(values) if neg else values


def resolved(tensor):
    """The values a flagged tensor shows, as a new unflagged tensor (the tensor itself when unflagged)."""
    if not flagged(tensor):
        return tensor
    if tensor.device.type != "neuron":
        return tensor.resolve_conj().resolve_neg()
    return _apply_bits(_stored(tensor), tensor.is_conj(), tensor.is_neg())


def clone(inner):
    """clone resolves the bits, as on the CPU: a clone of x.conj() holds the conjugated values, unflagged."""
    def run(func, args, kwargs):
        if flagged(args[0]):
            args = (resolved(args[0]),) + tuple(args[1:])
        return inner(func, args, kwargs)
    return run


def copy_(inner):
    """Writing into a flagged view stores the values that the view shows as the ones written (conj and
    neg are their own inverses); a flagged source is written as the values it shows."""
    def run(func, args, kwargs):
        dst, src = args[0], args[1]
        if not (flagged(dst) or flagged(src)):
            return inner(func, args, kwargs)
        values = resolved(src)
        if flagged(dst):
            values = _apply_bits(values.to(dst.device), dst.is_conj(), dst.is_neg())
            inner(func, (_stored(dst), values) + tuple(args[2:]), kwargs)
            return dst
        return inner(func, (dst, values) + tuple(args[2:]), kwargs)
    return run


class Resolver:
    """Resolves the flagged tensors among an op's or a graph's inputs, each once (a tensor passed twice gets
    one copy), and writes the copies of those it wrote back through the bits."""

    def __init__(self):
        self.copies = {}

    def __call__(self, value):
        if not flagged(value):
            return value
        if id(value) not in self.copies:
            self.copies[id(value)] = (value, resolved(value))
        return self.copies[id(value)][1]

    def write_back(self, written: set) -> dict:
        """Writes each copy whose original's id is in `written` into that original; {id(copy): original}."""
        back = {}
        for original, copy in self.copies.values():
            if id(original) in written:
                original.copy_(copy)
                back[id(copy)] = original
        return back


def resolving(inner):
    """For the other ops that pass the bits through (matmuls, norms): flagged inputs are resolved, and a
    flagged tensor the op writes (addmm_'s self, an out=) is computed into a resolved copy, then written back."""
    def run(func, args, kwargs):
        if not _any_flagged(args, kwargs):
            return inner(func, args, kwargs)
        resolve = Resolver()
        out = inner(func, tuple(map(resolve, args)), {k: resolve(v) for k, v in kwargs.items()})
        back = resolve.write_back({id(t) for t in registry.flatten(registry.written_arguments(func, args, kwargs))})
        if isinstance(out, (tuple, list)):
            return type(out)(back.get(id(o), o) for o in out)
        return back.get(id(out), out)
    return run


def _any_flagged(args, kwargs) -> bool:
    # on every call of the ops it wraps (mm among them)
    return any_flagged(args) or (bool(kwargs) and any_flagged(kwargs.values()))


# their results do not depend on the bits: neg and conj commute with negation and conjugation
_BIT_BLIND = {aten.neg_.default, aten.conj_physical_.default}


def wrap_handler(func, handler, computes: bool):
    """The handler that keeps the bits' meaning for `func` (views copy them in views.py)."""
    if func in (aten._conj.default, aten._neg_view.default):
        return lazy_bit_view
    if func is aten.clone.default:
        return clone(handler)
    if func is aten.copy_.default:
        return copy_(handler)
    if computes and func not in _BIT_BLIND and not func.__name__.startswith("empty") and passes_bits(func):
        return resolving(handler)
    return handler


def passes_bits(func) -> bool:
    """Whether PyTorch's Conjugate or Negative key lets `func` reach the backend with flagged tensors."""
    for key in (torch._C.DispatchKey.Conjugate, torch._C.DispatchKey.Negative):
        try:
            if torch._C._dispatch_kernel_for_dispatch_key_is_fallthrough(func.name(), key):
                return True
        except RuntimeError:  # no kernel: the fallback resolves the bits first
            continue
    return False
