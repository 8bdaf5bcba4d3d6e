"""The JAX lowering: the grid's programs run as one vmapped function (program ids are traced values), and
so do the iterations of each `affine_range` loop (one more vmapped axis per loop, its accumulations summed
across the axis); `sequential_range` loops unroll at trace time, `nk.fori` loops are `lax.fori_loop`. Tiles
are JAX arrays, and each program's stores are applied to the outputs after the vmap as scatters of their
windows. XLA fuses the result on every platform."""
import math

import jax
import jax.numpy as jnp
from jax import lax

from .context import Active
from .language import HBMTensor, Index, Interpreter, Tile, _check_carry, _tile, float32, window_indices


class Lowering(Interpreter):
    """`loops`: the trip counts of the affine_range loops whose iterations are vmapped axes (their values
    follow the grid's in `program_values`), in the order the kernel meets them; None on the trace that
    finds them (each loop then runs its body once, on a stand-in index)."""

    def __init__(self, kernel_name, grid, program_values, loops=None):
        super().__init__(kernel_name, grid, jnp)
        self.program_values, self.outputs, self.stores, self.pads = dict(enumerate(program_values)), [], [], {}
        self.loops = 0
        self.affine, self.met, self.open = loops, [], []

    def program_id(self, axis):
        return Index.program(self.program_values[axis], axis, self.grid[axis])

    def matmul(self, a, b):
        precision = lax.Precision.HIGHEST if float32 in (a.dtype, b.dtype) else None
        return jnp.matmul(a, b, preferred_element_type=float32, precision=precision)

    def assign(self, memory, slices, value):
        for loop in self.open:
            if memory.seq <= loop.start:
                loop.before.setdefault(memory, memory.data)
        memory.data = memory.data.at[slices].set(value)

    def output(self, shape, dtype):
        tensor = HBMTensor(f"output {len(self.outputs)}", shape, dtype, None, output=True)
        self.outputs.append(tensor)
        return tensor

    def fori(self, n, body, carry):
        kinds = [t.buffer for t in carry]
        self.loops += 1
        axis = ("fori", self.loops)

        def step(i, arrays):
            saved = (self.floor, self.pads, dict(self.program_values))
            self.floor, self.pads = self.seq, dict(self.pads)  # pads made in the body stay in its trace
            self.program_values[axis] = i
            self.fori_depth += 1
            try:
                tiles = [_tile(a, kind) for a, kind in zip(arrays, kinds)]
                out = _check_carry(tiles, body(Index(i, ((axis, 1, n),), 0, 0, n - 1), *tiles))
                return tuple(t.read() for t in out)
            finally:
                self.floor, self.pads, self.program_values = saved
                self.fori_depth -= 1

        if n == 0:
            return carry
        result = lax.fori_loop(0, n, step, tuple(t.read() for t in carry))
        return tuple(_tile(a, kind) for a, kind in zip(result, kinds))

    def loop(self, kind, n):
        if kind == "sequential" or n < 2 or self.fori_depth:
            return range(n)
        return self._affine(n)

    def _affine(self, n):
        """One pass over the body, its index the loop's vmapped axis: memory from outside the loop that
        the body wrote (accumulations: other writes would be races) becomes its value before the loop
        plus the sum over the iterations of what each added."""
        k = len(self.met)
        self.met.append(n)
        axis = len(self.grid) + k
        if self.affine is None:
            self.program_values[axis] = jnp.zeros((), jnp.int32)
        elif self.affine[k:k + 1] != [n]:
            raise RuntimeError(f"kernel {self.kernel_name}: its affine_range loops changed between two traces "
                               f"({self.affine} then {self.met}); a kernel's loops depend only on its arguments")
        loop = _Open(axis, self.seq)
        self.open.append(loop)
        yield Index(self.program_values[axis], ((axis, 1, n),), 0, 0, n - 1)
        self.open.remove(loop)
        if self.affine is not None:
            for memory, before in loop.before.items():
                memory.data = before + lax.psum(memory.data - before, _axis_name(axis))

    def load(self, view, mask, other):
        data = view.tensor.data
        fill = jnp.asarray(other).astype(data.dtype)
        if view.indirect:
            values, valid = _gather(data, view)
            keep = valid if mask is None else mask & valid
            return jnp.where(keep, values, fill)
        pads = _pads(view)
        if any(p != (0, 0) for p in pads):  # a window that can leave the tensor: slice a padded copy
            values = _window(self.padded(view.tensor, pads), view, pads).reshape(view.shape)
            _, valid = window_indices(jnp, view)
            return jnp.where(mask & valid.reshape(view.shape), values, fill)
        values = _window(data, view, pads).reshape(view.shape)
        return values if mask is None else jnp.where(mask, values, fill)

    def padded(self, tensor, pads):
        """The tensor padded for windows that can leave it: made once per launch, shared by all programs."""
        key = (id(tensor), pads)
        if key not in self.pads:
            self.pads[key] = jnp.pad(tensor.data, pads)
        return self.pads[key]

    def store(self, view, value, mask):
        starts = jnp.stack([jnp.asarray(s.value if isinstance(s, Index) else s, jnp.int32)
                            for s in view.starts]) if view.starts else jnp.zeros((0,), jnp.int32)
        self.stores.append((view, starts, value.reshape(view.sizes),
                            None if mask is None else mask.reshape(view.sizes), {loop.axis for loop in self.open}))


