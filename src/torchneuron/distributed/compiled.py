"""Functional collectives inside torch.compile graphs: lowerings to XLA collectives in the graph's own
program, which every rank of the group runs over the group's mesh (see ops.collectives).

The lowerings are the per-rank bodies the eager programs use (programs.py), on the op's tensor as it
stands; `wait_tensor` is the identity, since the collective's result is an ordinary value of the program.
"""
import torch
import torch.distributed as dist
from jax import lax

from ..ops import collectives, rules
from ..runtime.dtypes import to_torch
from . import programs
from .process_group import NeuronProcessGroup, _check_op

_ops = torch.ops._c10d_functional


class _Mapping:
    def __init__(self, group: NeuronProcessGroup, device_index: int):
        self.mesh = group._mesh_at(device_index).mesh
        self.agree = group._agree


def _neuron_group(name: str):
    try:
        group = dist.distributed_c10d._resolve_process_group(name)
        # init_process_group("neuron") makes the group ours; "cpu:gloo,neuron:neuron" one with our backend
        backend = group if isinstance(group, NeuronProcessGroup) else group._get_backend(torch.device("neuron"))
    except (RuntimeError, ValueError, KeyError):
        return None
    return backend if isinstance(backend, NeuronProcessGroup) else None


def _resolve(name: str, device_index):
    group = _neuron_group(name)
    if group is None or device_index is None:
        return group
    return _Mapping(group, device_index)


def _reduce_op(x, reduce_op: str) -> str:
    name = reduce_op.upper()
    if name not in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"):
        raise ValueError(f"neuron: unknown reduce_op {reduce_op!r} for a functional collective")
    _check_op(name, to_torch(x.dtype))
    return name


def _body(kind: str, x, *statics):
    flat = programs.unbooled(x.reshape(-1))
    return programs.rank_body(kind, lax.axis_size(programs.AXIS), statics)(flat).astype(x.dtype)


@collectives.lower(_ops.all_reduce.default)
def all_reduce(x, reduce_op, group_name):
    return _body("all_reduce", x, _reduce_op(x, reduce_op), None).reshape(x.shape)


@collectives.lower(_ops.all_gather_into_tensor.default)
def all_gather_into_tensor(x, group_size, group_name):
    return _body("all_gather", x).reshape(group_size * x.shape[0], *x.shape[1:])


@collectives.lower(_ops.reduce_scatter_tensor.default)
def reduce_scatter_tensor(x, reduce_op, group_size, group_name):
    return _body("reduce_scatter", x, _reduce_op(x, reduce_op), None).reshape(x.shape[0] // group_size, *x.shape[1:])


@collectives.lower(_ops.broadcast.default)
def broadcast(x, src, group_name):
    return _body("broadcast", x, src).reshape(x.shape)


def _even_splits(node) -> bool:
    """Uneven splits differ between ranks, and so would their programs: those run eagerly."""
    rows = node.args[0].meta["val"].shape[0]
    splits = [s for s in node.args[1:3] if s]
    return all(isinstance(s, int) and s * len(sizes) == rows for sizes in splits for s in sizes)


@collectives.lower(_ops.all_to_all_single.default, accepts=_even_splits)
def all_to_all_single(x, output_split_sizes, input_split_sizes, group_name):
    return _body("all_to_all", x).reshape(x.shape)


@collectives.lower(_ops.all_reduce_coalesced.default)
def all_reduce_coalesced(inputs, reduce_op, group_name):
    return [all_reduce(x, reduce_op, group_name) for x in inputs]


@collectives.lower(_ops.all_gather_into_tensor_coalesced.default)
def all_gather_into_tensor_coalesced(inputs, group_size, group_name):
    return [all_gather_into_tensor(x, group_size, group_name) for x in inputs]


@collectives.lower(_ops.reduce_scatter_tensor_coalesced.default)
def reduce_scatter_tensor_coalesced(inputs, reduce_op, group_size, group_name):
    return [reduce_scatter_tensor(x, reduce_op, group_size, group_name) for x in inputs]


@collectives.lower(_ops.wait_tensor.default)
def wait_tensor(x):
    return x


collectives.set_resolver(_resolve)
rules.forget()
