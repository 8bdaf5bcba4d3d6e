"""The tile language: HBM tensors, on-chip tiles, and the operations a kernel body calls.

Tiles live in `sbuf` or `psum`; axis 0 of a tile is its partition axis (at most 128), the rest its free
axes. Indexing a tile gives a view whose values are read when an operation uses it; `t[...] = v` and
`t += v` write the tile's memory. HBM tensors (the kernel's arguments and the outputs it allocates) are
reached only through `load` and `store`. The same code runs in the NumPy simulator and the JAX lowering:
each operation asks the current interpreter (`context.current()`) for its array module and memory.
"""
import builtins
import math
import weakref

import ml_dtypes
import numpy as np

from .context import MATMUL_FREE, PARTITIONS, PSUM_BANK_BYTES, PSUM_BANKS, SBUF_BYTES, KernelError, current

float32 = np.dtype("float32")
float16 = np.dtype("float16")
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float64 = np.dtype("float64")
int32 = np.dtype("int32")
uint32 = np.dtype("uint32")
bool_ = np.dtype("bool")


class _Buffer:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


sbuf, psum, hbm = _Buffer("sbuf"), _Buffer("psum"), _Buffer("hbm")


def as_dtype(dtype) -> np.dtype:
    """A NumPy dtype from a NumPy dtype, a torch dtype or a name."""
    if dtype is None or isinstance(dtype, np.dtype):
        return dtype
    if hasattr(dtype, "is_floating_point"):  # a torch.dtype
        from ..runtime.dtypes import to_jax
        return np.dtype(to_jax(dtype))
    return np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """Elementwise arithmetic runs in float32 (float64 stays float64), as the engines compute."""
    if dtype.kind == "f" or dtype == bfloat16:
        return float64 if dtype == float64 else float32
    return dtype


# ---------------------------------------------------------------------------------------------- memory

class Memory:
    """An allocation in sbuf or psum: its array, and the checker's bookkeeping (allocation order, the loop
    iterations it was made in). Capacity is returned when the last tile referring to it goes away."""
    __slots__ = ("data", "kind", "seq", "iters", "__weakref__")

    def __init__(self, data, kind, seq, iters):
        self.data, self.kind, self.seq, self.iters = data, kind, seq, iters


class Interpreter:
    """What the simulator and the lowering share: allocation with the hardware's limits."""

    def __init__(self, kernel_name, grid, xp):
        self.kernel_name, self.grid, self.xp = kernel_name, tuple(grid), xp
        self.live = {sbuf: 0, psum: 0}
        self.seq = 0
        self.floor = 0  # inside an nk.fori body: memories made before it are read-only
        self.fori_depth = 0

    def allocate(self, data, kind) -> Memory:
        data = self.own(data)
        shape = data.shape
        if not shape:
            data, shape = data.reshape(1), (1,)
        if shape[0] > PARTITIONS:
            raise KernelError("partition", f"a {kind} tile of shape {tuple(shape)} has {shape[0]} partitions; "
                                           f"at most {PARTITIONS}")
        per_partition = math.prod(shape[1:]) * data.dtype.itemsize
        if kind is psum:
            if per_partition > PSUM_BANK_BYTES:
                raise KernelError("psum", f"a psum tile of shape {tuple(shape)} ({data.dtype}) needs "
                                          f"{per_partition} bytes per partition; a bank holds {PSUM_BANK_BYTES}")
            cost, limit, what = 1, PSUM_BANKS, "banks"
        else:
            cost, limit, what = per_partition, SBUF_BYTES, "bytes per partition"
        if self.live[kind] + cost > limit:
            raise KernelError("psum" if kind is psum else "sbuf-capacity",
                              f"allocating a {kind} tile of shape {tuple(shape)} ({data.dtype}) needs {cost} "
                              f"{what} more than the {limit - self.live[kind]} left of {limit}")
        self.live[kind] += cost
        self.seq += 1
        memory = Memory(data, kind, self.seq, self.iterations())
        weakref.finalize(memory, self._free, kind, cost)
        return memory

    def own(self, data):
        """The array a new allocation holds (the simulator copies: NumPy arrays alias)."""
        return data

    def _free(self, kind, cost):
        self.live[kind] -= cost

    def iterations(self):
        return ()

    def access(self, target, kind, region):
        """The simulator logs accesses to find races; the lowering has nothing to check."""

    def assign(self, memory, slices, value):
        raise NotImplementedError


