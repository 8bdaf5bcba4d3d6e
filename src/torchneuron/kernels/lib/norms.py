"""RMSNorm and LayerNorm, optionally fused with the residual add before them (`h = x + residual`, then
the norm of `h`): one pass over the rows forward, one backward (weight and bias gradients reduced per
program across its rows with a matmul, then across programs)."""
from typing import Optional

import torch

import torchneuron.kernels as nk

from .common import P, check_floating, check_last_dim, row_block, row_grid


@nk.kernel
def norm_forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                 residual: Optional[torch.Tensor], eps: float, centered: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    n, d = x.shape
    y = nk.ndarray((n, d), x.dtype, buffer=nk.hbm)
    h_out = nk.ndarray((n, d) if residual is not None else (0, d), x.dtype, buffer=nk.hbm)
    mean_out = nk.ndarray((n, 1), nk.float32, buffer=nk.hbm)
    rstd_out = nk.ndarray((n, 1), nk.float32, buffer=nk.hbm)
    rows, valid = row_block(nk.program_id(0), n)
    h = nk.load(x[rows, :], mask=valid, dtype=nk.float32)
    if residual is not None:
        h = h + nk.load(residual[rows, :], mask=valid, dtype=nk.float32)
        nk.store(h_out[rows, :], h, mask=valid)
    mean = nk.mean(h) if centered else nk.zeros((P, 1), nk.float32)
    centred = h - mean
    rstd = nk.rsqrt(nk.mean(centred * centred) + eps)
    out = centred * rstd * nk.load(weight[None, :], dtype=nk.float32)
    if bias is not None:
        out = out + nk.load(bias[None, :], dtype=nk.float32)
    nk.store(y[rows, :], out, mask=valid)
    nk.store(mean_out[rows, :], mean, mask=valid)
    nk.store(rstd_out[rows, :], rstd, mask=valid)
    return y, h_out, mean_out, rstd_out


@nk.kernel
def norm_backward(h: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                  dy: torch.Tensor, centered: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dx of the norm, and per program the column sums dW = sum(dy * xhat), dB = sum(dy) of its rows."""
    n, d = h.shape
    i = nk.program_id(0)
    dx = nk.ndarray((n, d), h.dtype, buffer=nk.hbm)
    dw = nk.ndarray((nk.num_programs(0), d), nk.float32, buffer=nk.hbm)
    db = nk.ndarray((nk.num_programs(0), d), nk.float32, buffer=nk.hbm)
    rows, valid = row_block(i, n)
    r = nk.load(rstd[rows, :], mask=valid, dtype=nk.float32)
    xhat = (nk.load(h[rows, :], mask=valid, dtype=nk.float32) - nk.load(mean[rows, :], mask=valid)) * r
    g_out = nk.load(dy[rows, :], mask=valid, dtype=nk.float32)
    g = g_out * nk.load(weight[None, :], dtype=nk.float32)
    inner = g - xhat * nk.mean(g * xhat)
    if centered:
        inner = inner - nk.mean(g)
    nk.store(dx[rows, :], inner * r, mask=valid)
    ones = nk.full((P, 1), 1.0, nk.float32)
    for c in range(0, d, 512):  # column sums across the partition axis: ones^T @ tile
        width = min(512, d - c)
        nk.store(dw[nk.ds(i, 1), c:c + width], nk.matmul(ones, (g_out * xhat)[:, c:c + width], transpose_x=True))
        nk.store(db[nk.ds(i, 1), c:c + width], nk.matmul(ones, g_out[:, c:c + width], transpose_x=True))
    return dx, dw, db


def _backward(inputs, outputs, grads):
    x, weight, bias, residual, eps, centered = inputs
    y, h, mean, rstd = outputs
    dy, dh = grads[0], grads[1]
    source = h if residual is not None else x
    dx, dw, db = _norm_backward(source, weight, mean, rstd, dy.contiguous(), centered)
    if residual is not None:
        dx = dx + dh
    return (dx, dw.sum(0).to(weight.dtype), None if bias is None else db.sum(0).to(bias.dtype),
            None if residual is None else dx, None, None)


_norm_backward = nk.custom_op("torchneuron_kernels::norm_backward", norm_backward, grid=row_grid)
_norm = nk.custom_op("torchneuron_kernels::norm", norm_forward, grid=row_grid, backward=_backward)


def _normalize(name, x, weight, bias, residual, eps, centered):
    check_floating(name, x=x, weight=weight, bias=bias, residual=residual)
    check_last_dim(name, x, "weight", weight)
    check_last_dim(name, x, "bias", bias)
    if residual is not None and residual.shape != x.shape:
        raise RuntimeError(f"{name}: residual has shape {tuple(residual.shape)}, the input {tuple(x.shape)}")
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    y, h, _, _ = _norm(flat, weight, bias, None if residual is None else residual.reshape(flat.shape),
                       float(eps), centered)
    y = y.reshape(shape)
    return y if residual is None else (y, h.reshape(shape))


def rms_norm(x, weight, eps: float = 1e-6, *, residual=None):
    """x * rsqrt(mean(x^2) + eps) * weight over the last dimension. With `residual`, normalises
    h = x + residual and returns (normed, h)."""
    return _normalize("rms_norm", x, weight, None, residual, eps, False)


def layer_norm(x, weight, bias=None, eps: float = 1e-5, *, residual=None):
    """F.layer_norm over the last dimension. With `residual`, normalises h = x + residual and returns
    (normed, h)."""
    return _normalize("layer_norm", x, weight, bias, residual, eps, True)
