"""`_foreach_*` ops: the per-tensor op's lowering mapped over the lists, all in one program.

Optimizers and clip_grad_norm_ call these for whole parameter lists; mapping the
per-tensor lowering keeps their numerics identical to the per-tensor path.
"""
import jax
import jax.numpy as jnp
import torch

from ..runtime.dtypes import to_jax
from . import checks
from .promotion import opmath
from .registry import STATIC_SCALAR_OPS, lower
from .rules import MissingLowering, lowering_for

aten = torch.ops.aten

# the per-tensor overloads tried, in order, for each foreach overload
_PER_TENSOR = {
    "default": ("default",),
    "List": ("Tensor", "default", "Tensor_Tensor"),
    "Scalar": ("Scalar", "default", "Tensor"),
    "ScalarList": ("Scalar", "default", "Tensor"),
    "Tensor": ("Tensor", "default"),
    "ScalarAndTensor": ("Scalar",),
}
_RENAMED = {"norm": "linalg_vector_norm"}


def _per_tensor_op(foreach_op):
    name = foreach_op._schema.name.split("::")[1][len("_foreach_"):]
    packet = getattr(aten, _RENAMED.get(name, name), None)
    if packet is None:
        return None
    return next(
        (getattr(packet, o) for o in _PER_TENSOR.get(foreach_op._overloadname, ()) if o in packet.overloads()), None
    )


def _is_per_element(argument) -> bool:
    """List arguments, and the 1-D `scalars` tensor of addcmul/addcdiv, give one entry per tensor."""
    return isinstance(argument.type, torch.ListType) or argument.name == "scalars"


def _mapped(foreach_op, per_tensor_op):
    per_element = [_is_per_element(a) for a in foreach_op._schema.arguments]
    schema = per_tensor_op._schema.arguments
    positional = sum(not a.kwarg_only for a in schema)
    keyword_names = [a.name for a in schema if a.kwarg_only]
    # what the per-tensor op takes by keyword goes by name where the foreach op has the name (norm's `dtype`,
    # after arguments norm's foreach has not); the rest by position, a foreach op's extra positional
    # arguments filling the other keywords in order (addcmul's `value` from `scalars`)
    by_name = [a.name if a.name in keyword_names else None for a in foreach_op._schema.arguments]
    unnamed_keywords = [name for name in keyword_names if name not in by_name]

    def lowering(*args, **kwargs):
        fn = lowering_for(per_tensor_op)
        if fn is None:
            raise MissingLowering(per_tensor_op)
        length = len(next(a for a, listed in zip(args, per_element) if listed and isinstance(a, (list, tuple))))
        traced = {}
        results = []
        for i in range(length):
            element = [a[i] if listed else a for a, listed in zip(args, per_element)]
            ordered = [value for value, name in zip(element, by_name) if name is None]
            named = {name: value for value, name in zip(element, by_name) if name is not None}
            named.update(zip(unnamed_keywords, ordered[positional:]), **kwargs)
            results.append(_once_per_signature(traced, fn, ordered[:positional], named))
        return results

    return lowering


# the arguments other than arrays a signature can name
_PLAIN = (bool, int, float, complex, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _once_per_signature(traced: dict, fn, args, kwargs):
    """fn(*args, **kwargs) as a call of a function traced once per signature (its arrays' shapes and dtypes and
    its other arguments, with their types) among a list's tensors: an optimizer's lists repeat a few shapes,
    and each per-tensor trace would cost as much as the first. Checks the trace makes are its outputs, made
    again outside."""
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    template = [_ARRAY if isinstance(leaf, jax.Array) else leaf for leaf in leaves]
    arrays = [leaf for leaf, kept in zip(leaves, template) if kept is _ARRAY]
    others = [leaf for leaf in template if leaf is not _ARRAY]
    if not all(isinstance(leaf, _PLAIN) for leaf in others):
        return fn(*args, **kwargs)
    # by type and repr: 1, 1.0 and True are equal keys, and so are 0.0 and -0.0
    signature = (tree, tuple((type(leaf), repr(leaf)) for leaf in others),
                 tuple((a.shape, a.dtype, a.weak_type) for a in arrays))
    if signature not in traced:
        traced[signature] = _traced(fn, template, tree)
    call, found = traced[signature]
    result, conditions = call(*arrays)
    checks.report((condition, error, message) for condition, (error, message) in zip(conditions, found))
    return result


_ARRAY = object()  # where an array goes among a call's leaves


def _traced(fn, template, tree):
    found = []  # (error type, message) of each check, filled when `call` is traced

    def body(*arrays):
        refill = iter(arrays)
        args, kwargs = jax.tree_util.tree_unflatten(tree, [next(refill) if leaf is _ARRAY else leaf
                                                           for leaf in template])
        if not checks.collected():
            return fn(*args, **kwargs), ()
        with checks.collecting() as conditions:
            result = fn(*args, **kwargs)
        found.extend((error, message) for _, error, message in conditions)
        return result, tuple(condition for condition, _, _ in conditions)

    body.__name__ = body.__qualname__ = getattr(fn, "__name__", "per_tensor")  # its name in the program's text
    return jax.jit(body), found


def foreach_powsum(tensors, ord=2, dtype=None):
    """sum(|x|^ord) of each tensor: the norm before its root, which DTensor adds over a sharded gradient's
    shards."""
    traced = {}
    return [_once_per_signature(traced, _powsum, (x, ord, dtype), {}) for x in tensors]


def _powsum(x, ord, dtype):
    v = jnp.abs(x.astype(to_jax(dtype)) if dtype is not None else x)
    # half precision sums its powers in float32, as the CPU's norms do
    wide = opmath(v)
    return jnp.sum(wide * wide if ord == 2 else wide**ord).astype(v.dtype)


if hasattr(aten, "_foreach_powsum"):  # PyTorch #172685: not in every release this package supports
    lower(aten._foreach_powsum.Scalar, static_scalars=True)(foreach_powsum)


def _register_all():
    names = {n[len("aten::"):].split(".")[0] for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")}
    for name in sorted(n for n in names if n.startswith("_foreach_") and not n.endswith("_")):
        for overload_name in getattr(aten, name).overloads():
            op = getattr(getattr(aten, name), overload_name)
            per_tensor = _per_tensor_op(op)
            if per_tensor is not None and len(per_tensor._schema.returns) == 1:
                lower(op, static_scalars=per_tensor in STATIC_SCALAR_OPS)(_mapped(op, per_tensor))


_register_all()
