"""Value checks inside device programs, reported at the next synchronisation (as CUDA's device asserts are).

A lowering that would silently clamp bad data (an index out of range) calls
`require(ok, error)` while it is traced. Eager programs and compiled graphs' programs return each
condition as an extra output; the runtime keeps them pending per device and raises the
PyTorch error at the next point that waits for the device (`.item()`,
`.cpu()`, `torch.neuron.synchronize()`), so no wrong answer is returned and
no op waits for the device just to check. `TORCHNEURON_LAUNCH_BLOCKING=1`
reads each op's conditions at once instead (as CUDA_LAUNCH_BLOCKING=1 does),
so the error points at the op that failed.
"""
import contextlib
import math

import jax.numpy as jnp
import torch

from .registry import lower

_collectors = []


def require(ok, error_type: type, message: str, culprit=None) -> None:
    """`ok` (a traced boolean array) must hold everywhere, else `error_type(message)` is raised later.

    With `culprit` (an integer array `ok` broadcasts to, or a tuple of them), `message`'s `{}` fields
    become their values where `ok` first fails, as the CPU's messages name the bad value (and the batch
    element it is in).
    """
    if not _collectors:
        return
    condition = jnp.all(ok)
    if culprit is not None:
        culprits = culprit if isinstance(culprit, tuple) else (culprit,)
        shape = jnp.broadcast_shapes(jnp.shape(ok), *(c.shape for c in culprits))
        values = [0] * len(culprits)
        if math.prod(shape):
            first = jnp.argmax(~jnp.broadcast_to(ok, shape).reshape(-1))
            values = [jnp.broadcast_to(c, shape).reshape(-1)[first] for c in culprits]
        condition = jnp.stack([condition.astype(jnp.int64), *(jnp.asarray(v, jnp.int64) for v in values)])
    _collectors[-1].append((condition, error_type, message))


@contextlib.contextmanager
def collecting():
    found = []
    _collectors.append(found)
    try:
        yield found
    finally:
        _collectors.pop()


@contextlib.contextmanager
def unchecked():
    """For code whose checks are dropped: a while loop's predicate as lax's loop condition runs it (which
    returns the predicate alone; `control_flow.while_loop` makes its checks again in the body) and the replay
    of flex attention's score_mod under jax.vjp (the forward checked it). Yields an empty list, as `collecting`
    yields the conditions it found. Control flow and vmap return theirs as values (`report`, `held`,
    `first_failure`, `over_all`)."""
    with collecting():
        yield []


def collected() -> bool:
    """Whether the program being traced keeps its checks (eager's and compiled graphs' do)."""
    return bool(_collectors)


def report(conditions) -> None:
    """Conditions an inner trace returned as values (a cond's branches, a loop's body), each with its
    `(condition, error_type, message)` as `collecting` found them there, for the enclosing program."""
    if _collectors:
        _collectors[-1].extend(conditions)


def held(condition):
    """A value of `condition`'s shape and dtype saying the check held: where an inner trace that did not
    run the check (the other branch of a cond) must give one, and a loop starts from."""
    return jnp.ones((), condition.dtype) if condition.ndim == 0 else jnp.zeros_like(condition).at[0].set(1)


def first_failure(earlier, later):
    """Of a check made again (each iteration of a loop), the earlier failure, else the later result."""
    return earlier & later if earlier.ndim == 0 else jnp.where(earlier[0] == 1, later, earlier)


def over_all(conditions, batch_ndim: int):
    """A check made at each point of a grid (its `batch_ndim` leading axes, vmap's) as one condition: held
    everywhere, else the first failure."""
    if conditions.ndim == batch_ndim:
        return jnp.all(conditions)
    rows = conditions.reshape(-1, conditions.shape[-1])
    return rows[jnp.argmin(rows[:, 0])]


def index_in_range(index, size: int, error_type=IndexError, message="index out of range in self", negative=True):
    """`index` addresses one of `size` elements; counted from the end too where the op allows `negative`."""
    low = -size if negative else 0
    require((index >= low) & (index < size), error_type, message, culprit=index)


@lower(torch.ops.aten._assert_async)
def _assert_async(x, assert_msg="Expected Tensor with single nonzero value, but got zero"):
    """TorchTitan's rotary embedding asserts on device values with this; like CUDA, no op waits for it."""
    require(x != 0, RuntimeError, assert_msg)
    return ()
