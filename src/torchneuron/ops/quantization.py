"""Fake quantization for quantization-aware training: values rounded to an integer grid and back, in float.

torch.ao's FakeQuantize modules and `torch.fake_quantize_per_*_affine` call these. The mask they also return
marks the values whose grid level is inside the range: their gradient passes (straight-through), the
others' is zero. As PyTorch's kernels: x times the float32 inverse of the scale, rounded half to even; an
integer zero point is added after rounding, a floating one before. torch.ao's fused observer
(FusedMovingAvgObsFakeQuantize, the default QAT configuration's) chooses the scale and zero point from running
minima and maxima as the CPU's quant_utils does, on the device, flags included.
"""
import jax.numpy as jnp
import numpy as np
import torch

from . import checks
from . import registry
from .registry import lower

aten = torch.ops.aten


def _quotient(a, b):
    """a / b in float32, correctly rounded as the CPU kernels' divisions here are: XLA divides by a scalar as a
    product with its rounded reciprocal (an ulp off for 72% of x / 255.0 on XLA:CPU), the float64 quotient
    rounded once is exact (53 >= 2 * 24 + 2 bits)."""
    return (jnp.asarray(a, jnp.float64) / jnp.asarray(b, jnp.float64)).astype(jnp.float32)


def _fake_quantize(x, scale, zero_point, quant_min, quant_max):
    """(fake-quantized x, in-range mask); `scale` and `zero_point` broadcast against x."""
    scale = jnp.asarray(scale, jnp.float32)
    scaled = x.astype(jnp.float32) * _quotient(1, scale)
    if jnp.issubdtype(jnp.asarray(zero_point).dtype, jnp.floating):
        zero_point = jnp.asarray(zero_point, jnp.float32)
        levels = jnp.round(scaled + zero_point)
    else:
        zero_point = jnp.asarray(zero_point, jnp.int64)
        levels = jnp.round(scaled).astype(jnp.int64) + zero_point
    inside = (levels >= quant_min) & (levels <= quant_max)
    values = (jnp.clip(levels, quant_min, quant_max) - zero_point).astype(jnp.float32) * scale
    return values.astype(x.dtype), inside


def _with_mask(x):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, dtype=torch.bool, memory_format=torch.contiguous_format))


# PyTorch registers no meta kernels for these. Each meta refuses what the CPU kernel refuses before reading
# any value, and the dispatcher then raises the CPU kernel's own error; a zero point out of range in a tensor
# is a value, checked on the device.
def _per_tensor_meta(x, scale, zero_point, quant_min, quant_max):
    torch._check(quant_min <= zero_point <= quant_max,
                 lambda: "`zero_point` must be between `quant_min` and `quant_max`.")
    return _with_mask(x)


def _tensor_qparams_meta(x, scale, zero_point, fake_quant_enabled, quant_min, quant_max):
    torch._check(quant_min <= quant_max, lambda: "`quant_min` should be less than or equal to `quant_max`.")
    return _with_mask(x)


def _per_channel_meta(x, scale, zero_point, axis, quant_min, quant_max):
    torch._check(scale.dtype in (torch.float32, torch.bfloat16)
                 and zero_point.dtype in (torch.int32, torch.float32, torch.float16)
                 and scale.dim() == zero_point.dim() == 1 and scale.numel() == zero_point.numel()
                 and 0 <= axis < x.dim() and scale.numel() == x.shape[axis] and quant_min <= quant_max,
                 lambda: "fake_quantize_per_channel_affine: arguments the CPU kernel refuses")
    return _with_mask(x)


@lower(aten.fake_quantize_per_tensor_affine_cachemask, meta=_per_tensor_meta)
def fake_quantize_per_tensor(x, scale, zero_point, quant_min, quant_max):
    return _fake_quantize(x, scale, zero_point, quant_min, quant_max)


@lower(aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams, meta=_tensor_qparams_meta)
def fake_quantize_per_tensor_tensor_qparams(x, scale, zero_point, fake_quant_enabled, quant_min, quant_max):
    values, inside = _fake_quantize(x, scale.reshape(-1)[0], zero_point.reshape(-1)[0], quant_min, quant_max)
    enabled = fake_quant_enabled.reshape(-1)[0] != 0
    return jnp.where(enabled, values, x), jnp.where(enabled, inside, True)


@lower(aten.fake_quantize_per_channel_affine_cachemask, meta=_per_channel_meta)
def fake_quantize_per_channel(x, scale, zero_point, axis, quant_min, quant_max):
    checks.require((zero_point >= quant_min) & (zero_point <= quant_max), RuntimeError,
                   "`zero_point` must be between `quant_min` and `quant_max`.")
    shape = [1] * x.ndim
    shape[axis] = -1
    return _fake_quantize(x, scale.reshape(shape), zero_point.reshape(shape), quant_min, quant_max)


# quant_utils' threshold below which a scale is raised (its float constant)
_SMALL_SCALE = np.float32(6.1e-5)


