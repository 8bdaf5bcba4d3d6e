"""Collectives as XLA programs over the ranks' devices (multi-controller JAX).

Every rank of a group runs the same compiled SPMD program on a global array
whose shard on each device is that rank's flat buffer; XLA emits the
collective (gloo on XLA:CPU, NCCL on GPU, Neuron collectives on Trainium), so
nothing here knows the platform. A program is compiled once per (collective,
group, per-rank length, dtype, static arguments) and called directly; the
global array is a view of the local buffer, not a copy.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "r"
_SPEC = PartitionSpec(AXIS)


class Group:
    """Ranks of a process group as a one-axis mesh of their devices (the same local slot on each)."""

    def __init__(self, ranks: tuple, slot: int):
        self.ranks = ranks
        per_process = {}
        for device in sorted(jax.devices(), key=lambda d: d.id):
            per_process.setdefault(device.process_index, []).append(device)
        self.mesh = Mesh(np.array([per_process[r][slot] for r in ranks]), (AXIS,))
        self.sharding = NamedSharding(self.mesh, _SPEC)
        self.size = len(ranks)


@functools.cache
def group(ranks: tuple, slot: int) -> Group:
    return Group(ranks, slot)


def _reduce_rows(stacked, op: str):
    """Reduce (G, n) rows from every rank to (n,) with a c10d ReduceOp by name."""
    if op in ("SUM", "AVG", "PREMUL_SUM"):
        return jnp.sum(stacked, axis=0, dtype=stacked.dtype)
    if op == "PRODUCT":
        return jnp.prod(stacked, axis=0, dtype=stacked.dtype)
    if op == "MIN":
        return jnp.min(stacked, axis=0)
    if op == "MAX":
        return jnp.max(stacked, axis=0)
    bitwise = {"BAND": jnp.bitwise_and, "BOR": jnp.bitwise_or, "BXOR": jnp.bitwise_xor}[op]
    return functools.reduce(bitwise, [stacked[i] for i in range(stacked.shape[0])])


def _reducing(op: str, factor, size: int, collective):
    """`collective` with the scaling AVG and PREMUL_SUM imply (before the sum, as NCCL scales)."""
    if op == "PREMUL_SUM":
        return lambda x: collective((x * factor).astype(x.dtype))
    if op == "AVG":
        return lambda x: (collective(x) / size).astype(x.dtype)
    return collective


def _all_reduce(op: str, size: int):
    if op in ("SUM", "AVG", "PREMUL_SUM"):
        return lambda x: lax.psum(x, AXIS)
    if op == "MAX":
        return lambda x: lax.pmax(x, AXIS)
    if op == "MIN":
        return lambda x: lax.pmin(x, AXIS)
    return lambda x: _reduce_rows(lax.all_gather(x, AXIS), op)


def _reduce_scatter(op: str, size: int):
    # an all-to-all then a local reduction moves what a ring reduce-scatter moves; XLA:CPU's own
    # reduce-scatter (psum_scatter) left its gloo communicator 20-100x slower for later collectives
    return lambda x: _reduce_rows(lax.all_to_all(x.reshape(size, -1), AXIS, 0, 0, tiled=True), op)


def rank_body(kind: str, size: int, statics: tuple):
    """The per-rank function of the program: one flat shard in, one flat shard out."""
    if kind == "all_reduce":
        op, factor = statics
        return _reducing(op, factor, size, _all_reduce(op, size))
    if kind == "reduce":
        # an all-reduce whose result only the root keeps (the same traffic as a ring reduce); every rank runs
        # the same program, so that a graph capturing it is one program of all ranks
        op, factor, root = statics
        reduced = _reducing(op, factor, size, _all_reduce(op, size))
        return lambda x: jnp.where(lax.axis_index(AXIS) == root, reduced(x), x)
    if kind == "reduce_scatter":
        op, factor = statics
        return _reducing(op, factor, size, _reduce_scatter(op, size))
    if kind == "all_gather":
        return lambda x: lax.all_gather(x, AXIS, tiled=True)
    if kind == "broadcast":
        # exact for every dtype (a masked sum would turn -0.0 into 0.0)
        (root,) = statics
        return lambda x: lax.all_gather(x, AXIS)[root]
    if kind == "all_to_all":
        return lambda x: lax.all_to_all(x.reshape(size, -1), AXIS, 0, 0, tiled=True).reshape(-1)
    if kind == "scatter":
        (root,) = statics
        return lambda x: lax.all_to_all(x.reshape(size, -1), AXIS, 0, 0, tiled=True)[root]
    raise AssertionError(kind)


_programs = {}


def _program(kind: str, grp: Group, length: int, dtype, statics: tuple, agree):
    key = (kind, grp, length, dtype, statics)
    compiled = _programs.get(key)
    if compiled is None or agree.always:
        # ranks passing different shapes would run mismatched collectives, which XLA's communicators
        # abort the process on: compare what each rank is about to run while that is still an error
        arguments = ", ".join(str(s) for s in statics if s is not None)
        agree(f"{kind}({arguments}) of {length} x {jnp.dtype(dtype).name} per rank")
    if compiled is None:
        body = rank_body(kind, grp.size, statics)
        mapped = jax.shard_map(body, mesh=grp.mesh, in_specs=_SPEC, out_specs=_SPEC)
        shape = jax.ShapeDtypeStruct((grp.size * length,), dtype, sharding=grp.sharding)
        compiled = _programs[key] = jax.jit(mapped).lower(shape).compile()
    return compiled


def run(agree, kind: str, grp: Group, flat, *statics):
    """This rank's shard of the collective `kind` over `grp`, given this rank's flat buffer. `agree(what)`
    checks that every rank runs the same program (called when it is first compiled here)."""
    flat = unbooled(flat)
    compiled = _program(kind, grp, flat.shape[0], flat.dtype, statics, agree)
    whole = jax.make_array_from_single_device_arrays((grp.size * flat.shape[0],), grp.sharding, [flat])
    return compiled(whole).addressable_data(0)


def unbooled(flat):
    # collectives reduce numbers: booleans travel as bytes (SUM/MAX of 0/1 is OR, MIN/PRODUCT is AND)
    return flat.astype(jnp.uint8) if flat.dtype == jnp.bool_ else flat


def cached_count() -> int:
    return len(_programs)
