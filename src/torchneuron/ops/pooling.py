"""Spatial ops: pooling, upsampling, grid sampling, padding, and their backwards.

Max pools of fixed windows take one strided slice per window offset. Windowed
ops of variable window (adaptive and fractional pooling) gather every window
into a trailing axis (`_windows`) and reduce it. Backwards of the linear ops
are the vjp of their forward lowering; max pools send each output's gradient
to the index their forward returned.
"""
import functools
import math

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from . import checks
from .rules import decomposed, vjp
from .promotion import opmath
from .registry import META, checked_meta, floating_only, lower, meta_like_input

aten = torch.ops.aten


def per_dim(value, n) -> list:
    """A window argument (an int, or one value per spatial dimension or one for all) as n values."""
    values = [value] if isinstance(value, int) else list(value)
    return values * n if len(values) == 1 else values


# --- average pooling ------------------------------------------------------------------


def _pool_padding(length, kernel, stride, pad, ceil_mode):
    """(left, right) padding that yields PyTorch's pooled length (ceil mode drops a window starting past the input)."""
    span = length + 2 * pad - kernel
    out = -(-span // stride) + 1 if ceil_mode else span // stride + 1
    if ceil_mode and (out - 1) * stride >= length + pad:
        out -= 1
    return pad, (out - 1) * stride + kernel - length - pad


def _avg_pool(n, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    kernel, padding = per_dim(kernel_size, n), per_dim(padding, n)
    stride = per_dim(stride, n) if stride else kernel
    pads = [_pool_padding(x.shape[x.ndim - n + i], k, s, p, ceil_mode)
            for i, (k, s, p) in enumerate(zip(kernel, stride, padding))]
    lead = x.ndim - n
    window, strides = (1,) * lead + tuple(kernel), (1,) * lead + tuple(stride)
    config = [(0, 0)] * lead + pads
    v = opmath(x)
    total = lax.reduce_window(v, 0.0, lax.add, window, strides, config)
    if divisor_override:
        return (total / divisor_override).astype(x.dtype)
    # how many elements each window averages: padding counts (up to the declared padding) if asked
    ones = jnp.ones(x.shape[lead:], v.dtype)
    if count_include_pad:
        ones = jnp.pad(ones, [(p, p) for p in padding], constant_values=1)
        config_ones = [(0, right - p) for (_, right), p in zip(pads, padding)]
    else:
        config_ones = pads
    counts = lax.reduce_window(ones, 0.0, lax.add, tuple(kernel), tuple(stride), config_ones)
    return (total / counts).astype(x.dtype)


lower(aten.avg_pool2d)(functools.partial(_avg_pool, 2))
lower(aten.avg_pool3d)(functools.partial(_avg_pool, 3))


# --- pooling over gathered windows ------------------------------------------------------


def _windows(x, starts, sizes):
    """Every pooling window of `x`'s last len(starts) dims, gathered into one trailing axis.

    Along spatial dim d, output i covers input starts[d][..., i] + [0, sizes[d][i]); starts may vary
    over the leading (batch, channel) dims. Returns the values (lead + output shape + (window,)),
    which window slots are inside their window, and each slot's flat position in the spatial plane
    (PyTorch's pooling indices).
    """
    n = len(starts)
    lead, spatial = x.shape[:x.ndim - n], x.shape[x.ndim - n:]
    kernel = [int(max(s, default=1)) for s in sizes]
    strides = [math.prod(spatial[d + 1:]) for d in range(n)]
    flat, valid = 0, True
    for d in range(n):
        offsets = jnp.arange(kernel[d])
        position = jnp.minimum(jnp.asarray(starts[d])[..., :, None] + offsets, spatial[d] - 1)
        flat = flat + _interleaved(position, d, n) * strides[d]
        valid = valid & _interleaved(offsets < jnp.asarray(sizes[d])[:, None], d, n)
    grid = lead + tuple(v for d in range(n) for v in (len(sizes[d]), kernel[d]))
    flat = jnp.broadcast_to(flat, grid)
    # outputs first, then the window slots
    order = tuple(range(len(lead))) + tuple(len(lead) + 2 * d for d in range(n)) + tuple(
        len(lead) + 2 * d + 1 for d in range(n))
    out_shape = lead + tuple(len(s) for s in sizes) + (math.prod(kernel),)
    flat = jnp.transpose(flat, order).reshape(out_shape)
    valid = jnp.transpose(jnp.broadcast_to(valid, grid), order).reshape(out_shape)
    windows = math.prod(out_shape[len(lead):])
    values = jnp.take_along_axis(x.reshape(lead + (math.prod(spatial),)), flat.reshape(lead + (windows,)), axis=-1)
    return values.reshape(out_shape), valid, flat


def _interleaved(a, d, n):
    """`a` (..., output, slot) of spatial dim d, placed at axes 2d, 2d + 1 of the (output, slot) grid of n dims."""
    return a.reshape(a.shape[:-2] + (1, 1) * d + a.shape[-2:] + (1, 1) * (n - d - 1))


def _lowest(dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _window_max(x, starts, sizes):
    values, valid, flat = _windows(x, starts, sizes)
    # the first slot is always inside its window: argmax never picks padding
    best = jnp.argmax(jnp.where(valid, values, _lowest(x.dtype)), axis=-1)[..., None]
    return (jnp.take_along_axis(values, best, axis=-1)[..., 0],
            jnp.take_along_axis(flat, best, axis=-1)[..., 0].astype(jnp.int64))


def _adaptive_windows(length, out):
    """PyTorch's adaptive pooling windows: [floor(i * length / out), ceil((i + 1) * length / out))."""
    starts = np.array([i * length // out for i in range(out)], np.int64)  # typed: no windows (out 0) too
    ends = np.array([-(-(i + 1) * length // out) for i in range(out)], np.int64)
    return starts, ends - starts


def _adaptive(x, output_size):
    n = len(output_size)
    windows = [_adaptive_windows(x.shape[x.ndim - n + d], o) for d, o in enumerate(output_size)]
    return [w[0] for w in windows], [w[1] for w in windows]


@lower(aten._adaptive_avg_pool2d, aten._adaptive_avg_pool3d)
def adaptive_avg_pool(x, output_size):
    starts, sizes = _adaptive(x, output_size)
    values, valid, _ = _windows(opmath(x), starts, sizes)
    counts = functools.reduce(np.multiply.outer, sizes).astype(np.float32)
    return (jnp.sum(jnp.where(valid, values, 0), axis=-1) / counts).astype(x.dtype)


def _check_nonempty_windows(n: int):
    """The CPU's refusal of an empty non-batch dimension, which PyTorch's meta kernel takes (each output
    would average an empty window)."""
    def check(x, output_size, **out):
        empty = next((i for i in range(1, x.ndim) if x.shape[i] == 0), None)
        if empty is not None:
            raise RuntimeError(f"adaptive_avg_pool{n}d(): Expected input to have non-zero size for non-batch "
                               f"dimensions, but input has sizes {list(x.shape)} with dimension {empty} being empty")
    return check


for _n, _packet in ((2, aten._adaptive_avg_pool2d), (3, aten._adaptive_avg_pool3d)):
    for _overload in (_packet.default, _packet.out):
        META[_overload] = checked_meta(_check_nonempty_windows(_n), _overload)


@lower(aten.adaptive_max_pool2d, aten.adaptive_max_pool3d)
def adaptive_max_pool(x, output_size):
    return _window_max(x, *_adaptive(x, output_size))


def _fractional_starts(sample, length, out, kernel):
    """PyTorch's fractional pooling window starts from one uniform sample per (batch, channel)."""
    if out == 1:
        return jnp.full(sample.shape + (1,), length - kernel)
    alpha = jnp.asarray((length - kernel) / (out - 1), sample.dtype)
    i = jnp.arange(out - 1, dtype=sample.dtype)
    steps = (jnp.trunc((i + sample[..., None]) * alpha) - jnp.trunc(sample[..., None] * alpha)).astype(jnp.int32)
    return jnp.concatenate([steps, jnp.full(sample.shape + (1,), length - kernel, jnp.int32)], axis=-1)


def _check_sample_dtype(x, kernel_size, output_size, random_samples):
    # PyTorch's meta kernel of the 3-d op lacks the CPU kernel's check
    if random_samples.dtype != x.dtype:
        raise RuntimeError("Expect _random_samples to have the same dtype as input")


@lower(aten.fractional_max_pool2d)
@lower(aten.fractional_max_pool3d, meta=checked_meta(_check_sample_dtype, aten.fractional_max_pool3d.default))
def fractional_max_pool(x, kernel_size, output_size, random_samples):
    n = len(output_size)
    # one sample per plane, the last spatial dim's first (an unbatched input has a batch of one)
    samples = random_samples.reshape(x.shape[:x.ndim - n] + (n,))
    starts = [_fractional_starts(samples[..., n - 1 - d], x.shape[x.ndim - n + d], o, k)
              for d, (o, k) in enumerate(zip(output_size, kernel_size))]
    return _window_max(x, starts, [np.full(o, k) for o, k in zip(output_size, kernel_size)])


# --- max pooling ----------------------------------------------------------------------------
# One strided slice per window offset, not the windows gathered: XLA:CPU runs slices and selects as
# one loop fusion, where the gather and argmax of PyTorch's decomposition cost more than the convolutions
# of a small CNN.


def window_slice(offset, dilation, out_sizes, stride):
    """The strided slice (starts, limits per spatial dim) of a padded input that a sliding window's element
    at `offset` reads, one element per output position (max pools here, convolution weight gradients)."""
    starts = [i * d for i, d in zip(offset, dilation)]
    limits = [start + (o - 1) * s + 1 for start, o, s in zip(starts, out_sizes, stride)]
    return starts, limits


def _max_pool_offsets(n, x, kernel_size, stride, padding, dilation, ceil_mode):
    """Each window offset, in PyTorch's scan order: its strided slice of the padded input (start, limit,
    stride per spatial dim), the input position it reads for every output (flat, as PyTorch's indices),
    whether that position is inside the input, and the input padding."""
    kernel, padding, dilation = per_dim(kernel_size, n), per_dim(padding, n), per_dim(dilation, n)
    stride = per_dim(stride, n) if stride else kernel
    spatial = x.shape[x.ndim - n:]
    pads = [_pool_padding(length, d * (k - 1) + 1, s, p, ceil_mode)
            for length, k, s, p, d in zip(spatial, kernel, stride, padding, dilation)]
    outs = [(length + left + right - d * (k - 1) - 1) // s + 1
            for length, (left, right), k, s, d in zip(spatial, pads, kernel, stride, dilation)]
    offsets = []
    for offset in np.ndindex(*kernel):
        positions = [np.arange(o) * s - p + i * d for o, s, p, i, d in zip(outs, stride, padding, offset, dilation)]
        grid = np.ix_(*positions)
        flat = sum(g * math.prod(spatial[d + 1:]) for d, g in enumerate(grid))
        inside = functools.reduce(np.logical_and, [(g >= 0) & (g < length) for g, length in zip(grid, spatial)])
        starts, limits = window_slice(offset, dilation, outs, stride)
        offsets.append((starts, limits, stride, flat, inside))
    return offsets, pads


def _max_pool(n, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    offsets, pads = _max_pool_offsets(n, x, kernel_size, stride, padding, dilation, ceil_mode)
    lead = x.ndim - n
    padded = lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0)] * lead + [(lo, hi, 0) for lo, hi in pads])
    lowest = jnp.asarray(_lowest(x.dtype), x.dtype)
    windows = [(lax.slice(padded, (0,) * lead + tuple(starts), x.shape[:lead] + tuple(limits),
                          (1,) * lead + tuple(strides)), flat, inside)
               for starts, limits, strides, flat, inside in offsets]
    best = functools.reduce(jnp.maximum, [jnp.where(inside, v, lowest) for v, _, inside in windows])
    # PyTorch's CPU kernel keeps the first position holding the maximum, or the last nan. Each select
    # reads only the previous index, not a running maximum: XLA fuses the chain without recomputing it.
    index = jnp.zeros(best.shape, jnp.int64)
    for v, flat, inside in reversed(windows):
        index = jnp.where(inside & (v == best), flat, index)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        for v, flat, inside in windows:
            index = jnp.where(inside & jnp.isnan(v), flat, index)
    return best, index


lower(aten.max_pool2d_with_indices)(functools.partial(_max_pool, 2))
lower(aten.max_pool3d_with_indices)(functools.partial(_max_pool, 3))


def _max_pool_backward(n, grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """Each window offset's share of the gradient (where the index is its position), strided back into
    place; positions in the padding fall outside and are cropped by the negative padding."""
    offsets, pads = _max_pool_offsets(n, x, kernel_size, stride, padding, dilation, ceil_mode)
    lead = x.ndim - n
    g = opmath(grad)
    zero = jnp.zeros((), g.dtype)
    out = jnp.zeros(x.shape, g.dtype)
    for starts, limits, strides, flat, _ in offsets:
        share = jnp.where(indices == flat, g, zero)
        config = [(start - left, length + left - limit, s - 1)
                  for start, limit, s, (left, _), length in zip(starts, limits, strides, pads, x.shape[lead:])]
        out = out + lax.pad(share, zero, [(0, 0, 0)] * lead + config)
    return out.astype(grad.dtype)


lower(aten.max_pool2d_with_indices_backward)(functools.partial(_max_pool_backward, 2))
lower(aten.max_pool3d_with_indices_backward)(functools.partial(_max_pool_backward, 3))


def _scatter(n, grad, x, indices):
    """The gradient of a max pool: each output's gradient added at the input position it took."""
    rows = math.prod(x.shape[:x.ndim - n])
    outputs = math.prod(grad.shape[x.ndim - n:])
    g = opmath(grad).reshape(rows, outputs)
    out = jnp.zeros((rows, math.prod(x.shape[x.ndim - n:])), g.dtype)
    out = out.at[jnp.arange(rows)[:, None], indices.reshape(rows, outputs)].add(g)
    return out.reshape(x.shape).astype(grad.dtype)


lower(aten.adaptive_max_pool2d_backward)(functools.partial(_scatter, 2))
lower(aten.adaptive_max_pool3d_backward)(functools.partial(_scatter, 3))


@lower(aten.fractional_max_pool2d_backward, aten.fractional_max_pool3d_backward, meta=meta_like_input)
def fractional_max_pool_backward(grad, x, kernel_size, output_size, indices):
    return _scatter(len(output_size), grad, x, indices)


# --- antialiased upsampling ---------------------------------------------------------------


def _bilinear_filter(x):
    return np.maximum(1 - np.abs(x), 0)


def _bicubic_filter(x, a=-0.5):
    x = np.abs(x)
    return np.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                    np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0))


def _scale(length, out, align_corners, scale):
    """PyTorch's area_pixel_compute_scale: input pixels per output pixel."""
    if align_corners:
        return (length - 1) / (out - 1) if out > 1 else 0.0
    return 1 / scale if scale is not None and scale > 0 else length / out


def _antialias_weights(length, out, scale, support, filter_fn):
    """Each output's first input and its normalised filter weights (PyTorch's _compute_weights_aa)."""
    support = support * scale if scale >= 1 else support
    width = math.ceil(support) * 2 + 1
    center = scale * (np.arange(out) + 0.5)
    first = np.maximum((center - support + 0.5).astype(np.int64), 0)
    size = np.minimum((center + support + 0.5).astype(np.int64), length) - first
    taps = np.arange(width)
    weights = filter_fn((taps + first[:, None] - center[:, None] + 0.5) / max(scale, 1.0))
    weights = np.where(taps < size[:, None], weights, 0)
    total = weights.sum(axis=1, keepdims=True)
    weights = np.where(total != 0, weights / np.where(total != 0, total, 1), 0)
    return np.minimum(first[:, None] + taps, length - 1), weights


def _upsample_antialiased(support, filter_fn, x, output_size, align_corners, *scales):
    """Separable: each spatial dim gathers every output's taps and sums them weighted."""
    v = opmath(x)
    scales = scales + (None,) * (len(output_size) - len(scales))
    for d, (out, scale) in enumerate(zip(output_size, scales)):
        axis = x.ndim - len(output_size) + d
        length = x.shape[axis]
        index, weights = _antialias_weights(length, out, _scale(length, out, align_corners, scale), support,
                                            filter_fn)
        taps = jnp.take(v, jnp.asarray(index), axis=axis)
        v = jnp.sum(taps * jnp.asarray(weights, v.dtype).reshape(weights.shape + (1,) * (x.ndim - axis - 1)),
                    axis=axis + 1)
    return v.astype(x.dtype)


lower(aten._upsample_bilinear2d_aa.default, static_scalars=True)(
    functools.partial(_upsample_antialiased, 1.0, _bilinear_filter))
lower(aten._upsample_bicubic2d_aa.default, static_scalars=True)(
    functools.partial(_upsample_antialiased, 2.0, _bicubic_filter))


# --- grid sampling --------------------------------------------------------------------------


def _reflect(coordinate, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(coordinate)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    distance = jnp.abs(coordinate - low)
    extra = jnp.fmod(distance, span)
    flips = jnp.floor(distance / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _source_coordinate(coordinate, size, padding_mode, align_corners):
    """A grid coordinate in [-1, 1] as an input position, with border or reflection padding applied."""
    if align_corners:
        position = (coordinate + 1) / 2 * (size - 1)
    else:
        position = ((coordinate + 1) * size - 1) / 2
    if padding_mode == 2:
        position = _reflect(position, 0, 2 * (size - 1)) if align_corners else _reflect(position, -1, 2 * size - 1)
    if padding_mode in (1, 2):
        position = jnp.clip(position, 0, size - 1)
    return position


def _grid_gather(x, indices, weight):
    """sum over corners of x at the (per-dim) integer `indices`, times `weight`, zero outside the input."""
    spatial = x.shape[2:]
    inside = functools.reduce(jnp.logical_and, [(i >= 0) & (i < s) for i, s in zip(indices, spatial)])
    flat = sum(jnp.clip(i, 0, s - 1) * math.prod(spatial[d + 1:])
               for d, (i, s) in enumerate(zip(indices, spatial)))
    n, c = x.shape[:2]
    values = jnp.take_along_axis(x.reshape(n, c, math.prod(spatial)), flat.reshape(n, 1, flat[0].size), axis=2)
    return values.reshape((n, c) + flat.shape[1:]) * jnp.where(inside, weight, 0)[:, None]


@lower(aten.grid_sampler_2d)
@lower(aten.grid_sampler_3d, meta=checked_meta(floating_only("grid_sampler3d_cpu"), aten.grid_sampler_3d.default))
def grid_sampler(x, grid, interpolation_mode, padding_mode, align_corners):
    if interpolation_mode == 2:  # bicubic, 2-d only
        from .rules import decomposed

        return decomposed(aten.grid_sampler_2d.default)(x, grid, interpolation_mode, padding_mode, align_corners)
    # half precision computes in float32, as CUDA's kernel does: XLA keeps a fused program's half-precision
    # intermediates in float32 anyway, so the CPU's rounding at each step cannot be matched
    dtype, x, grid = x.dtype, opmath(x), opmath(grid)
    # the grid's last axis is (x, y, z): the input's spatial dims reversed
    positions = [_source_coordinate(grid[..., -1 - d], size, padding_mode, align_corners)
                 for d, size in enumerate(x.shape[2:])]
    if interpolation_mode == 1:
        nearest = [jnp.round(p).astype(jnp.int32) for p in positions]
        return _grid_gather(x, nearest, jnp.ones_like(positions[0])).astype(dtype)
    low = [jnp.floor(p) for p in positions]
    out = 0
    for corner in np.ndindex(*(2,) * len(positions)):
        weight = functools.reduce(jnp.multiply, [
            (p - lo) if c else (lo + 1 - p) for p, lo, c in zip(positions, low, corner)])
        out = out + _grid_gather(x, [(lo + c).astype(jnp.int32) for lo, c in zip(low, corner)], weight)
    return out.astype(dtype)


# --- backwards: the vjp of the forward lowering -----------------------------------------------


@lower(aten.max_unpool2d, aten.max_unpool3d)
def max_unpool(x, indices, output_size, *strides_and_padding):
    """PyTorch's decomposition, after the CPU's check of the indices (CUDA's kernel asserts them), which the
    decomposition's scatter would report as another error."""
    size = "x".join(map(str, output_size))
    checks.require((indices >= 0) & (indices < math.prod(output_size)), RuntimeError,
                   f"Found an invalid max index: {{}} (output volumes are of size {size})", culprit=indices)
    op = aten.max_unpool2d.default if len(output_size) == 2 else aten.max_unpool3d.default
    return decomposed(op)(x, indices, output_size, *strides_and_padding)


def _upsample_backward(op, grad, output_size, input_size, *args):
    return vjp(op, grad, (jnp.zeros(input_size, grad.dtype),), output_size, *args)[0]


for _backward, _forward in [
    (aten.upsample_nearest1d_backward, aten.upsample_nearest1d.default),
    (aten.upsample_nearest2d_backward, aten.upsample_nearest2d.default),
    (aten.upsample_nearest3d_backward, aten.upsample_nearest3d.default),
    (aten._upsample_nearest_exact1d_backward, aten._upsample_nearest_exact1d.default),
    (aten._upsample_nearest_exact2d_backward, aten._upsample_nearest_exact2d.default),
    (aten._upsample_nearest_exact3d_backward, aten._upsample_nearest_exact3d.default),
    (aten.upsample_linear1d_backward, aten.upsample_linear1d.default),
    (aten.upsample_bilinear2d_backward, aten.upsample_bilinear2d.default),
    (aten.upsample_trilinear3d_backward, aten.upsample_trilinear3d.default),
    (aten.upsample_bicubic2d_backward, aten.upsample_bicubic2d.default),
    (aten._upsample_bilinear2d_aa_backward, aten._upsample_bilinear2d_aa.default),
    (aten._upsample_bicubic2d_aa_backward, aten._upsample_bicubic2d_aa.default),
]:
    lower(_backward, static_scalars=True)(functools.partial(_upsample_backward, _forward))


def _check_upsample(n: int):
    """The CPU kernel's checks of an upsampling's input, which PyTorch's meta kernels leave out (their
    decompositions then read a batch or channel dimension as a spatial one, or sample nothing)."""
    def check(x, output_size, *args, **kwargs):
        if x.ndim != n + 2:
            raise RuntimeError(f"It is expected input_size equals to {n + 2}, but got size {x.ndim}")
        given, wanted = list(x.shape[2:]), list(output_size)
        if not all(size > 0 for size in given + wanted):
            sizes = [", ".join(f"{name}: {size}" for name, size in zip("DHW"[-n:], part)) for part in (given, wanted)]
            joined = " and output" if n == 1 else " output"
            raise RuntimeError(f"Input and output sizes should be greater than 0, but got input ({sizes[0]}){joined} "
                               f"({sizes[1]})")
        if x.shape[1] == 0:
            raise RuntimeError(f"Non-empty {n + 2}D data tensor expected but got a tensor with sizes {list(x.shape)}")
    return check


def _upsampled(op):
    """PyTorch's meta kernel, except for an empty batch, which its nearest kernels fail on (their torch._check
    is given an int): an empty output of the requested size, as the CPU gives."""
    def meta(x, output_size, *args, **kwargs):
        if x.shape[0] == 0:
            return x.new_empty((*x.shape[:2], *output_size))
        return op(x, output_size, *args, **kwargs)
    return meta


for _n, _ops in ((1, (aten.upsample_nearest1d, aten._upsample_nearest_exact1d, aten.upsample_linear1d)),
                 (2, (aten.upsample_nearest2d, aten._upsample_nearest_exact2d, aten.upsample_bilinear2d,
                      aten.upsample_bicubic2d, aten._upsample_bilinear2d_aa, aten._upsample_bicubic2d_aa)),
                 (3, (aten.upsample_nearest3d, aten._upsample_nearest_exact3d, aten.upsample_trilinear3d))):
    for _packet in _ops:
        META[_packet.default] = checked_meta(_check_upsample(_n), _upsampled(_packet.default))


def _input_backward(op, grad, x, *args):
    return vjp(op, grad, (x,), *args)[0]


for _backward, _forward in [
    (aten.avg_pool2d_backward, aten.avg_pool2d.default),
    (aten.avg_pool3d_backward, aten.avg_pool3d.default),
    (aten.replication_pad1d_backward, aten.replication_pad1d.default),
    (aten.replication_pad2d_backward, aten.replication_pad2d.default),
    (aten.replication_pad3d_backward, aten.replication_pad3d.default),
]:
    lower(_backward)(functools.partial(_input_backward, _forward))


def _adaptive_avg_pool_backward(n, forward, grad, x):
    return _input_backward(forward, grad, x, grad.shape[grad.ndim - n:])


lower(aten._adaptive_avg_pool2d_backward)(
    functools.partial(_adaptive_avg_pool_backward, 2, aten._adaptive_avg_pool2d.default))
lower(aten._adaptive_avg_pool3d_backward)(
    functools.partial(_adaptive_avg_pool_backward, 3, aten._adaptive_avg_pool3d.default))


def _grid_sampler_backward(grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    dx, dgrid = vjp(grid_sampler, grad, (x, grid), interpolation_mode, padding_mode, align_corners)
    return dx if output_mask[0] else None, dgrid


lower(aten.grid_sampler_2d_backward)(_grid_sampler_backward)
lower(aten.grid_sampler_3d_backward)(_grid_sampler_backward)
