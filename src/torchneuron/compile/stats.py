"""Counters of what torch.compile did on the neuron device (see `torchneuron.compile.report`)."""
import collections

counters = collections.Counter()
# ops the lowering table lacks, run eagerly between compiled pieces: op name -> occurrences
eager_ops = collections.Counter()
# ops on CPU tensors, run eagerly on the CPU between compiled pieces: op name -> occurrences
host_ops = collections.Counter()


def report() -> dict:
    """dynamo_graphs: graphs Dynamo handed the backend (graph breaks and Dynamo recompiles add more);
    graphs: AOTAutograd graphs compiled (forward, backward or inference); specialisations: XLA programs
    built, one per input signature of a graph; recompiles: specialisations beyond a graph's first (new
    shapes); xla_compiles: programs the XLA compiler built; disk_cache_hits: programs loaded from disk;
    eager_ops: ops without a lowering that ran eagerly between compiled pieces; host_ops: ops on CPU tensors
    (or moving tensors between the CPU and the device) that ran eagerly between compiled pieces."""
    names = ("dynamo_graphs", "graphs", "specialisations", "recompiles", "xla_compiles", "disk_cache_hits")
    return {**{k: counters[k] for k in names}, "eager_ops": dict(eager_ops), "host_ops": dict(host_ops)}


def reset() -> None:
    counters.clear()
    eager_ops.clear()
    host_ops.clear()
