"""Mixture of experts: a top-k router with expert capacity, token permutation into per-expert capacity
buffers and back (gathers by index), and a blockwise grouped expert matmul, each a kernel; `MoE` is a
layer built from them.

Capacity follows GShard: every token's first choice is placed before any token's second, in token order;
a token whose expert is full at its choice is dropped for that choice (slot -1)."""
import torch

import torchneuron.kernels as nk

from .common import P, blocks, row_block
from .matmul import N_TILE, matmul_tile


@nk.kernel
def router_kernel(logits: torch.Tensor, k: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token its k best experts (ties: the lowest index) and its slot in each (-1: over capacity)."""
    n, experts = logits.shape
    chosen = nk.ndarray((n, k), nk.int32, buffer=nk.hbm)
    slots = nk.ndarray((n, k), nk.int32, buffer=nk.hbm)
    columns = nk.iota((P, experts), 1)
    earlier = nk.where(nk.iota((P, P), 1) < nk.iota((P, P), 0), 1.0, 0.0)  # [row, other]: other comes first
    ones = nk.full((P, 1), 1.0, nk.float32)
    counts = nk.zeros((1, experts), nk.float32)
    for choice in range(k):
        for i in nk.sequential_range(blocks(n)):
            rows, valid = row_block(i, n)
            scores = nk.load(logits[rows, :], mask=valid, dtype=nk.float32)
            for better in range(choice + 1):
                best = nk.min(nk.where(scores == nk.max(scores), columns, experts))
                scores = nk.where(columns == best, -3.0e38, scores)
            onehot = nk.where((columns == best) & valid, 1.0, 0.0)
            position = nk.sum(onehot * (nk.matmul(earlier, onehot) + counts))
            counts[...] = counts + nk.matmul(ones, onehot, transpose_x=True)
            nk.store(chosen[rows, choice:choice + 1], best, mask=valid)
            nk.store(slots[rows, choice:choice + 1], nk.where(position < capacity, position, -1.0), mask=valid)
    return chosen, slots


@nk.kernel
def gather_rows_kernel(x: torch.Tensor, index: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """out[r] = x[index[r]] * scale[r]; rows whose index is -1 are zero."""
    m, d = index.shape[0], x.shape[1]
    out = nk.ndarray((m, d), x.dtype, buffer=nk.hbm)
    rows, valid = row_block(nk.program_id(0), m)
    source = nk.load(index[rows, None], mask=valid, other=-1)
    taken = nk.load(x[source, :], mask=source >= 0, dtype=nk.float32)
    nk.store(out[rows, :], taken * nk.load(scale[rows, None], mask=valid), mask=valid)
    return out


@nk.kernel
def combine_kernel(buffer: torch.Tensor, slot: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """out[t] = sum over choices c of weight[t, c] * buffer[slot[t, c]] (slot -1: nothing)."""
    (n, k), d = slot.shape, buffer.shape[1]
    out = nk.ndarray((n, d), buffer.dtype, buffer=nk.hbm)
    rows, valid = row_block(nk.program_id(0), n)
    acc = nk.zeros((P, d), nk.float32)
    for c in range(k):
        source = nk.load(slot[rows, c:c + 1], mask=valid, other=-1)
        acc += nk.load(buffer[source, :], mask=source >= 0, dtype=nk.float32) * \
            nk.load(weight[rows, c:c + 1], mask=valid, dtype=nk.float32)
    nk.store(out[rows, :], acc, mask=valid)
    return out


@nk.kernel
def combine_weight_grad_kernel(buffer: torch.Tensor, slot: torch.Tensor, d_out: torch.Tensor) -> torch.Tensor:
    (n, k) = slot.shape
    d_weight = nk.ndarray((n, k), nk.float32, buffer=nk.hbm)
    rows, valid = row_block(nk.program_id(0), n)
    g = nk.load(d_out[rows, :], mask=valid, dtype=nk.float32)
    for c in range(k):
        source = nk.load(slot[rows, c:c + 1], mask=valid, other=-1)
        nk.store(d_weight[rows, c:c + 1], nk.sum(g * nk.load(buffer[source, :], mask=source >= 0)), mask=valid)
    return d_weight


@nk.kernel
def grouped_matmul_kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """out[e] = a[e] @ b[e], blockwise: program (e, i, j) makes rows 128i.. and columns 512j.. of expert e."""
    (groups, m, k), n = a.shape, b.shape[2]
    out = nk.ndarray((groups, m, n), a.dtype, buffer=nk.hbm)
    matmul_tile(out, a, b, nk.program_id(1), nk.program_id(2), m, k, n, lead=(nk.program_id(0),))
    return out


def _rows_of(x, *rest):
    return (blocks(x.shape[0]),)


_router = nk.custom_op("torchneuron_kernels::moe_router", router_kernel, grid=())
_gather_rows = nk.custom_op("torchneuron_kernels::moe_gather_rows", gather_rows_kernel,
                            grid=lambda x, index, scale: (blocks(index.shape[0]),))
_combine_weight_grad = nk.custom_op("torchneuron_kernels::moe_combine_weight_grad", combine_weight_grad_kernel,
                                    grid=lambda buffer, slot, d_out: (blocks(slot.shape[0]),))


def _inverse(slot, values, rows):
    """Per buffer row: the token (and its value) whose choice landed there, -1 (0) where none did."""
    placed = slot >= 0
    token = torch.arange(slot.shape[0], device=slot.device, dtype=torch.int32)[:, None].expand_as(slot)
    index = torch.full((rows,), -1, dtype=torch.int32, device=slot.device)
    scale = torch.zeros((rows,), dtype=torch.float32, device=slot.device)
    where = torch.where(placed, slot, rows).reshape(-1).long()
    index = torch.cat([index, index[:1]]).index_put((where,), token.reshape(-1))[:rows]
    scale = torch.cat([scale, scale[:1]]).index_put((where,), values.reshape(-1).float())[:rows]
    return index, scale


def _combine_backward(inputs, outputs, grads):
    buffer, slot, weight = inputs
    d_out = grads[0].contiguous()
    index, scale = _inverse(slot, weight.detach(), buffer.shape[0])
    return _gather_rows(d_out, index, scale), None, _combine_weight_grad(buffer, slot, d_out).to(weight.dtype)


_combine = nk.custom_op("torchneuron_kernels::moe_combine", combine_kernel,
                        grid=lambda buffer, slot, weight: (blocks(slot.shape[0]),), backward=_combine_backward)


def _grouped_grid(a, b):
    return (a.shape[0], blocks(a.shape[1]), blocks(b.shape[2], N_TILE))


def _grouped_backward(inputs, outputs, grads):
    a, b = inputs
    d_out = grads[0].contiguous()
    return (_grouped(d_out, b.transpose(1, 2).contiguous()), _grouped(a.transpose(1, 2).contiguous(), d_out))


_grouped = nk.custom_op("torchneuron_kernels::moe_grouped_matmul", grouped_matmul_kernel, grid=_grouped_grid,
                        backward=_grouped_backward)


def route(logits, k: int, capacity: int):
    """(experts [tokens, k] int32, slots [tokens, k] int32 with -1 for tokens over capacity)."""
    if logits.dim() != 2 or not 0 < k <= logits.shape[1] or logits.shape[1] > N_TILE:
        raise RuntimeError(f"route: logits must be [tokens, experts <= {N_TILE}] with 0 < k <= experts, got "
                           f"{tuple(logits.shape)} and k={k}")
    return _router(logits.detach().float().contiguous(), int(k), int(capacity))


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, slot, rows):
        index, scale = _inverse(slot, torch.ones(slot.shape, device=slot.device), rows)
        ctx.save_for_backward(slot)
        return _gather_rows(x.contiguous(), index, scale)

    @staticmethod
    def backward(ctx, d_buffer):
        (slot,) = ctx.saved_tensors
        ones = torch.ones(slot.shape, dtype=d_buffer.dtype, device=slot.device)
        return _combine(d_buffer.contiguous(), slot, ones), None, None


def permute(x, slot, rows: int):
    """Token rows into buffer rows: buffer[slot[t, c]] = x[t] (slot -1: not placed); [rows, d]."""
    return _Permute.apply(x, slot, rows)


def unpermute(buffer, slot, weight):
    """Back to tokens: out[t] = sum_c weight[t, c] * buffer[slot[t, c]]."""
    return _combine(buffer.contiguous(), slot, weight.contiguous())


def grouped_matmul(a, b):
    """out[e] = a[e] @ b[e] for a [experts, rows, k], b [experts, k, n]."""
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise RuntimeError(f"grouped_matmul: expected a [e, m, k] and b [e, k, n], got {tuple(a.shape)}, "
                           f"{tuple(b.shape)}")
    return _grouped(a.contiguous(), b.contiguous())


class MoE(torch.nn.Module):
    """Top-k routed experts, each silu(x @ w1[e]) @ w2[e], with capacity
    ceil(capacity_factor * tokens * k / experts); weights are the router's softmax over the chosen
    experts, renormalised."""

    def __init__(self, dim: int, hidden: int, experts: int, k: int = 2, capacity_factor: float = 1.25):
        super().__init__()
        self.k, self.experts, self.capacity_factor = k, experts, capacity_factor
        self.router = torch.nn.Linear(dim, experts, bias=False)
        self.w1 = torch.nn.Parameter(torch.randn(experts, dim, hidden) / dim ** 0.5)
        self.w2 = torch.nn.Parameter(torch.randn(experts, hidden, dim) / hidden ** 0.5)

    def capacity(self, tokens: int) -> int:
        return max(1, -(-int(self.capacity_factor * tokens * self.k) // self.experts))

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.router(x)
        capacity = self.capacity(x.shape[0])
        chosen, slots = route(logits, self.k, capacity)
        weight = torch.softmax(logits.float(), -1).gather(1, chosen.long())
        weight = weight / weight.sum(-1, keepdim=True)
        placed = slots >= 0
        slot = torch.where(placed, chosen * capacity + slots, -1)
        weight = torch.where(placed, weight, 0.0).to(x.dtype)
        buffer = permute(x, slot, self.experts * capacity).reshape(self.experts, capacity, -1)
        hidden = torch.nn.functional.silu(grouped_matmul(buffer, self.w1))
        out = grouped_matmul(hidden, self.w2).reshape(self.experts * capacity, -1)
        return unpermute(out, slot, weight).reshape(shape)
