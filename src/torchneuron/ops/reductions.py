"""Reductions: sums, means, extrema, statistics, scans."""
import functools
import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ..runtime.dtypes import to_jax
from .promotion import opmath
from .registry import META, checked_meta, floating_only, lower

aten = torch.ops.aten


def _axes(x, dim):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    return tuple(d % max(x.ndim, 1) for d in dims) if x.ndim else None


def _accumulate_dtype(x, dtype):
    if dtype is not None:
        return to_jax(dtype)
    if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_:
        return jnp.int64
    return x.dtype


@lower(aten.sum.default, aten.sum.dim_IntList)
def sum_(x, dim=None, keepdim=False, *, dtype=None):
    out = _accumulate_dtype(x, dtype)
    compute = jnp.float32 if out in (jnp.bfloat16, jnp.float16) else out
    return jnp.sum(x.astype(compute), axis=_axes(x, dim), keepdims=keepdim).astype(out)


@lower(aten.mean.default, aten.mean.dim)
def mean(x, dim=None, keepdim=False, *, dtype=None):
    out = to_jax(dtype) if dtype is not None else x.dtype
    compute = jnp.float32 if out in (jnp.bfloat16, jnp.float16) else out
    return jnp.mean(x.astype(compute), axis=_axes(x, dim), keepdims=keepdim).astype(out)


@lower(aten.prod.default, aten.prod.dim_int)
def prod(x, dim=None, keepdim=False, *, dtype=None):
    out = _accumulate_dtype(x, dtype)
    return jnp.prod(x.astype(out), axis=_axes(x, dim), keepdims=keepdim)


def _nonempty_reduction(prefix):
    """PyTorch's CPU kernels raise IndexError for an empty reduced dimension (the meta kernels RuntimeError)."""

    def check(x, dim=(), keepdim=False, **kwargs):
        for d in ([] if dim is None else dim if isinstance(dim, (list, tuple)) else [dim]):
            if -x.ndim <= d < x.ndim and x.shape[d] == 0:
                raise IndexError(f"{prefix} Expected reduction dim {d} to have non-zero size.")

    return check


def _check_aminmax_out(x, *, dim=None, keepdim=False, min, max):
    for out in (min, max):
        if out.dtype != x.dtype:
            raise RuntimeError(f"Expected out tensor to have dtype {x.dtype}, but got {out.dtype} instead")


META[aten.aminmax.default] = checked_meta(_nonempty_reduction("aminmax:"), aten.aminmax.default)
META[aten.aminmax.out] = checked_meta(_check_aminmax_out, aten.aminmax.out)


@lower(aten.amax, meta=checked_meta(_nonempty_reduction("amax():"), aten.amax.default))
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.amin, meta=checked_meta(_nonempty_reduction("amin():"), aten.amin.default))
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.max.default)
def max_(x):
    return jnp.max(x)


@lower(aten.min.default)
def min_(x):
    return jnp.min(x)


def _arg_extreme(x, dim, keepdim, pick):
    if dim is None:
        index = pick(x.reshape(-1), axis=0).astype(jnp.int64)
        return index.reshape((1,) * x.ndim) if keepdim else index
    axis = dim % max(x.ndim, 1)
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    return pick(x, axis=axis, keepdims=keepdim).astype(jnp.int64)


def _first_extreme(extreme, pick):
    """argmax or argmin as PyTorch picks: the first position of the extreme, or of the first NaN. For floats,
    XLA's max and min propagate NaN, so the extreme is NaN exactly when there is one, and the first position
    of it or of a NaN is a plain reduction: jnp's NaN-aware argmax took 3.0-4.3 ms for 1024x1024 float32 on
    XLA:CPU, this 0.4-0.7 ms."""

    def chosen(x, axis, keepdims=False):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return pick(x, axis=axis, keepdims=keepdims)
        hit = (x == extreme(x, axis=axis, keepdims=True)) | jnp.isnan(x)
        positions = lax.broadcasted_iota(jnp.int64, x.shape, axis)
        return jnp.min(jnp.where(hit, positions, x.shape[axis]), axis=axis, keepdims=keepdims)

    return chosen


