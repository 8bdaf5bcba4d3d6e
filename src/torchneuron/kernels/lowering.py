"""The JAX lowering: the grid's programs run as one vmapped function (program ids are traced values),
loops unroll at trace time, tiles are JAX arrays, and each program's stores are applied to the outputs
after the vmap as scatters of their windows. XLA fuses the result on every platform."""
import math

import jax
import jax.numpy as jnp
from jax import lax

from .context import Active
from .language import HBMTensor, Index, Interpreter, float32, window_indices


class Lowering(Interpreter):
    def __init__(self, kernel_name, grid, program_values):
        super().__init__(kernel_name, grid, jnp)
        self.program_values, self.outputs, self.stores, self.pads = program_values, [], [], {}

    def program_id(self, axis):
        return Index.program(self.program_values[axis], axis, self.grid[axis])

    def matmul(self, a, b):
        precision = lax.Precision.HIGHEST if float32 in (a.dtype, b.dtype) else None
        return jnp.matmul(a, b, preferred_element_type=float32, precision=precision)

    def assign(self, memory, slices, value):
        memory.data = memory.data.at[slices].set(value)

    def output(self, shape, dtype):
        tensor = HBMTensor(f"output {len(self.outputs)}", shape, dtype, None, output=True)
        self.outputs.append(tensor)
        return tensor

    def loop(self, kind, n):
        return range(n)

    def load(self, view, mask, other):
        data = view.tensor.data
        if view.indirect:
            mask = True if mask is None else mask
            indices, valid = window_indices(jnp, view)
            values = data[indices].reshape(view.shape)
            return jnp.where(mask & valid.reshape(view.shape), values, jnp.asarray(other).astype(data.dtype))
        if mask is not None:  # a slice of the tensor padded by the window: the pad is shared by all programs
            _, valid = window_indices(jnp, view)
            pads = tuple((n, n) for n in view.sizes)
            starts = [jnp.asarray(s.value if isinstance(s, Index) else s, jnp.int32) + n
                      for s, n in zip(view.starts, view.sizes)]
            values = lax.dynamic_slice(self.padded(view.tensor, pads), starts, view.sizes).reshape(view.shape)
            return jnp.where(mask & valid.reshape(view.shape), values, jnp.asarray(other).astype(data.dtype))
        if all(isinstance(s, int) for s in view.starts):
            return data[tuple(slice(s, s + n) for s, n in zip(view.starts, view.sizes))].reshape(view.shape)
        starts = [jnp.asarray(s.value if isinstance(s, Index) else s, jnp.int32) for s in view.starts]
        return lax.dynamic_slice(data, starts, view.sizes).reshape(view.shape)

    def padded(self, tensor, pads):
        key = (id(tensor), pads)
        if key not in self.pads:
            self.pads[key] = jnp.pad(tensor.data, pads)
        return self.pads[key]

    def store(self, view, value, mask):
        starts = jnp.stack([jnp.asarray(s.value if isinstance(s, Index) else s, jnp.int32)
                            for s in view.starts]) if view.starts else jnp.zeros((0,), jnp.int32)
        self.stores.append((view, starts, value.reshape(view.sizes),
                            None if mask is None else mask.reshape(view.sizes)))


def run(kernel, grid, arguments):
    """Outputs (JAX arrays) of `kernel` launched on `grid` with `arguments` (by name; HBM tensors hold JAX
    arrays)."""
    grid = tuple(grid)
    plan = {}

    def program(flat):
        values = [v for v in jnp.unravel_index(flat, grid)] if grid else []
        ctx = Lowering(kernel.name, grid, values)
        with Active(ctx):
            returned = kernel.fn(**arguments)
        plan["outputs"] = [(t.shape, t.dtype) for t in ctx.outputs]
        plan["returned"] = _returned(kernel, returned, ctx.outputs)
        plan["stores"] = [(ctx.outputs.index(view.tensor), view) for view, *_ in ctx.stores]
        return [(starts, value, mask) for _, starts, value, mask in ctx.stores]

    records = jax.vmap(program)(jnp.arange(max(math.prod(grid), 1)))
    outputs = [jnp.zeros(shape, dtype) for shape, dtype in plan["outputs"]]
    for (at, view), (starts, value, mask) in zip(plan["stores"], records):
        outputs[at] = _apply(outputs[at], view, starts, value, mask)
    picked = [outputs[i] for i in plan["returned"]]
    return picked[0] if plan["returned"].single else tuple(picked)


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


def _apply(out, view, starts, value, mask):
    """Write every program's window (value [G, *sizes] at starts [G, ndim]) into `out`."""
    nd = out.ndim
    if mask is None:
        numbers = lax.ScatterDimensionNumbers(update_window_dims=tuple(range(1, nd + 1)),
                                              inserted_window_dims=(), scatter_dims_to_operand_dims=tuple(range(nd)))
        return lax.scatter(out, starts, value, numbers, mode=lax.GatherScatterMode.CLIP)
    programs = starts.shape[0]
    shape = (programs, *view.sizes)
    indices, keep = [], mask
    for d, size in enumerate(view.sizes):
        idx = starts[:, d].reshape((programs,) + (1,) * nd) + jnp.arange(size).reshape(
            (1,) + tuple(size if e == d else 1 for e in range(nd)))
        keep = keep & (idx >= 0) & (idx < out.shape[d])
        indices.append(idx)
    indices = [jnp.broadcast_to(jnp.where(keep, i, out.shape[d]), shape) for d, i in enumerate(indices)]
    return out.at[tuple(indices)].set(value, mode="drop")
