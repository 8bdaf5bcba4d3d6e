"""Softmax cross-entropy of a linear layer's logits over a large vocabulary, fused with that layer:
loss = CE(hidden @ weight.T, target). Logits are made 512 vocabulary entries at a time and never
stored; neither is their gradient: the backward recomputes each slice and turns it straight into the
hidden states' gradient (per 128 rows) and the weight's (per 128 vocabulary entries). The weight is read
as it is ([vocab, d]), its tiles transposed on chip."""
import torch

import torchneuron.kernels as nk

from .common import P, blocks, row_block, row_grid

V_TILE = 512


def _weight_columns(weight, d, v0, width):
    """weight[v0:v0+width].T in 128-deep slices of d: [kd, width] tiles (loaded [<=128, kd], transposed)."""
    return [nk.transpose(nk.load(weight[nk.ds(v0 + c, min(P, width - c)), k:k + min(P, d - k)]))
            for k in range(0, d, P) for c in range(0, width, P)]


def _logits(h_tiles, weight, d, v0, width):
    """[128, width] logits of the rows held in `h_tiles` (their 128-deep slices) for vocabulary v0.."""
    acc = nk.zeros((P, width), nk.float32, buffer=nk.psum)
    columns = iter(_weight_columns(weight, d, v0, width))
    for ht in h_tiles:
        for c in range(0, width, P):
            acc[:, c:c + min(P, width - c)] += nk.matmul(ht, next(columns))
    return acc


def _over_vocabulary(vocab, chunk, state):
    """state = chunk(v0, width, *state) over the vocabulary in 512-wide slices: the full ones in one nk.fori
    loop, the remainder after it."""
    full, tail = divmod(vocab, V_TILE)
    state = nk.fori(full, lambda j, *carry: chunk(j * V_TILE, V_TILE, *carry), state)
    return chunk(full * V_TILE, tail, *state) if tail else state


def _row_tiles(hidden, rows, valid, d):
    return [nk.load(hidden[rows, k:k + min(P, d - k)], mask=valid) for k in range(0, d, P)]


def _gradient_of_logits(logits, lse, target_t, grad_t, v0, width):
    """d loss / d logits of a slice: (softmax - onehot(target)) * the row's loss gradient (none for ignored
    rows, whose target is -1)."""
    onehot = nk.iota((1, width), 1) + v0 == target_t
    return (nk.exp(logits - lse) - nk.where(onehot, 1.0, 0.0)) * nk.where(target_t >= 0, grad_t, 0.0)