_argmax = _first_extreme(jnp.max, jnp.argmax)
_argmin = _first_extreme(jnp.min, jnp.argmin)


@lower(aten.argmax)
def argmax(x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, _argmax)


@lower(aten.argmin)
def argmin(x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, _argmin)


@lower(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    return amax(x, [dim], keepdim) if x.ndim else x, _arg_extreme(x, dim, keepdim, _argmax)


@lower(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    return amin(x, [dim], keepdim) if x.ndim else x, _arg_extreme(x, dim, keepdim, _argmin)


@lower(aten.all.default, aten.all.dim, aten.all.dims, aten._is_all_true)
def all_(x, dim=None, keepdim=False):
    return jnp.all(x, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.any.default, aten.any.dim, aten.any.dims, aten._is_any_true)
def any_(x, dim=None, keepdim=False):
    return jnp.any(x, axis=_axes(x, dim), keepdims=keepdim)


def _correction(correction, unbiased):
    if correction is not None:
        return correction
    return 1 if unbiased is None or unbiased else 0


@lower(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    if jnp.iscomplexobj(x):
        # the CPU's: its parts' variances added
        return var(x.real, dim, correction=correction, keepdim=keepdim) + var(x.imag, dim, correction=correction,
                                                                              keepdim=keepdim)
    compute = jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else x.dtype
    axes = _axes(x, dim)
    count = x.size if axes is None else math.prod(x.shape[a] for a in axes)
    wide = x.astype(compute)
    centered = wide - jnp.mean(wide, axis=axes, keepdims=True)
    squares = jnp.sum(centered * centered, axis=axes, keepdims=keepdim)
    # the CPU divides by max(0, count - correction): more corrections than elements give inf (0/0: NaN),
    # where jnp.var gives NaN
    return (squares / jnp.maximum(count - _correction(correction, None), 0)).astype(x.dtype)


@lower(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    return var(x, dim, correction=correction, keepdim=keepdim), mean(x, dim, keepdim)


@lower(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(var(x, dim, correction=correction, keepdim=keepdim))


@lower(aten.logsumexp)
def logsumexp(x, dim, keepdim=False):
    from jax.scipy.special import logsumexp as lse

    if jnp.iscomplexobj(x):
        return _complex_logsumexp(x, _axes(x, dim), keepdim)
    v = x.astype(jnp.float32) if not jnp.issubdtype(x.dtype, jnp.floating) else x
    return lse(v, axis=_axes(x, dim), keepdims=keepdim)


def _complex_logsumexp(x, axes, keepdim):
    """PyTorch's form: the largest real part is taken out (infinite ones are not) and the log of the sum
    is the principal one (JAX's logsumexp drops the imaginary part)."""
    largest = jnp.max(x.real, axis=axes, keepdims=True)
    largest = jnp.where(jnp.isinf(largest), 0, largest)
    total = jnp.log(jnp.sum(jnp.exp(x - largest), axis=axes, keepdims=True)) + largest
    return total if keepdim else jnp.squeeze(total, axes)


# ord picks the computation, so it must be a Python number
@lower(aten.linalg_vector_norm, static_scalars=True)
def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    v = jnp.abs(x.astype(to_jax(dtype)) if dtype is not None else x)
    # half precision sums its powers in float32 (as the CPU does): float16 squares overflow past 256
    return _vector_norm(opmath(v), ord, _axes(x, dim), keepdim).astype(v.dtype)


def _vector_norm(v, ord, axes, keepdim):
    if ord == float("inf"):
        return jnp.max(v, axis=axes, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(v, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum(v != 0, axis=axes, keepdims=keepdim).astype(v.dtype)
    if ord == 1:
        return jnp.sum(v, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(v * v, axis=axes, keepdims=keepdim))
    return jnp.sum(v**ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


def _scan(fn):
    def lowering(x, dim, *, dtype=None):
        out = _accumulate_dtype(x, dtype)
        # half precision accumulates in float32, as the CPU's loops do: rounding each partial sum drifts
        x = opmath(x.astype(out))
        return (x if x.ndim == 0 else fn(x, axis=dim % x.ndim)).astype(out)

    return lowering


def _running(combine, jnp_fn):
    """A running sum, product, maximum or minimum: XLA:CPU runs jnp's and lax's as a window as long as the
    axis, quadratic in its length (cumsum along the rows of 1024x1024 float32: 2.4-4.4 ms, against 1.2-1.3 ms
    as a scan of log depth; PyTorch 0.5)."""

    def running(x, axis):
        return lax.platform_dependent(x, cpu=functools.partial(lax.associative_scan, combine, axis=axis),
                                      default=functools.partial(jnp_fn, axis=axis))

    return running


running_sum = _running(jnp.add, jnp.cumsum)
lower(aten.cumsum)(_scan(running_sum))
lower(aten.cumprod)(_scan(_running(jnp.multiply, jnp.cumprod)))


@lower(aten.logcumsumexp)
def logcumsumexp(x, dim):
    if x.ndim == 0:
        return x
    if jnp.iscomplexobj(x):
        return _complex_logcumsumexp(x, dim % x.ndim)
    return lax.cumlogsumexp(x, axis=dim % x.ndim)


def _complex_logcumsumexp(x, axis):
    """A sequential scan as the CPU's: each step's log adds to the running imaginary part, which is not
    brought back to (-pi, pi], so a tree of partial sums (JAX's) can differ from it by multiples of 2 pi."""
    moved = jnp.moveaxis(x, axis, 0)

    def step(total, value):
        total = _complex_log_add_exp(value, total)
        return total, total

    _, out = lax.scan(step, jnp.full(moved.shape[1:], -jnp.inf, x.dtype), moved)
    return jnp.moveaxis(out, 0, axis)


def _complex_log_add_exp(x, y):
    """log(exp(x) + exp(y)) as PyTorch's _log_add_exp_helper: around the one with the larger real part."""
    x_lower = x.real <= y.real
    low, high = jnp.where(x_lower, x, y), jnp.where(x_lower, y, x)
    both_infinite = jnp.isinf(low.real) & (low.real == high.real)
    infinite = jnp.where(low.real < 0, low, jnp.log(jnp.exp(low) + jnp.exp(high)))
    out = jnp.where(both_infinite, infinite, jnp.log1p(jnp.exp(low - high)) + high)
    nan = jnp.isnan(x.real) | jnp.isnan(x.imag) | jnp.isnan(y.real) | jnp.isnan(y.imag)
    return jnp.where(nan, jnp.asarray(complex(jnp.nan, jnp.nan), x.dtype), out)


running_max = _running(jnp.maximum, lax.cummax)
running_min = _running(jnp.minimum, lax.cummin)


@lower(aten.cummax)
def cummax(x, dim):
    return _cum_extreme(x, dim, running_max)


@lower(aten.cummin)
def cummin(x, dim):
    return _cum_extreme(x, dim, running_min)


def _cum_extreme(x, dim, running):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = dim % x.ndim
    # lax's scans take no booleans
    values = running(x.astype(jnp.uint8), axis).astype(x.dtype) if x.dtype == jnp.bool_ else running(x, axis)
    positions = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    # the index moves to an element equal to the running extreme (the later of ties) or NaN, as in
    # PyTorch's kernel, where every NaN takes it
    hits = x == values
    if jnp.issubdtype(x.dtype, jnp.floating):
        hits = hits | jnp.isnan(x)
    return values, running_max(jnp.where(hits, positions, -1), axis)


@lower(aten.histc)
def histc(x, bins=100, min=0, max=0):
    values = x.astype(jnp.float32 if x.dtype != jnp.float64 else x.dtype)
    # min == max means the data's own range (and a unit-wide one when that is empty too)
    low = jnp.where(min == max, jnp.min(values), min)
    high = jnp.where(min == max, jnp.max(values), max)
    low, high = jnp.where(low == high, low - 1, low), jnp.where(low == high, high + 1, high)
    position = jnp.floor((values - low) * bins / (high - low)).astype(jnp.int32)
    inside = (values >= low) & (values <= high)
    # the top edge belongs to the last bin
    index = jnp.where(inside, jnp.clip(position, 0, bins - 1), bins)
    return jnp.zeros(bins + 1, x.dtype).at[index.reshape(-1)].add(1)[:bins]


_SEGMENT_REDUCTIONS = {"sum": jnp.sum, "prod": jnp.prod, "max": jnp.max, "min": jnp.min, "mean": jnp.sum}


def _segment_identity(reduce, dtype):
    if reduce in ("max", "min"):
        sign = -1 if reduce == "max" else 1
        return sign * jnp.inf if jnp.issubdtype(dtype, jnp.floating) else (jnp.iinfo(dtype).min if sign < 0 else jnp.iinfo(dtype).max)
    return 1 if reduce == "prod" else 0


@lower(aten.segment_reduce, meta=checked_meta(floating_only("_segment_reduce_cpu"), aten.segment_reduce.default))
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    """Reductions of consecutive segments along axis (as long as `lengths`, or between `offsets`):
    each segment is a mask over the axis, so shapes stay static."""
    axis = axis % data.ndim
    if offsets is None:
        zero = jnp.zeros(lengths.shape[:-1] + (1,), lengths.dtype)
        offsets = jnp.concatenate([zero, jnp.cumsum(lengths, axis=-1)], axis=-1)
    position = jnp.arange(data.shape[axis])
    member = (offsets[..., :-1, None] <= position) & (position < offsets[..., 1:, None])
    rest = data.shape[axis + 1:]
    member = member.reshape(member.shape + (1,) * len(rest))
    values = jnp.expand_dims(data, axis)
    identity = _segment_identity(reduce, data.dtype)
    out = _SEGMENT_REDUCTIONS[reduce](jnp.where(member, values, identity), axis=axis + 1)
    count = jnp.sum(member, axis=axis + 1)
    if initial is not None:
        out = _combine(reduce, out, initial)
    if reduce == "mean":
        empty = jnp.nan if initial is None else initial
        out = jnp.where(count == 0, empty, out / jnp.maximum(count, 1))
    return out.astype(data.dtype)


def _combine(reduce, out, initial):
    if reduce in ("sum", "mean"):
        return out + initial
    if reduce == "prod":
        return out * initial
    return jnp.maximum(out, initial) if reduce == "max" else jnp.minimum(out, initial)


@lower(aten._segment_reduce_backward)
def segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None):
    _, vjp = jax.vjp(lambda d: segment_reduce(d, reduce, lengths=lengths, offsets=offsets, axis=axis, initial=initial), data)
    return vjp(grad.astype(data.dtype))[0]


def _linspace(low, high, steps, dtype):
    """torch.linspace's values: the first half counted up from low, the second down from high."""
    low, high = jnp.asarray(low, dtype), jnp.asarray(high, dtype)
    step = (high - low) / max(steps - 1, 1)
    i = jnp.arange(steps)
    return jnp.where(i < steps // 2, low + step * i, high - step * (steps - 1 - i)).astype(dtype)


def _outer_edges(column, bounds):
    """The outermost bin edges: the given range, else the data's (0 and 1 for no data), widened by 1/2 if empty."""
    if bounds is not None:
        low, high = jnp.asarray(bounds[0], column.dtype), jnp.asarray(bounds[1], column.dtype)
    elif column.size == 0:
        low, high = jnp.zeros((), column.dtype), jnp.ones((), column.dtype)
    else:
        low, high = jnp.min(column), jnp.max(column)
    same = low == high
    return jnp.where(same, low - 0.5, low), jnp.where(same, high + 0.5, high)


def _histogramdd_edges(points, bins, bounds):
    return [
        _linspace(*_outer_edges(points[:, d], None if bounds is None else bounds[2 * d:2 * d + 2]), count + 1, points.dtype)
        for d, count in enumerate(bins)
    ]


def _histogramdd(points, edges, weight, density):
    """Counts (or summed weights) of points (n, d) in the bins the edges bound; the last edge is inside its bin."""
    shape = tuple(e.shape[0] - 1 for e in edges)
    flat = jnp.zeros(points.shape[0], jnp.int64)
    inside = jnp.ones(points.shape[0], bool)
    for d, e in enumerate(edges):
        column = points[:, d]
        position = jnp.searchsorted(e, column, side="right") - 1
        position = jnp.where(column == e[-1], shape[d] - 1, position)
        inside &= (column >= e[0]) & (column <= e[-1])
        flat = flat * shape[d] + jnp.clip(position, 0, shape[d] - 1)
    total = math.prod(shape)
    amounts = jnp.ones(points.shape[0], points.dtype) if weight is None else weight.reshape(-1).astype(points.dtype)
    hist = jnp.zeros(total, points.dtype).at[jnp.where(inside, flat, total)].add(amounts, mode="drop").reshape(shape)
    if density:
        volume = functools.reduce(jnp.multiply.outer, [jnp.diff(e) for e in edges])
        hist = hist / (jnp.sum(hist) * volume)
    return hist


def _points(x, dims):
    return x.reshape(-1, dims)


# PyTorch has no meta kernels for histograms; their shapes follow from the bins alone
def _histogram_meta(x, bins=100, **kwargs):
    edges = bins.new_empty(bins.shape) if isinstance(bins, torch.Tensor) else x.new_empty(bins + 1)
    return x.new_empty(edges.shape[0] - 1), edges


def _histogram_out_meta(x, bins=100, *, hist, bin_edges, **kwargs):
    shapes = _histogram_meta(x, bins)
    return hist.resize_(shapes[0].shape), bin_edges.resize_(shapes[1].shape)


def _check_histogramdd_bins(x, bins):
    if len(bins) != x.shape[-1]:
        raise RuntimeError("histogramdd: The size of bins must be equal to the innermost dimension of the input.")


def _histogramdd_edges_meta(x, bins, **kwargs):
    _check_histogramdd_bins(x, bins)
    return [x.new_empty(b + 1) for b in bins]


def _histogramdd_counts_meta(x, bins, **kwargs):
    _check_histogramdd_bins(x, bins)
    return x.new_empty([b.shape[0] - 1 if isinstance(b, torch.Tensor) else b for b in bins])


META[aten.histogram.bin_ct_out] = META[aten.histogram.bins_tensor_out] = _histogram_out_meta


@lower(aten.histogram.bin_ct, meta=_histogram_meta)
def histogram(x, bins=100, *, range=None, weight=None, density=False):
    edges = _histogramdd_edges(_points(x, 1), [bins], range)
    return _histogramdd(_points(x, 1), edges, weight, density), edges[0]


@lower(aten.histogram.bins_tensor, meta=_histogram_meta)
def histogram_edges(x, bins, *, weight=None, density=False):
    return _histogramdd(_points(x, 1), [bins], weight, density), bins


@lower(aten._histogramdd_bin_edges, meta=_histogramdd_edges_meta)
def histogramdd_bin_edges(x, bins, *, range=None, weight=None, density=False):
    return _histogramdd_edges(_points(x, x.shape[-1]), bins, range)


@lower(aten._histogramdd_from_bin_cts, meta=_histogramdd_counts_meta)
def histogramdd_from_bin_cts(x, bins, *, range=None, weight=None, density=False):
    points = _points(x, x.shape[-1])
    return _histogramdd(points, _histogramdd_edges(points, bins, range), weight, density)


@lower(aten._histogramdd_from_bin_tensors, meta=_histogramdd_counts_meta)
def histogramdd_from_bin_tensors(x, bins, *, weight=None, density=False):
    return _histogramdd(_points(x, x.shape[-1]), list(bins), weight, density)
