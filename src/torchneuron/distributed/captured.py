"""Collectives in a graph capture (torch.neuron.graph), as NCCL's are captured in a CUDA graph.

While a graph is captured, a collective on neuron tensors is recorded with the ops around it instead of
running: the captured graph becomes one program of all the group's ranks (eager/adaptive.py
CapturedGraph, mapped over the group's mesh as a compiled graph with collectives is), and each replay
runs the collective again, on what the replay computed before it. As with NCCL, every rank must replay
its graph as often as the others.
"""
from ..eager import adaptive
from . import buffers, programs


class _Body:
    def __init__(self, function):
        self.function = function


class QueuedCollective:
    """A collective as the queue records an op: it reads its source tensor through its view, runs the per-rank
    body of the collective (programs.rank_body) and writes the result through the destination's view: its
    arguments are the destination's storage buffer (its one result, the buffer written) and, if another, the
    source's."""

    random = False

    def __init__(self, kind: str, grp: programs.Group, source, destination, statics):
        self.op = f"c10d.{kind}"
        self.device_index = destination._spec[4]
        written = destination._storage
        self.storages = [written] if source._storage is written else [written, source._storage]
        self.argument_storages = list(range(len(self.storages)))
        self.output_sizes = [written.numel]
        read, write = buffers.reader(source), buffers.writer(destination)
        collective = programs.rank_body(kind, grp.size, statics)

        def function(buffer, source_buffer=None):
            flat = read(buffer if source_buffer is None else source_buffer)
            return [write(buffer, collective(programs.unbooled(flat)).astype(flat.dtype))]

        self.program = _Body(function)


def capturing() -> bool:
    return adaptive.queue.capture is not None


def record(kind: str, grp: programs.Group, source, destination, statics, agree) -> None:
    """Record the collective `kind` of `source` into `destination` (the same tensor for an in-place one) in the
    graph being captured; `agree` checks with the group's ranks that they replay the same program."""
    adaptive.queue.capture.spans(grp.mesh, agree, f"the collective {kind}")
    collective = QueuedCollective(kind, grp, source, destination, statics)
    (written,) = adaptive.queue.record(collective, collective.storages, [])
    destination._storage.buffer = written