class _Open:
    """An affine_range loop being traced: its axis, and the outside memory its body wrote (value before)."""

    def __init__(self, axis, start):
        self.axis, self.start, self.before = axis, start, {}


def _axis_name(axis):
    return f"affine_range {axis}"


def run(kernel, grid, arguments):
    """Outputs (JAX arrays) of `kernel` launched on `grid` with `arguments` (by name; HBM tensors hold JAX
    arrays). A kernel with affine_range loops is traced twice: once to find them, once with their axes."""
    grid = tuple(grid)
    plan, records = _trace(kernel, grid, arguments, None)
    if plan["met"]:
        plan, records = _trace(kernel, grid, arguments, plan["met"])
    outputs = [jnp.zeros(shape, dtype) for shape, dtype in plan["outputs"]]
    for (at, view, inside), record in zip(plan["stores"], records):
        (starts, value, mask), axes = _programs(record, grid, plan["met"], inside)
        outputs[at] = _apply(outputs[at], view, starts, value, mask, axes)
    picked = [outputs[i] for i in plan["returned"]]
    return picked[0] if plan["returned"].single else tuple(picked)


def _programs(record, grid, trips, inside):
    """A store's records [G, *trips, ...] as [programs, ...] over the grid and the loops the store is inside,
    and that grid (a store outside a loop is the same in each of its iterations: the first is kept)."""
    full = grid + tuple(trips)
    axes = tuple(n if a < len(grid) or a in inside else 1 for a, n in enumerate(full))
    kept = tuple(slice(None) if n == m else slice(0, 1) for n, m in zip(axes, full))

    def pick(r):
        rest = r.shape[1 + len(trips):]
        return r.reshape(full + rest)[kept].reshape((-1,) + rest)
    return [None if r is None else pick(r) for r in record], axes


def _trace(kernel, grid, arguments, loops):
    """(plan, per store [G, *loops, ...] records) of every program and affine_range iteration."""
    plan = {}

    def program(flat, *iterations):
        values = [v for v in jnp.unravel_index(flat, grid)] if grid else []
        ctx = Lowering(kernel.name, grid, values + list(iterations), loops)
        with Active(ctx):
            returned = kernel.fn(**arguments)
        plan["outputs"] = [(t.shape, t.dtype) for t in ctx.outputs]
        plan["returned"] = _returned(kernel, returned, ctx.outputs)
        plan["stores"] = [(ctx.outputs.index(view.tensor), view, inside) for view, *_, inside in ctx.stores]
        plan["met"] = ctx.met
        return [(starts, value, mask) for _, starts, value, mask, _ in ctx.stores]

    trips = loops or []
    batched = program
    for k in reversed(range(len(trips))):  # the innermost vmap is the last loop's: records are [G, n0, n1, ...]
        axes = (None,) * (k + 1) + (0,) + (None,) * (len(trips) - k - 1)
        batched = jax.vmap(batched, in_axes=axes, axis_name=_axis_name(len(grid) + k))
    records = jax.vmap(batched, in_axes=(0,) + (None,) * len(trips))(
        jnp.arange(max(math.prod(grid), 1)), *(jnp.arange(n, dtype=jnp.int32) for n in trips))
    return plan, records


def _pads(view):
    """Per dimension, how far the window can reach below 0 and past the end (from its start's bounds)."""
    pads = []
    for start, size, extent in zip(view.starts, view.sizes, view.tensor.shape):
        if isinstance(start, Tile):  # an indirect index: its values are clipped and masked, not padded
            pads.append((0, 0))
            continue
        lo, hi = (start.lo, start.hi) if isinstance(start, Index) else (start, start)
        pads.append((max(0, -lo), max(0, hi + size - extent)))
    return tuple(pads)


def _starts(view, pads):
    return [s + lo if isinstance(s, int) else jnp.asarray(s.value, jnp.int32) + lo
            for s, (lo, _) in zip(view.starts, pads)]


def _window(data, view, pads):
    starts = _starts(view, pads)
    if all(isinstance(s, int) for s in starts):
        return data[tuple(slice(s, s + n) for s, n in zip(starts, view.sizes))]
    return lax.dynamic_slice(data, [jnp.asarray(s, jnp.int32) for s in starts], view.sizes)


