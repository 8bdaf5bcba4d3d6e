"""Value checks inside device programs, reported at the next synchronisation (as CUDA's device asserts are).

A lowering that would silently clamp bad data (an index out of range) calls
`require(ok, error)` while it is traced. Eager programs return each condition
as an extra output; the runtime keeps them pending per device and raises the
PyTorch error at the next point that waits for the device (`.item()`,
`.cpu()`, `torch.neuron.synchronize()`), so no wrong answer is returned and
no op waits for the device just to check.
"""
import contextlib

import jax.numpy as jnp

_collectors = []


def require(ok, error_type: type, message: str) -> None:
    """`ok` (a traced boolean array) must hold everywhere, else `error_type(message)` is raised later."""
    if _collectors:
        _collectors[-1].append((jnp.all(ok), error_type, message))


@contextlib.contextmanager
def collecting():
    found = []
    _collectors.append(found)
    try:
        yield found
    finally:
        _collectors.pop()


def index_in_range(index, size: int, error_type=IndexError, message=None) -> None:
    require((index >= -size) & (index < size), error_type, message or "index out of range in self")