def _tile(data, kind=sbuf) -> "Tile":
    memory = current().allocate(data, kind)
    return Tile(memory, tuple((0, n) for n in memory.data.shape))


class Tile:
    """A view of an on-chip allocation: `region` is its (start, stop) along each axis."""
    __slots__ = ("memory", "region")

    def __init__(self, memory, region):
        self.memory, self.region = memory, region

    @property
    def shape(self):
        return tuple(b - a for a, b in self.region)

    @property
    def dtype(self):
        return self.memory.data.dtype

    @property
    def buffer(self):
        return self.memory.kind

    def _slices(self):
        return tuple(slice(a, b) for a, b in self.region)

    def read(self):
        current().access(self.memory, "read", self.region)
        data = self.memory.data
        return data if self.shape == data.shape else data[self._slices()]

    def _sub_region(self, index):
        index = index if isinstance(index, tuple) else (index,)
        if any(i is Ellipsis for i in index):
            at = index.index(Ellipsis)
            index = index[:at] + (slice(None),) * (len(self.region) - len(index) + 1) + index[at + 1:]
        if len(index) > len(self.region):
            raise KernelError("index", f"{len(index)} indices for a tile of {len(self.region)} axes")
        region = []
        for (lo, hi), i in zip(self.region, index + (slice(None),) * (len(self.region) - len(index))):
            if not isinstance(i, slice) or i.step not in (None, 1) or not all(
                    isinstance(v, (int, type(None))) for v in (i.start, i.stop)):
                raise KernelError("index", f"tiles are indexed with int slices (start:stop), got {i!r}")
            start = lo + (i.start or 0)
            stop = lo + (hi - lo if i.stop is None else i.stop)
            if not lo <= start <= stop <= hi:
                raise KernelError("out-of-bounds", f"slice {i.start}:{i.stop} of a tile axis of size {hi - lo}")
            region.append((start, stop))
        return tuple(region)

    def __getitem__(self, index):
        return Tile(self.memory, self._sub_region(index))

    def __setitem__(self, index, value):
        target = Tile(self.memory, self._sub_region(index))
        if isinstance(value, Tile) and value.memory is self.memory and value.region == target.region:
            return  # `t[i] += v` already wrote through the view
        target._write(value, "write")

    def _write(self, value, kind):
        ctx = current()
        if self.memory.seq <= ctx.floor:
            raise KernelError("fori", "a tile made outside an nk.fori body is written inside it; pass it in the "
                                      "carry and return its new value")
        array = _array(value)
        if not _fits(array.shape, self.shape):
            raise KernelError("shape", f"cannot write a value of shape {tuple(array.shape)} into a tile "
                                       f"view of shape {self.shape}")
        ctx.access(self.memory, kind, self.region)
        ctx.assign(self.memory, self._slices(), ctx.xp.broadcast_to(array, self.shape).astype(self.dtype))

    def _inplace(self, fn, other):
        if fn is add:  # an accumulation: its read is part of the update, not a separate access
            self._write(fn(_Accumulated(self.memory, self.region), other), "accumulate")
        else:
            self._write(fn(self, other), "write")
        return self

    def __iadd__(self, other):
        return self._inplace(add, other)

    def __isub__(self, other):
        return self._inplace(subtract, other)

    def __imul__(self, other):
        return self._inplace(multiply, other)

    def __itruediv__(self, other):
        return self._inplace(divide, other)

    def astype(self, dtype):
        return _tile(self.read().astype(as_dtype(dtype)))

    def __repr__(self):
        return f"Tile({self.shape}, {self.dtype}, {self.buffer})"

    def __bool__(self):
        raise KernelError("control-flow", "a tile's value is not known while the kernel is traced: use "
                                          "nk.where instead of if/and/or on tiles")


