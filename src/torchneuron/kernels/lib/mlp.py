"""The SwiGLU MLP, (silu(x @ w_gate) * (x @ w_up)) @ w_down, fused forward: each program takes 128 tokens
through 512-wide slices of the hidden dimension, so the [tokens, hidden] activations never reach HBM.
The backward recomputes the gate and up projections with the matmul kernel."""
import torch

import torchneuron.kernels as nk

from .common import P, blocks, check_floating, row_block, row_grid
from .matmul import N_TILE, matmul


@nk.kernel
def swiglu_forward(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    (n, d), f = x.shape, w_gate.shape[1]
    out = nk.ndarray((n, d), x.dtype, buffer=nk.hbm)
    rows, valid = row_block(nk.program_id(0), n)
    depths = [(k, min(P, d - k)) for k in range(0, d, P)]
    xs = [nk.load(x[rows, k:k + kd], mask=valid) for k, kd in depths]
    acc = nk.zeros((P, d), nk.float32)
    for f0 in range(0, f, N_TILE):
        width = min(N_TILE, f - f0)
        gate = nk.zeros((P, width), nk.float32, buffer=nk.psum)
        up = nk.zeros((P, width), nk.float32, buffer=nk.psum)
        for xk, (k, kd) in zip(xs, depths):
            gate += nk.matmul(xk, nk.load(w_gate[k:k + kd, f0:f0 + width]))
            up += nk.matmul(xk, nk.load(w_up[k:k + kd, f0:f0 + width]))
        hidden = (nk.silu(gate) * up).astype(x.dtype)
        for c in range(0, width, P):
            depth = min(P, width - c)
            for d0 in range(0, d, N_TILE):
                cols = min(N_TILE, d - d0)
                acc[:, d0:d0 + cols] += nk.matmul(hidden[:, c:c + depth],
                                                  nk.load(w_down[f0 + c:f0 + c + depth, d0:d0 + cols]))
    nk.store(out[rows, :], acc, mask=valid)
    return out


@nk.kernel
def swiglu_gate_backward(gate: torch.Tensor, up: torch.Tensor, d_hidden: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the gate and up projections and d(hidden): hidden, d(gate), d(up)."""
    n, f = gate.shape
    hidden = nk.ndarray((n, f), gate.dtype, buffer=nk.hbm)
    d_gate = nk.ndarray((n, f), gate.dtype, buffer=nk.hbm)
    d_up = nk.ndarray((n, f), gate.dtype, buffer=nk.hbm)
    rows, valid = row_block(nk.program_id(0), n)
    cols = nk.ds(nk.program_id(1) * N_TILE, N_TILE)
    ok = valid & (nk.iota((1, N_TILE), 1) + nk.program_id(1) * N_TILE < f)
    g = nk.load(gate[rows, cols], mask=ok, dtype=nk.float32)
    u = nk.load(up[rows, cols], mask=ok, dtype=nk.float32)
    dh = nk.load(d_hidden[rows, cols], mask=ok, dtype=nk.float32)
    sig = nk.sigmoid(g)
    nk.store(hidden[rows, cols], g * sig * u, mask=ok)
    nk.store(d_up[rows, cols], dh * g * sig, mask=ok)
    nk.store(d_gate[rows, cols], dh * u * sig * (1.0 + g * (1.0 - sig)), mask=ok)
    return hidden, d_gate, d_up


def _backward(inputs, outputs, grads):
    x, w_gate, w_up, w_down = inputs
    dy = grads[0].contiguous()
    gate, up = matmul(x, w_gate), matmul(x, w_up)
    hidden, d_gate, d_up = _gate_backward(gate, up, matmul(dy, w_down.t()))
    dx = matmul(d_gate, w_gate.t()) + matmul(d_up, w_up.t())
    xt = x.t()
    return dx, matmul(xt, d_gate), matmul(xt, d_up), matmul(hidden.t(), dy)


_gate_backward = nk.custom_op("torchneuron_kernels::swiglu_gate_backward", swiglu_gate_backward,
                              grid=lambda gate, up, dh: (blocks(gate.shape[0]), blocks(gate.shape[1], N_TILE)))
_swiglu = nk.custom_op("torchneuron_kernels::swiglu", swiglu_forward, grid=row_grid, backward=_backward)


def swiglu(x, w_gate, w_up, w_down):
    """(silu(x @ w_gate) * (x @ w_up)) @ w_down for x [..., d], w_gate and w_up [d, f], w_down [f, d]
    (nn.Linear weights transposed)."""
    check_floating("swiglu", x=x, w_gate=w_gate, w_up=w_up, w_down=w_down)
    d = x.shape[-1]
    if w_gate.dim() != 2 or w_gate.shape[0] != d or w_up.shape != w_gate.shape or \
            tuple(w_down.shape) != (w_gate.shape[1], d):
        raise RuntimeError(f"swiglu: for x [..., {d}] the weights must be w_gate, w_up [{d}, f] and w_down [f, {d}]; "
                           f"got {tuple(w_gate.shape)}, {tuple(w_up.shape)}, {tuple(w_down.shape)}")
    out = _swiglu(x.reshape(-1, d).contiguous(), w_gate.contiguous(), w_up.contiguous(), w_down.contiguous())
    return out.reshape(x.shape)