def _choose_qparams(low, high, quant_min, quant_max, symmetric):
    """quant_utils::ChooseQuantizationParams over float32 minima and maxima, in its mix of float and double
    arithmetic: (float32 scales, int32 zero points)."""
    f32, f64 = jnp.float32, jnp.float64
    low, high = low.astype(f32), high.astype(f32)
    levels = quant_max - quant_min
    if symmetric:
        low_level, high_level = -(levels // 2 + 1), levels // 2
        widest = jnp.maximum(jnp.abs(_quotient(low, low_level)), jnp.abs(_quotient(high, high_level))).astype(f64)
        spread = (low < 0) & (high > 0)
        low = jnp.where(spread, (widest * low_level).astype(f32), low)
        high = jnp.where(spread, (widest * high_level).astype(f32), high)
    low, high = jnp.minimum(low, f32(0)), jnp.maximum(high, f32(0))
    scale = (high.astype(f64) - low.astype(f64)) / levels
    single = scale.astype(f32)
    scale = jnp.where((single == 0) | jnp.isinf(f32(1) / single), 0.1, scale)
    small = scale < f64(_SMALL_SCALE)
    amplifier = _quotient(_SMALL_SCALE, scale.astype(f32))
    low_small = jnp.where(low == 0, low, jnp.where(high == 0, -_SMALL_SCALE * f32(levels), low * amplifier))
    high_small = jnp.where(low == 0, _SMALL_SCALE * f32(levels), jnp.where(high == 0, high, high * amplifier))
    low, high = jnp.where(small, low_small, low), jnp.where(small, high_small, high)
    scale = jnp.where(small, f64(_SMALL_SCALE), scale)
    # the zero point from whichever end's solution adds the smaller terms
    low_steps, high_steps = low / scale, high / scale
    from_min_error = abs(quant_min) - jnp.abs(low_steps)
    from_max_error = abs(quant_max) - jnp.abs(high_steps)
    initial = jnp.where(from_min_error < from_max_error, quant_min - low_steps, quant_max - high_steps)
    if symmetric:
        initial = jnp.where((low < 0) & (high > 0), (quant_min + quant_max) / 2, initial)
    zero_point = jnp.clip(jnp.round(initial), quant_min, quant_max).astype(jnp.int32)
    return scale.astype(f32), zero_point


def _fused_observer_meta(x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point,
                         averaging_const, quant_min, quant_max, ch_axis, per_row_fake_quant=False,
                         symmetric_quant=False):
    torch._check(ch_axis < x.dim(), lambda: "Error in fused_moving_avg_obs_fake_quant_cpu: ch_axis must be < self.dim()")
    if per_row_fake_quant and running_min.numel() == 0:
        # the CPU kernel sizes an observer's statistics at its first call
        for statistic in (running_min, running_max, scale, zero_point):
            statistic.resize_(x.shape[ch_axis])
    return torch.empty_like(x), torch.empty_like(x, dtype=torch.bool)


@lower(aten._fused_moving_avg_obs_fq_helper_functional)
def fused_moving_average_observer_fake_quantize(x, observer_on, fake_quant_on, running_min, running_max, scale,
                                                zero_point, averaging_const, quant_min, quant_max, ch_axis,
                                                per_row_fake_quant=False, symmetric_quant=False):
    """torch.ao's fused observer and fake quantization (FusedMovingAvgObsFakeQuantize): the running minima and
    maxima move towards this batch's (per row of `ch_axis` or whole), the quantization parameters are chosen
    from them, and x is fake-quantized with them; each step only where its flag tensor is nonzero."""
    if per_row_fake_quant:
        rows = jnp.moveaxis(x, ch_axis, 0).reshape(x.shape[ch_axis], -1)
        batch_min, batch_max = rows.min(axis=1), rows.max(axis=1)
        if running_min.size == 0:
            running_min = jnp.full(x.shape[ch_axis], jnp.inf, jnp.float32)
            running_max = jnp.full(x.shape[ch_axis], -jnp.inf, jnp.float32)
            scale = jnp.resize(scale, x.shape[ch_axis])
            zero_point = jnp.resize(zero_point, x.shape[ch_axis])
    else:
        batch_min, batch_max = x.min(), x.max()
    const = jnp.asarray(averaging_const, jnp.float32)

    def moved(running, batch):
        return jnp.where(jnp.isinf(running), batch, running + const * (batch - running))

    observe = observer_on.reshape(-1)[0] != 0
    running_min = jnp.where(observe, moved(running_min, batch_min), running_min)
    running_max = jnp.where(observe, moved(running_max, batch_max), running_max)
    new_scale, new_zero_point = _choose_qparams(running_min, running_max, quant_min, quant_max, symmetric_quant)
    if per_row_fake_quant:
        values, inside = fake_quantize_per_channel(x, new_scale, new_zero_point, ch_axis, quant_min, quant_max)
    else:
        values, inside = _fake_quantize(x, new_scale.reshape(()), new_zero_point.reshape(()), quant_min, quant_max)
    enabled = fake_quant_on.reshape(-1)[0] != 0
    new_scale = jnp.where(enabled, new_scale.reshape(scale.shape), scale)
    new_zero_point = jnp.where(enabled, new_zero_point.reshape(zero_point.shape), zero_point).astype(zero_point.dtype)
    return (jnp.where(enabled, values, x), jnp.where(enabled, inside, True), running_min, running_max,
            new_scale.astype(scale.dtype), new_zero_point)


registry.META[aten._fused_moving_avg_obs_fq_helper.default] = _fused_observer_meta
