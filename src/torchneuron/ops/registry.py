"""The lowering registry.

A lowering is a plain function of JAX arrays and the op's other arguments, for
the op's *functional* overload; in-place and out= overloads are derived from
it by the dispatcher. Ops with no lowering are tried through PyTorch's own
decompositions (traced into the same JAX program) before falling back.
"""
from typing import NamedTuple

import torch

from .. import patches
from ..runtime.dtypes import not_implemented_for

LOWERINGS: dict = {}
RANDOM_OPS: set = set()
STATIC_SCALAR_OPS: set = set()
DYNAMIC_SHAPE_OPS: set = set()
# output metadata for ops whose PyTorch meta kernel is stricter than its CPU kernel
META: dict = {}
# ops with lowerings from torchneuron.library: their outputs are checked against the fake kernel's
CHECKED_OUTPUTS: set = set()
# ops torchneuron.library.force_cpu sends to the CPU fallback
CPU_FORCED: set = set()


class Prefix(NamedTuple):
    """What a `dynamic_shape` lowering may return in place of an array: the first `length` rows of `padded`,
    whose rows have `row_shape`, flat. Computed at a size fixed by the input, a data-dependent result is one
    program per input signature; cut to its length exactly, it would be one per length (XLA's shapes are
    static), and the length changes with the data at every call."""
    padded: object
    length: int
    row_shape: tuple = ()


def rows_kept(length: int) -> int:
    """The rows a Prefix of `length` rows keeps: a power of two (at most twice the result, and a few
    sizes of program for all lengths)."""
    return 1 << (length - 1).bit_length() if length else 0


def _overloads(op):
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    return [op]


def lower(*ops, random: bool = False, static_scalars: bool = False, dynamic_shape: bool = False, meta=None):
    """Register `fn` as the lowering of each op (an overload, or every functional overload of a packet).

    Random lowerings take a JAX PRNG key drawn from the device generator as their first argument,
    before the op's own: positional, so it cannot collide with an op argument of any name.
    Float arguments arrive as traced scalars (so new values do not recompile) unless
    `static_scalars` asks for Python numbers, for lowerings that shape their output by them.
    `dynamic_shape` lowerings (nonzero, masked_select...) have data-dependent output shapes:
    eager runs them on concrete arrays, outside any compiled program, and they may return a `Prefix`.
    `meta` replaces PyTorch's meta kernel where that one rejects inputs the CPU kernel accepts.
    """

    def register(fn):
        for op in ops:
            for overload in _overloads(op):
                if isinstance(op, torch._ops.OpOverloadPacket) and is_mutating(overload):
                    continue
                LOWERINGS[overload] = fn
                if random:
                    RANDOM_OPS.add(overload)
                if static_scalars:
                    STATIC_SCALAR_OPS.add(overload)
                if dynamic_shape:
                    DYNAMIC_SHAPE_OPS.add(overload)
                if meta is not None:
                    META[overload] = meta
        return fn

    return register


class OutputMismatch(RuntimeError):
    pass


def check_outputs(op, values, metas) -> None:
    """Raise if a library lowering's outputs disagree with the op's fake kernel (shape or dtype), which
    the runtime would otherwise silently broadcast or cast to."""
    if op not in CHECKED_OUTPUTS:
        return
    import numpy as np

    from ..runtime.dtypes import to_jax

    got = [(tuple(v.shape), np.dtype(v.dtype)) for v in flatten(values) if hasattr(v, "shape")]
    # symbolic sizes (compiled with dynamic shapes) match any size
    wanted = [(tuple(d if type(d) is int else None for d in m.shape), np.dtype(to_jax(m.dtype)))
              for m in flatten(metas) if isinstance(m, torch.Tensor)]
    if len(got) != len(wanted) or not all(_agrees(g, w) for g, w in zip(got, wanted)):
        raise OutputMismatch(
            f"the lowering of {op} returned ({_describe(got)}) but the op's fake kernel says "
            f"({_describe(wanted)}): fix the lowering or the fake kernel"
        )


def _describe(outputs) -> str:
    return ", ".join(f"{list(shape)} {dtype}" for shape, dtype in outputs)


def _agrees(got, wanted) -> bool:
    (shape, dtype), (meta_shape, meta_dtype) = got, wanted
    return dtype == meta_dtype and len(shape) == len(meta_shape) and all(
        m is None or s == m for s, m in zip(shape, meta_shape))


def flatten(value) -> list:
    """The leaves of nested tuples and lists (an op's results), in order."""
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in flatten(v)]
    return [value]


