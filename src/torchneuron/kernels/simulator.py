"""The simulator: runs a kernel's tile program on NumPy, one program of the grid after another, and checks
what the hardware would not forgive (races between independent iterations and programs, out-of-bounds
elements that no mask covers) on top of the limits every interpreter checks (language.Interpreter)."""
import numpy as np

from .context import KernelError, user_line
from .language import HBMTensor, Interpreter, _check_carry, copy, float32, window_indices


class _Independent:
    """An affine_range loop or the launch grid: accesses of memory from outside it, per iteration."""

    def __init__(self, unit, start):
        self.unit, self.start, self.iteration = unit, start, None
        self.log = {}


def _overlap(a, b):
    return all(x0 < y1 and y0 < x1 for (x0, x1), (y0, y1) in zip(a, b))


_COMPATIBLE = {("read", "read"), ("accumulate", "accumulate")}


class Simulator(Interpreter):
    def __init__(self, kernel_name, grid):
        super().__init__(kernel_name, grid, np)
        self.loops, self.outputs, self.output_at, self.pid = [], [], 0, ()

    def run(self, fn, arguments):
        grid = _Independent("program", self.seq)
        self.loops = [grid]
        result = None
        for n, pid in enumerate(np.ndindex(*self.grid)):
            grid.iteration, self.pid, self.output_at = pid, pid, 0
            result = fn(**arguments)
        return result

    def own(self, data):
        return np.array(data)

    def iterations(self):
        return tuple((id(loop), loop.iteration) for loop in self.loops)

    def program_id(self, axis):
        return self.pid[axis]

    def matmul(self, a, b):
        return np.matmul(a.astype(float32), b.astype(float32))

    def assign(self, memory, slices, value):
        memory.data[slices] = value

    def output(self, shape, dtype):
        if self.output_at < len(self.outputs):
            tensor = self.outputs[self.output_at]
            if (tensor.shape, tensor.dtype) != (shape, dtype):
                raise KernelError("output", f"programs allocate different outputs: {tensor} and {shape} {dtype}")
        else:
            tensor = HBMTensor(f"output {self.output_at}", shape, dtype, np.zeros(shape, dtype), output=True)
            self.outputs.append(tensor)
        self.output_at += 1
        return tensor

    def fori(self, n, body, carry):
        for i in range(n):
            floor, self.floor = self.floor, self.seq
            self.fori_depth += 1
            try:  # the body gets its own copies, as the lowering's loop does
                carry = _check_carry(carry, body(i, *(copy(t, buffer=t.buffer) for t in carry)))
            finally:
                self.floor = floor
                self.fori_depth -= 1
        return carry

    def loop(self, kind, n):
        return range(n) if kind == "sequential" else self._affine(n)

    def _affine(self, n):
        loop = _Independent("affine_range iteration", self.seq)
        self.loops.append(loop)
        try:
            for i in range(n):
                loop.iteration = i
                yield i
        finally:
            self.loops.remove(loop)

    def access(self, target, kind, region):
        if isinstance(target, HBMTensor) and not target.output:
            return  # arguments are read-only
        key = target.name if isinstance(target, HBMTensor) else target.seq
        for loop in self.loops:
            if target.seq > loop.start:  # made inside the loop: private to the iteration that made it
                born = dict(target.iters).get(id(loop))
                if born != loop.iteration:
                    raise KernelError("race", f"a tile made in {loop.unit} {born} is used in {loop.unit} "
                                              f"{loop.iteration}; carry state with sequential_range")
                continue
            entries = loop.log.setdefault(key, [])
            for iteration, other, other_region, where in entries:
                if iteration != loop.iteration and (kind, other) not in _COMPATIBLE and \
                        _overlap(region, other_region):
                    raise KernelError("race", f"{kind} of {_name(target)} {list(region)} in {loop.unit} "
                                              f"{loop.iteration} overlaps a {other} of {list(other_region)} in "
                                              f"{loop.unit} {iteration} (at line {where})")
            entries.append((loop.iteration, kind, region, user_line()[1]))

    def load(self, view, mask, other):
        data = view.tensor.data
        if mask is None and not view.indirect:
            return data[tuple(slice(s, s + n) for s, n in zip(view.starts, view.sizes))].reshape(view.shape)
        mask = np.ones(view.shape, bool) if mask is None else mask
        indices, valid = window_indices(np, view)
        valid = valid.reshape(view.shape)
        _check_masked(view, valid, mask, "load")
        return np.where(mask & valid, data[indices].reshape(view.shape), np.asarray(other).astype(data.dtype))

    def store(self, view, value, mask):
        tensor = view.tensor
        if mask is None:
            self.access(tensor, "write", view.region())
            tensor.data[tuple(slice(s, s + n) for s, n in zip(view.starts, view.sizes))] = value.reshape(view.sizes)
            return
        indices, valid = window_indices(np, view)
        _check_masked(view, valid.reshape(view.shape), mask, "store")
        region = tuple((max(s, 0), min(s + n, e)) for s, n, e in zip(view.starts, view.sizes, tensor.shape))
        self.access(tensor, "write", region)
        chosen = (mask.reshape(view.sizes) & valid)
        tensor.data[tuple(np.broadcast_to(i, view.sizes)[chosen] for i in indices)] = \
            value.reshape(view.sizes)[chosen]


def _name(target):
    return target if isinstance(target, HBMTensor) else f"a {target.kind} tile"


def _check_masked(view, valid, mask, what):
    outside = mask & ~valid
    if outside.any():
        at = tuple(int(i[0]) for i in np.nonzero(outside))
        raise KernelError("out-of-bounds", f"{what} of {view.describe()}: tile element {at} is outside the tensor "
                                           "and the mask does not cover it")
