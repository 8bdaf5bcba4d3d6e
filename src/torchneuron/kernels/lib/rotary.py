"""Rotary position embedding applied to q or k ([batch, heads, seq, dim]) in one pass: out = x * cos +
rotate_half(x) * sin (the Llama/HF convention), with cos/sin [seq, dim] or [batch or 1, seq, dim]."""
import torch

import torchneuron.kernels as nk

from .common import blocks, check_floating, row_block


@nk.kernel
def rope_kernel(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool) -> torch.Tensor:
    """`inverse` applies the transposed rotation (the backward: dx from dy)."""
    batch, heads, seq, dim = x.shape
    half = dim // 2
    out = nk.ndarray(x.shape, x.dtype, buffer=nk.hbm)
    b, h = nk.program_id(0), nk.program_id(1)
    rows, valid = row_block(nk.program_id(2), seq)
    cb = b if cos.shape[0] > 1 else 0
    t = nk.load(x[b, h, rows, :], mask=valid, dtype=nk.float32)
    c = nk.load(cos[cb, rows, :], mask=valid, dtype=nk.float32)
    s = nk.load(sin[cb, rows, :], mask=valid, dtype=nk.float32)
    result = t * c
    first, second = t[:, :half], t[:, half:]
    if inverse:
        result[:, :half] += second * s[:, half:]
        result[:, half:] -= first * s[:, :half]
    else:
        result[:, :half] -= second * s[:, :half]
        result[:, half:] += first * s[:, half:]
    nk.store(out[b, h, rows, :], result, mask=valid)
    return out


def _grid(x, *rest):
    return (x.shape[0], x.shape[1], blocks(x.shape[2]))


def _backward(inputs, outputs, grads):
    x, cos, sin, inverse = inputs
    return _rope(grads[0].contiguous(), cos, sin, not inverse), None, None, None


_rope = nk.custom_op("torchneuron_kernels::rope", rope_kernel, grid=_grid, backward=_backward)


def rope(x, cos, sin):
    """x * cos + rotate_half(x) * sin for x [batch, heads, seq, dim], cos/sin [seq, dim] or
    [batch or 1, seq, dim] (as transformers' rotary embedding returns them); differentiable in x."""
    check_floating("rope", x=x, cos=cos, sin=sin)
    if x.dim() != 4 or x.shape[-1] % 2:
        raise RuntimeError(f"rope: x must be [batch, heads, seq, dim] with an even dim, got {tuple(x.shape)}")
    cos, sin = (t.unsqueeze(0) if t.dim() == 2 else t for t in (cos, sin))
    want = (x.shape[2], x.shape[3])
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 3 or tuple(t.shape[1:]) != want or t.shape[0] not in (1, x.shape[0]):
            raise RuntimeError(f"rope: {name} must be [seq, dim] or [batch or 1, seq, dim] = {want}, got "
                               f"{tuple(t.shape)}")
    return _rope(x.contiguous(), cos.contiguous(), sin.contiguous(), False)