def checked_meta(check, op):
    """A meta function that first raises the error PyTorch's CPU kernel raises and its meta kernel does not,
    then runs `op` (the op, whose meta kernel runs, or a meta function of its own)."""

    def meta(*args, **kwargs):
        check(*args, **kwargs)
        return op(*args, **kwargs)

    meta.check = check  # for compiled graphs, whose fake tensors ran PyTorch's meta kernel alone
    return meta


def meta_casting_into_out(functional):
    """The meta function of an out= overload whose CPU kernel casts `functional`'s result into its out tensor,
    where PyTorch's reference kernel wants the result's own dtype: the out tensor, resized to the result's
    shape. Which out dtypes the CPU accepts is its kernel's to say (eager/out_dtypes.py asks it)."""

    def meta(*args, out, **kwargs):
        return torch._refs._maybe_resize_out(out, functional(*args, **kwargs).shape)

    return meta


def floating_only(kernel: str):
    """A check for `checked_meta`: the CPU kernel `kernel` (as PyTorch names it) takes floating-point input only,
    refused by its dtype dispatch, which the CPU reaches only with work to do (no segments, a large sample)."""

    def check(x, *args, **kwargs):
        if not x.is_floating_point():
            raise not_implemented_for(kernel, x.dtype)

    return check


def argument_check(op):
    """The CPU-error check `checked_meta` gave `op`'s meta function, or None."""
    return getattr(META.get(op), "check", None)


def meta_kernel(*ops):
    """Register `fn` as the Meta kernel of ops that PyTorch (some release of it) gives none, where it has none:
    neuron's eager dispatch and torch.compile's fake tensors make the ops' output metadata by it
    (patches.meta_kernel_where_pytorch_has_none). It must make metadata alone, never call the op."""

    def register(fn):
        for op in ops:
            patches.meta_kernel_where_pytorch_has_none(op, fn)
        return fn

    return register


def meta_like_input(grad, x, *args, **kwargs):
    """Output metadata of a backward op PyTorch gives no meta kernel: the gradient of its input `x`."""
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def is_random(op) -> bool:
    """Random ops take a PRNG key first: PyTorch tags them nondeterministic_seeded."""
    return op in RANDOM_OPS or torch.Tag.nondeterministic_seeded in op.tags


def is_mutating(op) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)


def is_out(op) -> bool:
    """out= overloads write to keyword-only arguments; in-place ones to `self`."""
    return bool(out_arguments(op))


def out_arguments(op) -> list:
    """The names of the keyword-only arguments `op` writes (its out= tensors), in schema order."""
    return [a.name for a in op._schema.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]


def mutated_arguments(op) -> list:
    return [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def written_arguments(op, args, kwargs) -> list:
    """The values given for the arguments `op` writes, in `mutated_arguments` order (None where not given)."""
    positions = {a.name: i for i, a in enumerate(op._schema.arguments)}
    return [kwargs[name] if name in kwargs else args[positions[name]] if positions[name] < len(args) else None
            for name in mutated_arguments(op)]


def _signature_without(op, skip) -> tuple:
    return tuple((a.name, str(a.type)) for a in op._schema.arguments if a.name not in skip)


_FUNCTIONAL = {}


def functional_variant(op):
    """The functional overload computing what a mutating op writes (None when there is none).

    Its outputs are the mutating op's fresh (non-aliasing) returns followed by the
    new values of the mutated arguments, the convention of PyTorch's functionalization.
    """
    if op in _FUNCTIONAL:
        return _FUNCTIONAL[op]
    out = is_out(op)
    # an out= overload that also updates positional arguments (running statistics) has no functional variant
    # by signature: the overload without those arguments computes something else
    wanted = _signature_without(op, set(out_arguments(op)))
    name = op._schema.name.split("::")[1]
    if out:
        candidates = [name]
    elif name.endswith("_"):
        candidates = [name[:-1], name[:-1] + "_functional"]
    else:
        candidates = [name + "_functional"]
    _FUNCTIONAL[op] = next(
        (
            overload
            for candidate in candidates
            if hasattr(torch.ops.aten, candidate)
            for overload in _overloads(getattr(torch.ops.aten, candidate))
            if not is_mutating(overload) and _matches(overload, wanted)
        ),
        None,
    )
    return _FUNCTIONAL[op]


def _matches(candidate, wanted) -> bool:
    """Same arguments, allowing the candidate extra keyword-only ones with defaults (dtype=, device=)."""
    wanted = set(wanted)
    for a in candidate._schema.arguments:
        if (a.name, str(a.type)) in wanted:
            wanted.discard((a.name, str(a.type)))
        elif not (a.kwarg_only and a.has_default_value()):
            return False
    return not wanted
