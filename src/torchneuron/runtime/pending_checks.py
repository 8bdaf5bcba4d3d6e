"""Device-side value checks waiting to be read (see ops/checks.py), raised at synchronisation points."""
import collections
import os
import threading

import numpy as np

from .storage import Pending

# beyond this many unread checks on a device, reading them costs less than keeping them
LIMIT = 1024
# each op's checks read as it is launched: errors name the failing op's call site (a debugging aid)
BLOCKING = os.environ.get("TORCHNEURON_LAUNCH_BLOCKING", "0") == "1"
_pending = collections.defaultdict(list)
# a thread reading a device's checks takes them out and puts back the unread ones: a check another thread's op
# added in between was dropped (an error never raised)
_lock = threading.Lock()


def add(device_index: int, op, conditions, errors) -> None:
    """`conditions`: the op's check results, arrays or (queued by adaptive eager) Pending buffers."""
    with _lock:
        queue = _pending[device_index]
        queue.append((op, conditions, errors))
    if BLOCKING:
        raise_failures(device_index)
    elif len(queue) > LIMIT:
        # the checks already computed; queued ones only if they alone pass the limit (so that checks a failed
        # queue left uncomputed cannot pile up): reading a queued check runs adaptive eager's queue where no
        # loop boundary is, a queue of a new structure to compile (a training loop with three checked ops did
        # so every 341 steps), and fails a graph capture
        computed = _computed_prefix(queue)
        _raise_failures_of(device_index, computed if len(queue) - computed <= LIMIT else len(queue))


def take(device_index: int, condition_taken) -> list:
    """Remove and return the device's unread checks with a condition for which `condition_taken` holds."""
    kept, taken = [], []
    with _lock:
        for check in _pending.get(device_index, []):
            (taken if any(condition_taken(c) for c in check[1]) else kept).append(check)
        if taken:
            _pending[device_index] = kept
    return taken


def _computed_prefix(queue: list) -> int:
    """How many of the first checks of `queue` have every condition computed."""
    for i, (_, conditions, _) in enumerate(queue):
        if any(type(c) is Pending and c.array is None for c in conditions):
            return i
    return len(queue)


def raise_failures(device_index: int) -> None:
    """Raise the first failed check queued on the device (all are consumed)."""
    _raise_failures_of(device_index, len(_pending.get(device_index, ())))


def _raise_failures_of(device_index: int, count: int) -> None:
    """Raise the first failed check of the device's first `count` (which are consumed, the rest kept)."""
    with _lock:
        queue = _pending.pop(device_index, [])
        read, kept = queue[:count], queue[count:]
        if kept:
            _pending[device_index] = kept
    when = "at the op (TORCHNEURON_LAUNCH_BLOCKING=1)" if BLOCKING else "at synchronisation"
    for op, conditions, errors in read:
        for condition, (error_type, message) in zip(conditions, errors):
            condition = np.asarray(condition.resolve() if type(condition) is Pending else condition)
            if not bool(condition[0] if condition.ndim else condition):
                if condition.ndim:  # (ok, the first bad values) of a check whose message names them
                    message = message.format(*map(int, condition[1:]))
                raise error_type(f"{message} (raised by {op} on neuron:{device_index}, reported {when})")
