"""`_foreach_*` ops: the per-tensor op's lowering mapped over the lists, all in one program.

Optimizers and clip_grad_norm_ call these for whole parameter lists; mapping the
per-tensor lowering keeps their numerics identical to the per-tensor path.
"""
import torch

from .registry import STATIC_SCALAR_OPS, lower
from .rules import MissingLowering, lowering_for

aten = torch.ops.aten

# the per-tensor overloads tried, in order, for each foreach overload
_PER_TENSOR = {
    "default": ("default",),
    "List": ("Tensor", "default"),
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
    # a foreach op passes positionally what the per-tensor op may take by keyword (addcmul's `value`)
    keyword_names = [a.name for a in schema if a.kwarg_only]

    def lowering(*args, **kwargs):
        fn = lowering_for(per_tensor_op)
        if fn is None:
            raise MissingLowering(per_tensor_op)
        length = len(next(a for a, listed in zip(args, per_element) if listed and isinstance(a, (list, tuple))))
        results = []
        for i in range(length):
            element = [a[i] if listed else a for a, listed in zip(args, per_element)]
            named = dict(zip(keyword_names, element[positional:]), **kwargs)
            results.append(fn(*element[:positional], **named))
        return results

    return lowering


def _register_all():
    names = {n[len("aten::"):].split(".")[0] for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")}
    for name in sorted(n for n in names if n.startswith("_foreach_") and not n.endswith("_")):
        for overload_name in getattr(aten, name).overloads():
            op = getattr(getattr(aten, name), overload_name)
            per_tensor = _per_tensor_op(op)
            if per_tensor is not None and len(per_tensor._schema.returns) == 1:
                lower(op, static_scalars=per_tensor in STATIC_SCALAR_OPS)(_mapped(op, per_tensor))


_register_all()
