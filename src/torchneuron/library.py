"""Extending the backend: JAX lowerings for any op, custom ops included.

    @torch.library.custom_op("mylib::scaled_tanh", mutates_args=())
    def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor: ...

    @torchneuron.library.lowering(torch.ops.mylib.scaled_tanh.default)
    def _(x, scale):                      # JAX arrays in, JAX arrays out
        return jnp.tanh(x) * scale

The lowering is used by eager dispatch, adaptive eager and torch.compile (where the op stays one node of
the graph's XLA program). Output metadata comes from the op's fake kernel (`register_fake`), or from
`meta=` for an op that has none. Autograd is the op's own (`register_autograd`): its backward runs on
neuron like any PyTorch code. See docs/extending.md.
"""
import inspect

import torch

from .ops import registry

__all__ = ["lowering", "force_cpu", "cpu_forced"]


def lowering(op, *, random: bool = False, static_scalars: bool = False, meta=None):
    """Register the decorated function of JAX arrays as the lowering of `op` (a functional `OpOverload`).

    `random=True`: the function takes a JAX PRNG key as its first argument, before the op's own, drawn
    from the device generator (so `torch.manual_seed` reproduces it). Float arguments arrive as traced
    scalars (a new value does not recompile) unless `static_scalars=True`. `meta(*args, **kwargs)`
    gives output metadata for an op without a fake kernel; it is registered with PyTorch as one.
    """
    if not isinstance(op, torch._ops.OpOverload):
        raise TypeError(f"lowering() expects an OpOverload such as torch.ops.mylib.f.default, got {op!r}")
    if registry.is_mutating(op):
        raise NotImplementedError(
            f"lowering(): {op} mutates its arguments; lower a functional op (mutates_args=()) and write "
            "results in PyTorch code around it"
        )

    def register(fn):
        here = _place(fn)
        existing = registry.LOWERINGS.get(op)
        if existing is not None:
            raise RuntimeError(f"{op} already has a lowering, registered at {_place(existing)}; "
                               f"a second one was given at {here}")
        if meta is not None:
            torch.library.register_fake(op, meta)
        registry.lower(op, random=random, static_scalars=static_scalars)(fn)
        registry.CHECKED_OUTPUTS.add(op)
        _forget_choices()
        return fn

    return register


def force_cpu(op, enabled: bool = True) -> None:
    """Run `op` on the CPU (copying its inputs there and its outputs back) instead of its lowering.

    For debugging a lowering against the op's CPU kernel. Eager and adaptive eager follow at once;
    torch.compile follows for graphs compiled afterwards (`torch._dynamo.reset()` recompiles).
    """
    if not isinstance(op, torch._ops.OpOverload):
        raise TypeError(f"force_cpu() expects an OpOverload such as torch.ops.mylib.f.default, got {op!r}")
    if enabled:
        registry.CPU_FORCED.add(op)
    else:
        registry.CPU_FORCED.discard(op)
    _forget_choices()


def cpu_forced() -> list:
    """The ops `force_cpu` currently sends to the CPU."""
    return sorted(registry.CPU_FORCED, key=str)


def _place(fn) -> str:
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else repr(fn)


def _forget_choices() -> None:
    """Handlers, decompositions and executables chosen before the table changed (changes are rare)."""
    from .compile import backend
    from .eager import dispatch
    from .ops import rules
    from .runtime.cache import eager_cache

    dispatch.forget_choices()
    rules.forget()
    backend.decompositions.cache_clear()
    eager_cache.clear()
