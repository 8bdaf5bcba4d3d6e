"""Fake quantization for quantization-aware training: values rounded to an integer grid and back, in float.

torch.ao's FakeQuantize modules and `torch.fake_quantize_per_*_affine` call these. The mask they also return
marks the values whose grid level is inside the range: their gradient passes (straight-through), the
others' is zero. As PyTorch's kernels: x times the float32 inverse of the scale, rounded half to even; an
integer zero point is added after rounding, a floating one before.
"""
import jax.numpy as jnp
import torch

from . import checks
from .registry import lower

aten = torch.ops.aten


def _fake_quantize(x, scale, zero_point, quant_min, quant_max):
    """(fake-quantized x, in-range mask); `scale` and `zero_point` broadcast against x."""
    scale = jnp.asarray(scale, jnp.float32)
    scaled = x.astype(jnp.float32) * (1 / scale)
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