class _Accumulated(Tile):
    __slots__ = ()

    def read(self):
        data = self.memory.data
        return data if self.shape == data.shape else data[self._slices()]


def _fits(shape, target) -> bool:
    """A value of `shape` broadcasts to `target` without growing it."""
    try:
        return np.broadcast_shapes(tuple(shape), tuple(target)) == tuple(target)
    except ValueError:
        return False


def _array(x):
    """The array behind an operand: a tile's values, a program id's value, or a Python number."""
    if isinstance(x, Tile):
        return x.read()
    if isinstance(x, Index):
        return x.value
    return current().xp.asarray(x)


def _result_dtype(operands, dtype=None):
    if dtype is not None:
        return as_dtype(dtype)
    typed = [x.dtype for x in operands if isinstance(x, Tile)]
    if not typed:
        return float32 if any(isinstance(x, float) for x in operands) else int32
    result = typed[0]
    for t in typed[1:]:
        result = np.promote_types(result, t)
    if result.kind in "iub" and any(isinstance(x, float) for x in operands):
        return float32
    return result


def _elementwise(fn, *operands, dtype=None, compute=None):
    """Apply `fn(xp, *arrays)` with non-bool operands in the compute dtype; the result is a new sbuf tile."""
    ctx = current()
    promoted = _result_dtype(operands)
    compute = compute or _compute_dtype(promoted)
    arrays = [_array(x) for x in operands]
    arrays = [a if a.dtype == bool_ else a.astype(compute) for a in arrays]
    return _tile(fn(ctx.xp, *arrays).astype(as_dtype(dtype) or promoted))


def _binary(name, fn, result_dtype=None):
    def op(x, y, *, dtype=None):
        return _elementwise(fn, x, y, dtype=dtype or result_dtype)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Elementwise {name} of two tiles (or a tile and a scalar), broadcasting as NumPy does."
    return op


