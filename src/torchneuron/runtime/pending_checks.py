"""Device-side value checks waiting to be read (see ops/checks.py), raised at synchronisation points."""
import collections

import numpy as np

# beyond this many unread checks on a device, reading them costs less than keeping them
LIMIT = 1024
_pending = collections.defaultdict(list)


def add(device_index: int, op, conditions, errors) -> None:
    queue = _pending[device_index]
    queue.append((op, conditions, errors))
    if len(queue) > LIMIT:
        raise_failures(device_index)


def raise_failures(device_index: int) -> None:
    """Raise the first failed check queued on the device (all are consumed)."""
    queue = _pending.pop(device_index, None)
    if not queue:
        return
    for op, conditions, errors in queue:
        for condition, (error_type, message) in zip(conditions, errors):
            if not bool(np.asarray(condition)):
                raise error_type(f"{message} (raised by {op} on neuron:{device_index}, reported at synchronisation)")
