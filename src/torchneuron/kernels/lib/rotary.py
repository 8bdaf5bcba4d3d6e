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

    def halves(t, *lead):  # the two halves of the last dimension, each its own tile: whole-tile arithmetic
        return [nk.load(t[(*lead, rows, nk.ds(k * half, half))], mask=valid, dtype=nk.float32) for k in (0, 1)]

    first, second = halves(x, b, h)
    (c1, c2), (s1, s2) = halves(cos, cb), halves(sin, cb)
    if inverse:
        out1, out2 = first * c1 + second * s2, second * c2 - first * s1
    else:
        out1, out2 = first * c1 - second * s1, second * c2 + first * s2
    nk.store(out[b, h, rows, nk.ds(0, half)], out1, mask=valid)
    nk.store(out[b, h, rows, nk.ds(half, half)], out2, mask=valid)
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
