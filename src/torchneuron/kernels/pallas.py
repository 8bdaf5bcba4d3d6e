"""The Pallas lowering: the kernel becomes one `pallas_call` whose grid is the launch's grid (program ids
are `pl.program_id`), its HBM tensors refs (a BlockSpec's block where every window of the tensor is the
block the program ids pick, else the whole array), its loads and stores masked ref accesses of their
windows (Triton's masked pointer loads on a GPU), and its tiles the values in between. Output elements
that no program stores are undefined (zero in the simulator and the JAX lowering).

A first abstract trace by the JAX lowering finds the outputs (a pallas_call declares them up front) and
how far each window can leave its tensor: such tensors are padded so that every window is in bounds on
every backend (interpret mode included), and outputs sliced back. What Pallas' GPU backend (Triton)
cannot express is a NotImplementedError naming the construct, raised while tracing, whatever the target:
the interpret mode on the CPU checks the kernels a GPU would run.
"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .context import Active
from .language import HBMTensor
from .lowering import Lowering, _pads, _returned, _starts, block_axes

MIN_DOT = 16  # Triton's tl.dot takes operands of at least 16 x 16


def _unsupported(kernel_name, what):
    return NotImplementedError(f"kernel {kernel_name}: the Pallas lowering does not lower {what}; use the JAX "
                               "lowering (nk.use_lowering('jax'))")


class _Planner(Lowering):
    """One program traced abstractly: the outputs, per HBM tensor the padding its windows need, and the
    tensors whose every window is one block picked by program ids (they get a BlockSpec)."""

    def __init__(self, kernel_name, grid, program_values):
        super().__init__(kernel_name, grid, program_values)
        self.reach, self.blocks = {}, {}

    def _reach(self, view):
        name = view.tensor.name
        wanted = self.reach.get(name, ((0, 0),) * view.tensor.ndim)
        self.reach[name] = tuple((max(a, c), max(b, d)) for (a, b), (c, d) in zip(wanted, _pads(view)))
        axes = block_axes(view)
        grid_axes = axes is not None and all(a is None or isinstance(a, int) and a < len(self.grid) for a in axes)
        block = (tuple(axes), tuple(view.sizes)) if grid_axes else None
        self.blocks[name] = block if self.blocks.get(name, block) == block else None

    def load(self, view, mask, other):
        self._reach(view)
        return super().load(view, mask, other)

    def store(self, view, value, mask):
        self._reach(view)
        super().store(view, value, mask)


class PallasLowering(Lowering):
    def __init__(self, kernel_name, grid, program_values, reach, blocked, outputs):
        super().__init__(kernel_name, grid, program_values)
        self.reach, self.blocked, self.out_refs = reach, blocked, outputs

    def loop(self, kind, n):
        return range(n)  # unrolled: a kernel body is straight-line code around nk.fori loops

    def own(self, data):
        if any(n & (n - 1) for n in data.shape):
            raise _unsupported(self.kernel_name, f"a tile of shape {tuple(data.shape)} (Triton's tiles have "
                                                 "power-of-two sizes)")
        return data

    def matmul(self, a, b):
        if min(a.shape + b.shape) < MIN_DOT:
            raise _unsupported(self.kernel_name, f"a matmul of {a.shape} and {b.shape} (Triton's dot takes "
                                                 f"sizes of at least {MIN_DOT})")
        return super().matmul(a, b)

    def assign(self, memory, slices, value):
        if any(s.indices(n) != (0, n, 1) for s, n in zip(slices, memory.data.shape)):
            raise _unsupported(self.kernel_name, "a write to part of a tile (t[a:b] = v or t[a:b] += v: Triton "
                                                 "has no scatter into a value); write whole tiles")
        memory.data = value

    def output(self, shape, dtype):
        tensor = HBMTensor(f"output {len(self.outputs)}", shape, dtype, self.out_refs[len(self.outputs)],
                           output=True)
        self.outputs.append(tensor)
        return tensor

    def _window(self, view):
        if view.tensor.name in self.blocked:
            return view.tensor.data  # the block its BlockSpec gave this program
        starts = _starts(view, self.reach.get(view.tensor.name, ((0, 0),) * view.tensor.ndim))
        return view.tensor.data.at[tuple(pl.ds(jnp.asarray(s, jnp.int32), n) for s, n in zip(starts, view.sizes))]

    def load(self, view, mask, other):
        if view.indirect:
            raise _unsupported(self.kernel_name, "an indirect load (a tile as an index of an HBM window)")
        window = self._window(view)
        if mask is None:
            return window[...].reshape(view.shape)
        fill = jnp.asarray(other).astype(view.tensor.dtype)
        return plgpu.load(window, mask=mask.reshape(view.sizes), other=fill).reshape(view.shape)

    def store(self, view, value, mask):
        window = self._window(view)
        if mask is None:
            window[...] = value.reshape(view.sizes)
        else:
            plgpu.store(window, value.reshape(view.sizes), mask=mask.reshape(view.sizes))


def run(kernel, grid, arguments, *, interpret):
    """Outputs of `kernel` launched on `grid` as one pallas_call (`interpret`: Pallas' interpreter, on any
    platform; else Triton, on a GPU)."""
    grid = tuple(grid)
    plan = _plan(kernel, grid, arguments)
    reach = plan["reach"]
    tensors = [n for n, v in arguments.items() if isinstance(v, HBMTensor)]
    scalars = [n for n, v in arguments.items() if not isinstance(v, HBMTensor) and isinstance(v, jax.Array)]
    inputs = [jnp.pad(arguments[n].data, reach[n]) if n in reach else arguments[n].data for n in tensors] + \
        [jnp.reshape(arguments[n], (1,)) for n in scalars]
    names = [f"output {k}" for k in range(len(plan["outputs"]))]
    sized = [k for k, (shape, _) in enumerate(plan["outputs"]) if 0 not in shape]  # no ref for an empty output
    padded = {names[k]: _grown(plan["outputs"][k][0], reach.get(names[k])) for k in sized}

    def body(*refs):
        bound = dict(arguments)
        for name, ref in zip(tensors, refs):
            bound[name] = HBMTensor(name, arguments[name].shape, arguments[name].dtype, ref)
        for name, ref in zip(scalars, refs[len(tensors):]):
            bound[name] = ref[0]
        out_refs = dict(zip(sized, refs[len(inputs):]))
        ctx = PallasLowering(kernel.name, grid, [pl.program_id(a) for a in range(len(grid))], reach, blocks,
                             [out_refs.get(k) for k in range(len(names))])
        with Active(ctx):
            kernel.fn(**bound)

    blocks = plan["blocks"]
    results = pl.pallas_call(
        body, out_shape=[jax.ShapeDtypeStruct(padded[names[k]], plan["outputs"][k][1]) for k in sized],
        grid=grid, in_specs=[_spec(blocks.get(n)) for n in tensors] + [_spec(None)] * len(scalars),
        out_specs=[_spec(blocks.get(names[k])) for k in sized], interpret=interpret, name=kernel.name,
        compiler_params=None if interpret else plgpu.CompilerParams())(*inputs)
    outputs = [jnp.zeros(shape, dtype) for shape, dtype in plan["outputs"]]
    for k, result in zip(sized, results):
        pads = reach.get(names[k], ((0, 0),) * result.ndim)
        outputs[k] = result[tuple(slice(lo, lo + n) for (lo, _), n in zip(pads, plan["outputs"][k][0]))]
    picked = [outputs[i] for i in plan["returned"]]
    return picked[0] if plan["returned"].single else tuple(picked)


def _spec(block):
    """A blocked tensor's BlockSpec (block indices: program ids, 0 where the block spans the dimension); the
    whole array for the others."""
    if block is None:
        return pl.no_block_spec
    axes, sizes = block
    return pl.BlockSpec(sizes, lambda *pids: tuple(0 if a is None else pids[a] for a in axes))


def _grown(shape, pads):
    return tuple(shape) if pads is None else tuple(n + lo + hi for n, (lo, hi) in zip(shape, pads))


def _plan(kernel, grid, arguments):
    found = {}

    def trace(values):
        ctx = _Planner(kernel.name, grid, list(values))
        with Active(ctx):
            returned = kernel.fn(**arguments)
        found.update(outputs=[(t.shape, t.dtype) for t in ctx.outputs],
                     returned=_returned(kernel, returned, ctx.outputs),
                     reach={name: pads for name, pads in ctx.reach.items() if any(p != (0, 0) for p in pads)},
                     blocks={name: block for name, block in ctx.blocks.items() if block is not None})

    jax.eval_shape(trace, [jax.ShapeDtypeStruct((), jnp.int32) for _ in grid])
    return found
