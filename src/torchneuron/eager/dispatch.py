"""Op-by-op eager dispatch: every ATen call on neuron tensors arrives here and goes to its handler.

An op with a lowering runs as a cached storage program (executable.py); views, storage changes and
transfers have handlers of their own (views.py, handlers.py); an op with neither runs on the CPU
(fallback.py). The handler is chosen once per op overload, from the op's rule.
"""
import torch

from ..ops import rules
from ..runtime import events
from ..runtime import tensor as neuron_tensor
from . import fallback, handlers, math_bits, views
from . import sparse, sparse_compressed  # noqa: F401  (registration side effects: the handlers making sparse tensors)
from .executable import Compute

_HANDLERS = {}


def dispatch(func, args, kwargs):
    handler = _HANDLERS.get(func)
    if handler is None:
        chosen = _choose_handler(func)
        if handlers.makes_on_requested_device(func):
            chosen = handlers.on_requested_device(chosen, func)
        handler = _HANDLERS[func] = math_bits.wrap_handler(func, chosen, isinstance(chosen, Compute))
    if events.listening:
        return events.op(func, handler, args, kwargs)
    return handler(func, args, kwargs)


def _returns_view(func) -> bool:
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


def _decompose(func, args, kwargs):
    return func.decompose(*args, **kwargs)


def forget_choices() -> None:
    """After the lowering table changed (torchneuron.library)."""
    _HANDLERS.clear()


def _choose_handler(func):
    rule = rules.rule(func)
    if rule.cpu_forced:
        return fallback.run_on_cpu
    if func in handlers.HANDLERS:
        return handlers.HANDLERS[func]
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        # below autograd these arrive undecomposed; their decomposition calls ops we handle
        return _decompose
    if rule.dynamic_shape:
        return handlers.data_dependent
    if torch.Tag.inplace_view in func.tags:
        return views.inplace_view
    if func in views.ALIAS_OPS:
        return views.alias
    if (_returns_view(func) or func is torch.ops.aten._unsafe_view.default) and not rule.mutated:
        # _unsafe_view does alias its input (only autograd's view tracking is skipped): kron's out= writes through it
        return views.view
    if rule.lowering is not None:
        return Compute(rule)
    if func.namespace not in ("aten", "prims") and any(
        torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key) for key in _CUSTOM_KERNEL_KEYS
    ):
        # a custom op with a kernel for neuron (torch.library.impl(..., "PrivateUse1") as FSDP2's fsdp.* ops,
        # register_kernel("neuron")) or for every device (custom_op without device_types): its PyTorch code
        # runs on neuron tensors, each op it calls dispatched here in turn
        return handlers.run_device_generic_kernel
    return fallback.run_on_cpu


_CUSTOM_KERNEL_KEYS = ("PrivateUse1", "CompositeExplicitAutograd")


neuron_tensor.bind_dispatch(dispatch)
