"""Counters of what torch.compile did on the neuron device (see `torchneuron.compile.report`)."""
import collections

counters = collections.Counter()
# ops the lowering table lacks, run eagerly between compiled pieces: op name -> occurrences
eager_ops = collections.Counter()


def report() -> dict:
    """graphs (Dynamo graphs compiled), specialisations (XLA programs built, one per input signature),
    recompiles (specialisations beyond each graph's first), xla_compiles, disk_cache_hits, eager_ops."""
    return {**{k: counters[k] for k in ("graphs", "specialisations", "recompiles", "xla_compiles",
                                        "disk_cache_hits")}, "eager_ops": dict(eager_ops)}


def reset() -> None:
    counters.clear()
    eager_ops.clear()