add = _binary("add", lambda xp, a, b: a + b)
subtract = _binary("subtract", lambda xp, a, b: a - b)
multiply = _binary("multiply", lambda xp, a, b: a * b)
divide = _binary("divide", lambda xp, a, b: a / b)
maximum = _binary("maximum", lambda xp, a, b: xp.maximum(a, b))
minimum = _binary("minimum", lambda xp, a, b: xp.minimum(a, b))
power = _binary("power", lambda xp, a, b: a ** b)
remainder = _binary("remainder", lambda xp, a, b: a % b)
floor_divide = _binary("floor_divide", lambda xp, a, b: a // b)
less = _binary("less", lambda xp, a, b: a < b, bool_)
less_equal = _binary("less_equal", lambda xp, a, b: a <= b, bool_)
greater = _binary("greater", lambda xp, a, b: a > b, bool_)
greater_equal = _binary("greater_equal", lambda xp, a, b: a >= b, bool_)
equal = _binary("equal", lambda xp, a, b: a == b, bool_)
not_equal = _binary("not_equal", lambda xp, a, b: a != b, bool_)
logical_and = _binary("logical_and", lambda xp, a, b: a & b, bool_)
logical_or = _binary("logical_or", lambda xp, a, b: a | b, bool_)


def _sigmoid(xp, a):
    return 1 / (1 + xp.exp(-a))


_UNARY = {
    "exp": lambda xp, a: xp.exp(a),
    "log": lambda xp, a: xp.log(a),
    "tanh": lambda xp, a: xp.tanh(a),
    "sigmoid": _sigmoid,
    "relu": lambda xp, a: xp.maximum(a, 0),
    "silu": lambda xp, a: a * _sigmoid(xp, a),
    "gelu": lambda xp, a: 0.5 * a * (1 + xp.tanh(0.7978845608028654 * (a + 0.044715 * a * a * a))),
    "sqrt": lambda xp, a: xp.sqrt(a),
    "rsqrt": lambda xp, a: 1 / xp.sqrt(a),
    "reciprocal": lambda xp, a: 1 / a,
    "abs": lambda xp, a: xp.abs(a),
    "square": lambda xp, a: a * a,
    "negative": lambda xp, a: -a,
    "sin": lambda xp, a: xp.sin(a),
    "cos": lambda xp, a: xp.cos(a),
    "logical_not": lambda xp, a: ~a,
}


_INTEGRAL_STAYS = {"relu", "abs", "square", "negative", "logical_not"}


def _unary(name, fn):
    def op(x, *, dtype=None):
        if dtype is None and name not in _INTEGRAL_STAYS and _result_dtype([x]).kind in "iub":
            dtype = float32  # as torch.exp of an int tensor: a float result
        return _elementwise(fn, x, dtype=dtype, compute=float32 if dtype == float32 else None)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Elementwise {name} of a tile (gelu: the tanh approximation)."
    return op


exp, log, tanh, sigmoid, relu, silu, gelu, sqrt, rsqrt, reciprocal, abs, square, negative, sin, cos, \
    logical_not = (_unary(name, fn) for name, fn in _UNARY.items())


def _swap(fn):
    return lambda self, other: fn(other, self)


for _name, _fn in (("add", add), ("sub", subtract), ("mul", multiply), ("truediv", divide), ("pow", power),
                   ("mod", remainder), ("floordiv", floor_divide)):
    setattr(Tile, f"__{_name}__", _fn)
    setattr(Tile, f"__r{_name}__", _swap(_fn))
for _name, _fn in (("lt", less), ("le", less_equal), ("gt", greater), ("ge", greater_equal),
                   ("and", logical_and), ("or", logical_or)):
    setattr(Tile, f"__{_name}__", _fn)
Tile.__neg__ = negative
Tile.__invert__ = logical_not
Tile.__eq__ = equal
Tile.__ne__ = not_equal
Tile.__hash__ = None


def where(condition, x, y, *, dtype=None):
    """`x` where `condition` holds, else `y`."""
    return _elementwise(lambda xp, c, a, b: xp.where(c, a, b), condition, x, y,
                        dtype=dtype or _result_dtype([x, y]))


def _free_axis(x, axis):
    axis = axis + len(x.shape) if axis < 0 else axis
    if axis == 0:
        raise KernelError("reduction-axis", "reductions run along a free axis; transpose to reduce across "
                                            "partitions")
    return axis


def _reduction(name, fn):
    def op(x, axis=-1, *, keepdims=True, dtype=None):
        axis = _free_axis(x, axis)
        return _elementwise(lambda xp, a: fn(xp, a, axis, keepdims), x, dtype=dtype)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"{name} along a free axis of a tile (keepdims by default: the result is [P, 1])."
    return op


sum = _reduction("sum", lambda xp, a, axis, k: xp.sum(a, axis=axis, keepdims=k))
max = _reduction("max", lambda xp, a, axis, k: xp.max(a, axis=axis, keepdims=k))
min = _reduction("min", lambda xp, a, axis, k: xp.min(a, axis=axis, keepdims=k))
mean = _reduction("mean", lambda xp, a, axis, k: xp.mean(a, axis=axis, keepdims=k))


def matmul(x, y, *, transpose_x: bool = False):
    """x @ y into a new psum tile in float32: x [M, K] (or [K, M] with transpose_x) and y [K, N] with
    K, M <= 128 and N <= 512. Accumulate with `acc += matmul(...)` into a psum tile."""
    xs = x.shape if transpose_x else x.shape[::-1]
    (k, m), (k2, n) = xs, y.shape
    if len(x.shape) != 2 or len(y.shape) != 2 or k != k2:
        raise KernelError("shape", f"matmul of {x.shape}{' (transposed)' if transpose_x else ''} and {y.shape}")
    if k > PARTITIONS or m > PARTITIONS:
        raise KernelError("partition", f"matmul contracts {k} and makes {m} rows; both at most {PARTITIONS}")
    if n > MATMUL_FREE:
        raise KernelError("psum", f"matmul output free size {n} > {MATMUL_FREE} float32 (one psum bank)")
    ctx = current()
    a, b = x.read(), y.read()
    a = a.T if transpose_x else a
    return _tile(ctx.matmul(a, b), psum)


def transpose(x):
    """[P, F] -> [F, P] (F <= 128: it becomes the partition axis)."""
    if len(x.shape) != 2:
        raise KernelError("shape", f"transpose takes a 2-D tile, got {x.shape}")
    return _tile(x.read().T)


def copy(x, *, dtype=None, buffer=sbuf):
    """A new tile holding `x`'s values (psum -> sbuf, or a dtype conversion)."""
    return _tile(_array(x).astype(as_dtype(dtype) or x.dtype), buffer)


def broadcast_to(x, shape):
    return _tile(current().xp.broadcast_to(_array(x), tuple(shape)))


def iota(shape, axis=0, *, dtype=int32):
    """A tile whose values count along `axis` (0, 1, 2, ...)."""
    xp = current().xp
    shape = tuple(shape)
    ramp = xp.arange(shape[axis], dtype=as_dtype(dtype)).reshape([-1 if i == axis else 1
                                                                  for i in range(len(shape))])
    return _tile(xp.broadcast_to(ramp, shape))


def ndarray(shape, dtype, *, buffer=sbuf):
    """Allocate a tile (contents zero) or, with buffer=hbm, an output tensor of the kernel."""
    return full(shape, 0, dtype, buffer=buffer)


def zeros(shape, dtype, *, buffer=sbuf):
    return full(shape, 0, dtype, buffer=buffer)


def full(shape, value, dtype, *, buffer=sbuf):
    dtype, shape = as_dtype(dtype), tuple(int(s) for s in shape)
    ctx = current()
    if buffer is hbm:
        return ctx.output(shape, dtype)
    if buffer not in (sbuf, psum):
        raise KernelError("buffer", f"buffer must be nk.sbuf, nk.psum or nk.hbm, got {buffer!r}")
    return _tile(ctx.xp.full(shape, value, dtype), buffer)


_MIX = (0x7FEB352D, 0x846CA68B)


def random_uniform(seed, counter):
    """Uniform float32 in [0, 1) from a counter-based hash of (seed, counter): the same bits in the
    simulator and the lowering, and again wherever the same counters are drawn (a backward pass
    regenerates its forward's dropout mask)."""
    def bits(xp, s, c):
        h = (c.astype(uint32) * np.uint32(0x9E3779B9)) ^ s.astype(uint32)
        for m in _MIX:
            h = h ^ (h >> np.uint32(16))
            h = h * np.uint32(m)
        h = h ^ (h >> np.uint32(15))
        return (h >> np.uint32(8)).astype(float32) * np.float32(1.0 / (1 << 24))
    return _elementwise(bits, seed, counter, dtype=float32, compute=uint32)


# ---------------------------------------------------------------------------------------------- HBM

class Index:
    """A program id of a lowered grid, or an affine function of program ids: a traced value with its exact
    form (so that a slice's size is known) and its bounds (so that the checker can see past its value)."""
    __slots__ = ("value", "terms", "const", "lo", "hi")

    def __init__(self, value, terms, const, lo, hi):
        self.value, self.terms, self.const, self.lo, self.hi = value, terms, const, lo, hi

    @staticmethod
    def program(value, axis, size):
        return Index(value, ((axis, 1, size),), 0, 0, size - 1)

    def _affine(self, terms, const):
        merged = {}
        for axis, coef, size in terms:
            merged[axis] = (merged.get(axis, (0, size))[0] + coef, size)
        terms = tuple((a, c, s) for a, (c, s) in sorted(merged.items(), key=lambda kv: str(kv[0])) if c)
        if not terms:
            return const
        lo = const + builtins.sum(builtins.min(0, c * (s - 1)) for _, c, s in terms)
        hi = const + builtins.sum(builtins.max(0, c * (s - 1)) for _, c, s in terms)
        value = const + builtins.sum(current().program_values[a] * c for a, c, _ in terms)
        return Index(value, terms, const, lo, hi)

    def __add__(self, other):
        if isinstance(other, int):
            return Index(self.value + other, self.terms, self.const + other, self.lo + other, self.hi + other)
        if isinstance(other, Index):
            if self.terms is None or other.terms is None:
                return Index(self.value + other.value, None, 0, self.lo + other.lo, self.hi + other.hi)
            return self._affine(self.terms + other.terms, self.const + other.const)
        return NotImplemented

    __radd__ = __add__

    def __mul__(self, other):
        if not isinstance(other, int):
            return NotImplemented
        if self.terms is None:
            lo, hi = sorted((self.lo * other, self.hi * other))
            return Index(self.value * other, None, 0, lo, hi)
        return self._affine(tuple((a, c * other, s) for a, c, s in self.terms), self.const * other)

    __rmul__ = __mul__

    def __neg__(self):
        return self * -1

    def __sub__(self, other):
        return self + (-other)

    def __rsub__(self, other):
        return (-self) + other

    def __floordiv__(self, other):
        if not isinstance(other, int) or other <= 0:
            return NotImplemented
        return Index(self.value // other, None, 0, self.lo // other, self.hi // other)

    def __mod__(self, other):
        if not isinstance(other, int) or other <= 0:
            return NotImplemented
        return Index(self.value % other, None, 0, 0, other - 1)

    def __index__(self):
        raise KernelError("control-flow", "a program id is not a Python int in the lowering: use it in "
                                          "slices and arithmetic, not in range() or if")

    __bool__ = __int__ = __index__


class ds:
    """A dynamic slice: `size` elements from `start` (an int, a program id or a loop index)."""
    __slots__ = ("start", "size")

    def __init__(self, start, size):
        self.start, self.size = start, size


def _bounds(v):
    return (v.lo, v.hi) if isinstance(v, Index) else (v, v)


class HBMTensor:
    """A kernel argument or output in device memory; `x[...]` gives a view for load/store."""

    def __init__(self, name, shape, dtype, data, output=False):
        self.name, self.shape, self.dtype, self.data, self.output = name, tuple(shape), np.dtype(dtype), data, output
        self.seq, self.iters = -1, ()

    @property
    def ndim(self):
        return len(self.shape)

    def __getitem__(self, index):
        return HBMView(self, index if isinstance(index, tuple) else (index,))

    def __repr__(self):
        return f"{'output' if self.output else 'argument'} {self.name!r} {self.shape} {self.dtype}"


class HBMView:
    """A rectangular window of an HBM tensor: per dimension a start and a size, kept or dropped (an int
    index), and new axes (None)."""

    def __init__(self, tensor, index):
        self.tensor = tensor
        ellipses = [at for at, i in enumerate(index) if i is Ellipsis]
        if len(ellipses) > 1:
            raise KernelError("index", "one ... per index")
        if ellipses:
            at = ellipses[0]
            named = builtins.sum(i is not None for i in index) - 1
            index = index[:at] + (slice(None),) * (tensor.ndim - named) + index[at + 1:]
        if builtins.sum(i is not None for i in index) > tensor.ndim:
            raise KernelError("index", f"too many indices for {tensor}")
        index = index + (slice(None),) * (tensor.ndim - builtins.sum(i is not None for i in index))
        self.starts, self.sizes, self.layout = [], [], []  # layout: tensor dim kept, None (new) per tile axis
        dim = 0
        for i in index:
            if i is None:
                self.layout.append(None)
                continue
            start, size, keep = self._window(i, tensor.shape[dim])
            self.starts.append(start)
            self.sizes.append(size)
            if keep:
                self.layout.append(dim)
            dim += 1

    def _window(self, i, extent):
        if isinstance(i, ds):
            return i.start, int(i.size), True
        if isinstance(i, slice):
            if i.step not in (None, 1):
                raise KernelError("index", "HBM slices take no step")
            start = 0 if i.start is None else i.start
            stop = extent if i.stop is None else i.stop
            size = stop - start
            if not isinstance(size, int):
                raise KernelError("index", "a slice's size must be known: write x[nk.ds(start, size)] or "
                                           "start:start+size")
            return start, size, True
        if isinstance(i, Tile):
            if len(i.shape) != 2 or i.shape[1] != 1 or i.dtype.kind not in "iu":
                raise KernelError("index", f"an indirect index is an int tile of shape [P, 1], got {i!r}")
            return i, i.shape[0], True
        if isinstance(i, Index):
            return i, 1, False
        if isinstance(i, (int, np.integer)):
            return int(i), 1, False
        raise KernelError("index", f"HBM tensors are indexed with ints, slices, nk.ds and program ids, got {i!r}")

    @property
    def shape(self):
        return tuple(1 if d is None else self.sizes[d] for d in self.layout)

    def out_of_bounds(self):
        """(dim, lo, hi) of the first dimension whose window may leave the tensor, else None."""
        for d, (start, size) in enumerate(zip(self.starts, self.sizes)):
            if isinstance(start, Tile):
                continue  # an indirect index: its values are checked where they are known (the simulator)
            lo, hi = _bounds(start)
            if lo < 0 or hi + size > self.tensor.shape[d]:
                return d, lo, hi + size
        return None

    def describe(self):
        return f"{self.tensor}, window start {[_bounds(s) if isinstance(s, Index) else s for s in self.starts]} " \
               f"size {self.sizes}"

    @property
    def indirect(self):
        return any(isinstance(s, Tile) for s in self.starts)

    def region(self):
        return tuple((s, s + n) for s, n in zip(self.starts, self.sizes))


def _mask_array(mask, shape):
    if mask is None:
        return None
    array = _array(mask)
    if array.dtype != bool_:
        raise KernelError("mask", f"a mask is a bool tile, got {array.dtype}")
    return current().xp.broadcast_to(array, shape)


def expect(tensor, *, dtype=None, shape=None):
    """Check a kernel argument: `dtype` one dtype or a tuple of them, `shape` a tuple whose None entries
    match any size. A mismatch is a KernelError naming the argument (rule "argument")."""
    if not isinstance(tensor, HBMTensor):
        raise KernelError("argument", f"expect() checks a tensor argument, got {type(tensor).__name__}")
    if dtype is not None:
        allowed = tuple(as_dtype(d) for d in (dtype if isinstance(dtype, (tuple, list)) else (dtype,)))
        if tensor.dtype not in allowed:
            raise KernelError("argument", f"{tensor} must have dtype {' or '.join(str(d) for d in allowed)}")
    if shape is not None and (len(shape) != tensor.ndim or any(
            want is not None and want != got for want, got in zip(shape, tensor.shape))):
        wanted = ", ".join("*" if n is None else str(n) for n in shape)
        raise KernelError("argument", f"{tensor} must have shape ({wanted})")


def load(src, *, mask=None, other=0, dtype=None):
    """Copy an HBM window into a new sbuf tile. Elements where `mask` is False (it broadcasts against the
    tile) read `other`; a window reaching outside the tensor must mask those elements off. An int tile
    [P, 1] as the index of a dimension gathers those P rows (an indirect load)."""
    ctx = current()
    if not isinstance(src, HBMView):
        raise KernelError("load", f"load takes an HBM tensor window (x[...]), got {type(src).__name__}")
    if src.tensor.output:
        raise KernelError("write-only", f"load from {src.tensor}: a kernel's outputs are write-only; keep "
                                        "values it needs again in sbuf")
    shape = src.shape
    if shape and shape[0] > PARTITIONS:
        raise KernelError("partition", f"load of {src.describe()} makes a tile with {shape[0]} partitions; at "
                                       f"most {PARTITIONS}")
    mask_array = _mask_array(mask, shape)
    if mask_array is None and src.out_of_bounds() is not None:
        d, lo, hi = src.out_of_bounds()
        raise KernelError("out-of-bounds", f"load of {src.describe()} reaches [{lo}, {hi}) of dimension {d} "
                                           f"(size {src.tensor.shape[d]}) without a mask")
    data = ctx.load(src, mask_array, other)
    return _tile(data.astype(as_dtype(dtype) or src.tensor.dtype))


def store(dst, value, *, mask=None):
    """Write a tile (or a scalar) into an output's window; only elements where `mask` holds are written."""
    ctx = current()
    if not isinstance(dst, HBMView):
        raise KernelError("store", f"store takes an HBM tensor window (out[...]), got {type(dst).__name__}")
    if dst.indirect:
        raise NotImplementedError("torchneuron.kernels: stores through an indirect (tile) index are not supported; "
                                  "gather with load instead, or report the use case at the project's issue tracker")
    if ctx.fori_depth:
        raise KernelError("fori", "an nk.fori body stores; return the values in the carry and store after the loop")
    if not dst.tensor.output:
        raise KernelError("read-only", f"store into {dst.tensor}: arguments are read-only; allocate an "
                                       "output with nk.ndarray(shape, dtype, buffer=nk.hbm)")
    array = _array(value)
    shape = dst.shape
    if not _fits(array.shape, shape):
        raise KernelError("shape", f"store of a value of shape {tuple(array.shape)} into {dst.describe()} "
                                   f"(shape {shape})")
    array = ctx.xp.broadcast_to(array, shape).astype(dst.tensor.dtype)
    mask_array = _mask_array(mask, shape)
    if mask_array is None and dst.out_of_bounds() is not None:
        d, lo, hi = dst.out_of_bounds()
        raise KernelError("out-of-bounds", f"store to {dst.describe()} reaches [{lo}, {hi}) of dimension {d} "
                                           f"(size {dst.tensor.shape[d]}) without a mask")
    ctx.store(dst, array, mask_array)


# ---------------------------------------------------------------------------------------------- control

def program_id(axis: int = 0):
    """This program's index along `axis` of the launch grid."""
    return current().program_id(axis)


def num_programs(axis: int = 0) -> int:
    return current().grid[axis]


def fori(n: int, body, carry):
    """carry = body(i, *carry) for i in 0..n-1, as one loop: the lowering emits a loop (compiled once, however
    large n) instead of unrolling. `carry` is a tuple of tiles; `body` returns new tiles of the same shapes
    and dtypes, may load (i is a loop index usable in windows) but not store, and writes no tile made
    outside it."""
    carry = tuple(carry)
    if not all(isinstance(t, Tile) for t in carry):
        raise KernelError("fori", "the carry of nk.fori is a tuple of tiles")
    return current().fori(int(n), body, carry)


def _check_carry(before, after):
    after = tuple(after) if isinstance(after, (tuple, list)) else (after,)
    if len(after) != len(before) or any(not isinstance(a, Tile) or (a.shape, a.dtype) != (b.shape, b.dtype)
                                        for a, b in zip(after, before)):
        raise KernelError("fori", f"an nk.fori body returned {after!r} for a carry of {before!r}")
    return after


def affine_range(n: int):
    """A loop whose iterations are independent (the checker reports values carried between them and
    overlapping writes as races); accumulating into a tile with += is allowed."""
    return current().loop("affine", n)


def sequential_range(n: int):
    """A loop whose iterations run in order and may carry state from one to the next."""
    return current().loop("sequential", n)


def window_indices(xp, view):
    """Per-dimension index arrays of an HBM window (broadcasting to its sizes), clipped into the tensor,
    and where they were in bounds."""
    nd, extent = len(view.sizes), view.tensor.shape
    indices, valid = [], True
    for d, (start, size) in enumerate(zip(view.starts, view.sizes)):
        shape = [size if e == d else 1 for e in range(nd)]
        if isinstance(start, Tile):
            idx = start.read().reshape(shape)
        else:
            start = start.value if isinstance(start, Index) else start
            idx = (start + xp.arange(size)).reshape(shape)
        valid = valid & (idx >= 0) & (idx < extent[d])
        indices.append(xp.clip(idx, 0, extent[d] - 1))
    return tuple(indices), xp.broadcast_to(valid, tuple(view.sizes))