def _gather(data, view):
    """An indirect window: the other dimensions' window sliced first, then rows taken along the indirect
    one (a gather of slabs, not of elements); where its indices were in bounds."""
    (d,) = [e for e, s in enumerate(view.starts) if isinstance(s, Tile)] or [None]
    if d is None or any(p != (0, 0) for e, p in enumerate(_pads(view)) if e != d):
        indices, valid = window_indices(jnp, view)
        return data[indices].reshape(view.shape), valid.reshape(view.shape)
    extent = view.tensor.shape[d]
    index = view.starts[d].read().reshape(-1)
    slab_starts = [0 if e == d else (s if isinstance(s, int) else jnp.asarray(s.value, jnp.int32))
                   for e, s in enumerate(view.starts)]
    sizes = [extent if e == d else n for e, n in enumerate(view.sizes)]
    if all(isinstance(s, int) for s in slab_starts):
        slab = data[tuple(slice(s, s + n) for s, n in zip(slab_starts, sizes))]
    else:
        slab = lax.dynamic_slice(data, [jnp.asarray(s, jnp.int32) for s in slab_starts], sizes)
    values = jnp.take(slab, jnp.clip(index, 0, extent - 1), axis=d)
    valid = ((index >= 0) & (index < extent)).reshape([-1 if e == d else 1 for e in range(data.ndim)])
    return values.reshape(view.shape), jnp.broadcast_to(valid, values.shape).reshape(view.shape)


class _Picked(list):
    single = False


def _returned(kernel, returned, outputs):
    single = isinstance(returned, HBMTensor)
    items = [returned] if single else list(returned) if isinstance(returned, (tuple, list)) else None
    if items is None or not all(isinstance(t, HBMTensor) and t.output for t in items):
        raise TypeError(f"kernel {kernel.name} must return the output tensor(s) it allocated with "
                        f"nk.ndarray(..., buffer=nk.hbm), got {returned!r}")
    picked = _Picked(outputs.index(t) for t in items)
    picked.single = single
    return picked


def block_axes(view):
    """Per dimension the axis (of the grid or a loop) whose index times the window's size is the window's
    start, or None where the window starts at 0 and spans the dimension: the window is the block of a
    blocked layout that this index picks; None if it is not such a block."""
    axes = []
    for start, size, extent in zip(view.starts, view.sizes, view.tensor.shape):
        if isinstance(start, int):
            if start != 0 or size < extent:
                return None
            axes.append(None)
        elif isinstance(start, Index) and start.terms is not None and start.const == 0 and \
                len(start.terms) == 1 and start.terms[0][1] == size:
            axes.append(start.terms[0][0])
        else:
            return None
    return axes


def _tiling(view, grid):
    """Per dimension the grid axis whose programs tile it (start = program id * size) or None (one window
    from 0 covers it), when a store's windows tile the output that way; else None."""
    axes = block_axes(view)
    if axes is None or any(a is not None and (not isinstance(a, int) or grid[a] * size < extent)
                           for a, size, extent in zip(axes, view.sizes, view.tensor.shape)):
        return None
    used = [a for a in axes if a is not None]
    if len(set(used)) != len(used) or any(n > 1 and a not in used for a, n in enumerate(grid)):
        return None
    return axes


def _assemble(blocks, axes, grid, shape):
    """[G, *sizes] program windows -> the (padded) tensor they tile."""
    nd = len(axes)
    blocks = blocks.reshape(tuple(grid) + blocks.shape[1:])
    order = [a for a in range(len(grid)) if a not in axes]  # size-1 axes, dropped by the reshape
    for d, a in enumerate(axes):
        order += ([a] if a is not None else []) + [len(grid) + d]
    return blocks.transpose(order).reshape(shape) if nd else blocks.reshape(shape)


def _apply(out, view, starts, value, mask, grid):
    """Write every program's window (value [G, *sizes] at starts [G, ndim]) into `out`: reassembled when
    the windows tile it by program id, else one scatter of windows; into a padded copy where windows can
    leave the tensor; a masked store keeps the old values where its mask is False."""
    nd = out.ndim
    pads = _pads(view)
    padded = jnp.pad(out, pads) if any(p != (0, 0) for p in pads) else out
    axes = _tiling(view, grid)
    if axes is not None:
        whole = _assemble(value, axes, grid, padded.shape)
        padded = whole if mask is None else jnp.where(_assemble(mask, axes, grid, padded.shape), whole, padded)
        return padded[tuple(slice(lo, lo + n) for (lo, _), n in zip(pads, out.shape))]
    starts = starts + jnp.asarray([lo for lo, _ in pads], jnp.int32)
    if mask is not None:
        old = jax.vmap(lambda s: lax.dynamic_slice(padded, list(s), view.sizes))(starts) if nd else padded[None]
        value = jnp.where(mask, value, old)
    numbers = lax.ScatterDimensionNumbers(update_window_dims=tuple(range(1, nd + 1)), inserted_window_dims=(),
                                          scatter_dims_to_operand_dims=tuple(range(nd)))
    padded = lax.scatter(padded, starts, value, numbers, mode=lax.GatherScatterMode.CLIP)
    return padded[tuple(slice(lo, lo + n) for (lo, _), n in zip(pads, out.shape))]
