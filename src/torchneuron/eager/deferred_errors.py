"""Errors raised by neuron ops while the autograd engine runs backward, re-raised from backward().

The engine runs a device's backward nodes on its own thread, inside a stream guard whose destructor
(PyTorch's Python-backend device guard) calls back into Python. A Python exception leaving
`__torch_dispatch__` there is still pending while that destructor runs, so the call fails inside a
noexcept destructor and the process aborts. So an op that raises during backward records its error and
returns placeholder outputs of the right metadata instead; the patched engine entry point
(patches.backward_reraises_device_errors) raises the first recorded error once the engine returns, as
the CPU would have raised it from backward().
"""
import threading

import torch
from torch.utils._pytree import tree_map

from ..runtime.tensor import NeuronTensor

_lock = threading.Lock()
_errors = []


def in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def defer(error: Exception, func, args, kwargs):
    """Record `error` (raised by `func` during backward) and return placeholders for its outputs."""
    with _lock:
        _errors.append(error)
    device = next((a.device for a in _leaves(args, kwargs) if isinstance(a, NeuronTensor)), None)
    try:
        meta_out = func(*tree_map(_to_meta, args), **tree_map(_to_meta, kwargs))
    except Exception:
        # the op's own checks rejected the arguments: any tensor lets the engine go on to report it
        return _placeholder_returns(func, device)
    return tree_map(lambda m: _on_device(m, device), meta_out)


def raise_first(cause: BaseException = None) -> None:
    """Raise the first error deferred since the last call (all are consumed)."""
    with _lock:
        errors = list(_errors)
        _errors.clear()
    if errors:
        raise errors[0] from cause


def _leaves(args, kwargs):
    for value in (*args, *kwargs.values()):
        yield from value if isinstance(value, (tuple, list)) else (value,)


def _to_meta(value):
    if isinstance(value, NeuronTensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    return value


def _on_device(value, device):
    if isinstance(value, torch.Tensor):
        return torch.zeros(value.shape, dtype=value.dtype, device=device)
    return value


def _placeholder_returns(func, device):
    placeholders = tuple(torch.zeros((), device=device) for _ in func._schema.returns)
    return placeholders[0] if len(placeholders) == 1 else placeholders