@nk.kernel
def linear_cross_entropy_forward(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the loss (lse - target logit; 0 for targets outside the vocabulary) and the lse."""
    (n, d), vocab = hidden.shape, weight.shape[0]
    loss = nk.ndarray((n, 1), nk.float32, buffer=nk.hbm)
    lse_out = nk.ndarray((n, 1), nk.float32, buffer=nk.hbm)
    rows, valid = row_block(nk.program_id(0), n)
    h_tiles = _row_tiles(hidden, rows, valid, d)
    target_t = nk.load(target[rows, None], mask=valid, other=-1)

    def chunk(v0, width, m, l, picked):
        logits = _logits(h_tiles, weight, d, v0, width)
        m_new = nk.maximum(m, nk.max(logits))
        return (m_new, l * nk.exp(m - m_new) + nk.sum(nk.exp(logits - m_new)),
                picked + nk.sum(nk.where(nk.iota((1, width), 1) + v0 == target_t, logits, 0.0)))

    m, l, picked = _over_vocabulary(vocab, chunk, (nk.full((P, 1), -1e30, nk.float32), nk.zeros((P, 1), nk.float32),
                                                   nk.zeros((P, 1), nk.float32)))
    lse = m + nk.log(l)
    known = (target_t >= 0) & (target_t < vocab)
    nk.store(loss[rows, :], nk.where(known, lse - picked, 0.0), mask=valid)
    nk.store(lse_out[rows, :], lse, mask=valid)
    return loss, lse_out


@nk.kernel
def linear_cross_entropy_backward_hidden(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                                         lse: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    (n, d), vocab = hidden.shape, weight.shape[0]
    d_hidden = nk.ndarray((n, d), hidden.dtype, buffer=nk.hbm)
    rows, valid = row_block(nk.program_id(0), n)
    h_tiles = _row_tiles(hidden, rows, valid, d)
    target_t = nk.load(target[rows, None], mask=valid, other=-1)
    lse_t = nk.load(lse[rows, :], mask=valid)
    grad_t = nk.load(grad[rows, :], mask=valid)

    def chunk(v0, width, acc):
        d_logits = _gradient_of_logits(_logits(h_tiles, weight, d, v0, width), lse_t, target_t, grad_t, v0, width)
        for c in range(0, width, P):
            depth = min(P, width - c)
            for d0 in range(0, d, V_TILE):
                cols = min(V_TILE, d - d0)
                acc[:, d0:d0 + cols] += nk.matmul(d_logits[:, c:c + depth],
                                                  nk.load(weight[nk.ds(v0 + c, depth), d0:d0 + cols]))
        return (acc,)

    (acc,) = _over_vocabulary(vocab, chunk, (nk.zeros((P, d), nk.float32),))
    nk.store(d_hidden[rows, :], acc, mask=valid)
    return d_hidden


@nk.kernel
def linear_cross_entropy_backward_weight(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                                         lse: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The weight's gradient for 128 vocabulary entries, over all rows."""
    (n, d), vocab = hidden.shape, weight.shape[0]
    d_weight = nk.ndarray((vocab, d), weight.dtype, buffer=nk.hbm)
    v = nk.program_id(0)
    entries = nk.ds(v * P, P)
    entry_ok = nk.iota((1, P), 1) + v * P < vocab
    w_tiles = [nk.transpose(nk.load(weight[entries, k:k + min(P, d - k)], mask=nk.transpose(entry_ok)))
               for k in range(0, d, P)]

    def step(i, acc):
        rows, valid = row_block(i, n)
        logits = nk.zeros((P, P), nk.float32, buffer=nk.psum)
        for ht, wt in zip(_row_tiles(hidden, rows, valid, d), w_tiles):
            logits += nk.matmul(ht, wt)
        d_logits = _gradient_of_logits(logits, nk.load(lse[rows, :], mask=valid),
                                       nk.load(target[rows, None], mask=valid, other=-1),
                                       nk.load(grad[rows, :], mask=valid), v * P, P)
        d_logits = nk.where(entry_ok & valid, d_logits, 0.0)
        for d0 in range(0, d, V_TILE):
            cols = min(V_TILE, d - d0)
            acc[:, d0:d0 + cols] += nk.matmul(d_logits, nk.load(hidden[rows, d0:d0 + cols], mask=valid),
                                              transpose_x=True)
        return (acc,)

    (acc,) = nk.fori(blocks(n), step, (nk.zeros((P, d), nk.float32),))
    nk.store(d_weight[entries, :], acc, mask=nk.transpose(entry_ok))
    return d_weight


def _backward(inputs, outputs, grads):
    hidden, weight, target = inputs
    _, lse = outputs
    grad = grads[0].contiguous()
    return (_backward_hidden(hidden, weight, target, lse, grad), _backward_weight(hidden, weight, target, lse, grad),
            None)


_backward_hidden = nk.custom_op("torchneuron_kernels::linear_cross_entropy_backward_hidden",
                                linear_cross_entropy_backward_hidden, grid=row_grid)
_backward_weight = nk.custom_op("torchneuron_kernels::linear_cross_entropy_backward_weight",
                                linear_cross_entropy_backward_weight,
                                grid=lambda hidden, weight, *rest: (blocks(weight.shape[0]),))
_forward = nk.custom_op("torchneuron_kernels::linear_cross_entropy", linear_cross_entropy_forward, grid=row_grid,
                        backward=_backward)


def linear_cross_entropy(hidden, weight, target, *, ignore_index: int = -100, reduction: str = "mean"):
    """F.cross_entropy(hidden @ weight.T, target) for hidden [..., d], weight [vocab, d] (an nn.Linear's or a
    tied embedding's) and target [...], without the logits or their gradient in memory."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"linear_cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if weight.dim() != 2 or hidden.shape[-1] != weight.shape[1] or target.shape != hidden.shape[:-1]:
        raise RuntimeError(f"linear_cross_entropy: expected hidden [..., d], weight [vocab, d], target [...]; got "
                           f"{tuple(hidden.shape)}, {tuple(weight.shape)}, {tuple(target.shape)}")
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"linear_cross_entropy: target must be an integer tensor, got {target.dtype}")
    flat_target = target.reshape(-1)
    counted = flat_target != ignore_index
    kernel_target = torch.where(counted, flat_target, -1).to(torch.int32)
    loss, _ = _forward(hidden.reshape(-1, hidden.shape[-1]).contiguous(), weight.contiguous(), kernel_target)
    loss = loss.reshape(target.shape).to(hidden.dtype)
    if reduction == "none":
        return loss
    total = loss.sum()
    return total if reduction == "sum" else total / counted.sum()
