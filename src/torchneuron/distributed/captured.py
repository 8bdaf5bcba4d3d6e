"""Collectives in a graph capture (torch.neuron.graph), as NCCL's are captured in a CUDA graph.

While a graph is captured, a collective on neuron tensors is recorded with the ops around it instead of
running: the captured graph becomes one program of all the group's ranks (eager/adaptive.py
CapturedGraph, mapped over the group's mesh as a compiled graph with collectives is), and each replay
runs the collective again, on what the replay computed before it. As with NCCL, every rank must replay
its graph as often as the others.
"""
import jax.numpy as jnp

from ..eager import adaptive
from . import buffers, programs


class _Body:
    def __init__(self, function):
        self.function = function


class QueuedCollective:
    """A collective as the queue records an op: it reads its sources through their views, one after the other
    (`buffers.flat` of each, concatenated), runs the per-rank body of the collective (programs.rank_body) and
    writes the result, split in order, through the destinations' views. Its arguments are the buffers of the
    storages it writes, which are its results, then of those it only reads."""

    random = False

    def __init__(self, kind: str, grp: programs.Group, sources, destinations, statics):
        self.op = f"c10d.{kind}"
        # what ranks must agree on beyond the op's name (a captured graph's digest, eager/adaptive.py)
        self.signature = (kind, statics, [t.numel() for t in sources], [t.numel() for t in destinations])
        self.device_index = destinations[0]._spec[4]
        self.storages = []
        for t in destinations + sources:
            if all(t._storage is not s for s in self.storages):
                self.storages.append(t._storage)
        n_written = len({id(t._storage) for t in destinations})
        self.argument_storages = list(range(len(self.storages)))
        self.output_sizes = [s.numel for s in self.storages[:n_written]]
        position = {id(s): i for i, s in enumerate(self.storages)}
        reads = [(buffers.reader(t), position[id(t._storage)]) for t in sources]
        writes = [(buffers.writer(t), position[id(t._storage)], t.numel()) for t in destinations]
        collective = programs.rank_body(kind, grp.size, statics)

        def function(*arguments):
            values = [read(arguments[i]) for read, i in reads]
            flat = values[0] if len(values) == 1 else jnp.concatenate(values)
            result = collective(programs.unbooled(flat)).astype(flat.dtype)
            written, start = list(arguments[:n_written]), 0
            for write, i, numel in writes:  # views of one storage are written one after the other
                written[i] = write(written[i], result[start : start + numel])
                start += numel
            return written

        self.program = _Body(function)
        self.written = self.storages[:n_written]


def record(kind: str, grp: programs.Group, sources, destinations, statics, agree) -> None:
    """Record the collective `kind` of `sources` into `destinations` (the same tensors for an in-place one) in
    the graph being captured; `agree` checks with the group's ranks that they replay the same program."""
    queue = adaptive.current()
    queue.capture.spans(grp.mesh, agree, f"the collective {kind}")
    collective = QueuedCollective(kind, grp, sources, destinations, statics)
    for storage, result in zip(collective.written, queue.record(collective, collective.storages, [])):
        storage.buffer = result
