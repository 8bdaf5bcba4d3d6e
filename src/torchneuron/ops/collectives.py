"""Collective ops inside compiled programs: the `_c10d_functional` ops of torch.compile graphs.

A collective's lowering only makes sense inside a program that every rank of its process group runs
together, mapped over the group's devices (one shard per rank). The distributed layer, above this one,
knows groups and meshes: it fills `LOWERINGS` and sets the resolver; torch.compile asks `group_of(gm)`
whether a graph's collectives can run inside its program and `program_group` for the mesh to map it
over. Eager dispatch and adaptive eager never use these lowerings: they run collectives through the
process group.
"""
import torch

# functional collective op -> lowering of JAX arrays, run inside a program mapped over the op's group
LOWERINGS = {}
# op -> whether a graph node of it can run inside such a program (every rank's program must be the same)
_ACCEPTS = {}

# (group name, neuron device index) -> how a program maps over the group on that device (`.mesh`,
# `.agree(what)`); with device index None, whether the group is a neuron one (None where it is not).
# Set by the distributed layer
_resolver = None


def lower(op, accepts=None):
    def register(fn):
        LOWERINGS[op] = fn
        if accepts is not None:
            _ACCEPTS[op] = accepts
        return fn

    return register


def set_resolver(resolver) -> None:
    global _resolver
    _resolver = resolver


def program_group(name: str, device_index: int):
    return _resolver(name, device_index) if _resolver is not None else None


def _group_name(node):
    if "group_name" in node.kwargs:
        return node.kwargs["group_name"]
    names = [a.name for a in node.target._schema.arguments]
    if "group_name" not in names:
        return None
    return node.args[names.index("group_name")]


def group_of(gm: torch.fx.GraphModule):
    """The one process group the graph's collectives run over: its name; "" when no op of the graph
    names a group; None when its collectives cannot share one program (several groups, or a group that
    is not a neuron one, a node its op's `accepts` refuses): they then run eagerly between compiled
    pieces."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in LOWERINGS]
    names = {_group_name(n) for n in nodes} - {None}
    if not names:
        return ""
    if len(names) > 1 or not all(isinstance(n, str) for n in names):
        return None
    if not all(_ACCEPTS.get(n.target, bool)(n) for n in nodes):
        return None
    (name,) = names
    return name if program_group(name, None) is not None else None
