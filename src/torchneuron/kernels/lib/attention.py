"""FlashAttention in the kernel language: forward (online softmax over 128-key blocks, never the score
matrix) and backward (dq per query block; dk, dv per key block and query head, summed over a GQA group),
with causal and sliding-window masks, grouped-query attention, dropout drawn from the device generator
(a seed tensor; each element's mask is a hash of (seed, head, query, key), so the backward regenerates
it), and variable-length batches packed with cu_seqlens (segment ids mask attention across sequences)."""
from typing import Optional

import torch

import torchneuron.kernels as nk

from .common import P, blocks

NEG = -1e30  # masked scores: finite, so a fully masked block gives exp(0) * 0, not nan


def _mask(b, row_idx, col_idx, rows, cols, row_ok, col_ok, q_seg, k_seg, causal, window_left, window_right):
    """Which (query, key) pairs of a [128, 128] block attend."""
    allowed = col_ok & row_ok
    if causal:
        allowed = allowed & (col_idx <= row_idx)
    if window_left >= 0:
        allowed = allowed & (col_idx >= row_idx - window_left)
    if window_right >= 0:
        allowed = allowed & (col_idx <= row_idx + window_right)
    if q_seg is not None:
        same = nk.load(q_seg[b, rows, None], mask=row_ok, other=-1) == \
            nk.load(k_seg[b, None, cols], mask=col_ok, other=-2)
        allowed = allowed & same
    return allowed


def _keep(seed, row_idx, col_idx, keys, dropout_p):
    """The dropout mask of a block: True where the element is kept."""
    return nk.random_uniform(seed, row_idx * keys + col_idx) >= dropout_p


class _Block:
    """A query block and the masking state every kernel recomputes the same way."""

    def __init__(self, q, k, seed, b, h, i, queries, keys):
        self.b, self.h = b, h
        self.rows = nk.ds(i * P, P)
        self.row_idx = nk.iota((P, 1), 0) + i * P
        self.row_ok = self.row_idx < queries
        self.seed = nk.load(seed[None, :], dtype=nk.uint32) + (b * q.shape[1] + h) * 1000003
        self.keys = keys

    def key_block(self, j):
        cols = nk.ds(j * P, P)
        col_idx = nk.iota((1, P), 1) + j * P
        return cols, col_idx, col_idx < self.keys, nk.transpose(col_idx < self.keys)


@nk.kernel
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seed: torch.Tensor,
                      q_seg: Optional[torch.Tensor], k_seg: Optional[torch.Tensor], scale: float, causal: bool,
                      window_left: int, window_right: int, dropout: bool, dropout_p: float
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    batch, heads, queries, dim = q.shape
    keys, group = k.shape[2], heads // k.shape[1]
    out = nk.ndarray(q.shape, q.dtype, buffer=nk.hbm)
    lse = nk.ndarray((batch, heads, queries, 1), nk.float32, buffer=nk.hbm)
    b, h = nk.program_id(0), nk.program_id(1)
    blk = _Block(q, k, seed, b, h, nk.program_id(2), queries, keys)
    qt = nk.load(q[b, h, blk.rows, :], mask=blk.row_ok)

    def step(j, m, l, o):
        cols, col_idx, col_ok, key_rows_ok = blk.key_block(j)
        kt = nk.load(k[b, h // group, cols, :], mask=key_rows_ok)
        vt = nk.load(v[b, h // group, cols, :], mask=key_rows_ok)
        allowed = _mask(b, blk.row_idx, col_idx, blk.rows, cols, blk.row_ok, col_ok, q_seg, k_seg, causal,
                        window_left, window_right)
        s = nk.where(allowed, nk.matmul(qt, nk.transpose(kt)) * scale, NEG)
        m_new = nk.maximum(m, nk.max(s))
        p = nk.where(allowed, nk.exp(s - m_new), 0.0)
        alpha = nk.exp(m - m_new)
        if dropout:
            p_used = nk.where(_keep(blk.seed, blk.row_idx, col_idx, keys, dropout_p), p / (1.0 - dropout_p), 0.0)
        else:
            p_used = p
        return m_new, l * alpha + nk.sum(p), o * alpha + nk.matmul(p_used, vt)

    m, l, o = nk.fori(blocks(keys), step, (nk.full((P, 1), NEG, nk.float32), nk.zeros((P, 1), nk.float32),
                                           nk.zeros((P, dim), nk.float32)))
    safe = nk.where(l == 0.0, 1.0, l)
    nk.store(out[b, h, blk.rows, :], o / safe, mask=blk.row_ok)
    nk.store(lse[b, h, blk.rows, :], m + nk.log(safe), mask=blk.row_ok)
    return out, lse


def _probabilities(blk, qt, kt, lse_t, col_idx, cols, col_ok, q_seg, k_seg, scale, causal, window_left,
                   window_right):
    allowed = _mask(blk.b, blk.row_idx, col_idx, blk.rows, cols, blk.row_ok, col_ok, q_seg, k_seg, causal,
                    window_left, window_right)
    return allowed, nk.where(allowed, nk.exp(nk.matmul(qt, nk.transpose(kt)) * scale - lse_t), 0.0)


def _query_side(q, out, d_out, lse, blk):
    """A query block's q, dO, lse and D = rowsum(dO * O)."""
    b, h, rows, ok = blk.b, blk.h, blk.rows, blk.row_ok
    d_o = nk.load(d_out[b, h, rows, :], mask=ok, dtype=nk.float32)
    delta = nk.sum(d_o * nk.load(out[b, h, rows, :], mask=ok, dtype=nk.float32))
    return nk.load(q[b, h, rows, :], mask=ok), d_o, nk.load(lse[b, h, rows, :], mask=ok), delta


@nk.kernel
def attention_backward_dq(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seed: torch.Tensor,
                          q_seg: Optional[torch.Tensor], k_seg: Optional[torch.Tensor], out: torch.Tensor,
                          d_out: torch.Tensor, lse: torch.Tensor, scale: float, causal: bool, window_left: int,
                          window_right: int, dropout: bool, dropout_p: float) -> torch.Tensor:
    keys, group, dim = k.shape[2], q.shape[1] // k.shape[1], q.shape[3]
    dq = nk.ndarray(q.shape, q.dtype, buffer=nk.hbm)
    b, h = nk.program_id(0), nk.program_id(1)
    blk = _Block(q, k, seed, b, h, nk.program_id(2), q.shape[2], keys)
    qt, d_o, lse_t, delta = _query_side(q, out, d_out, lse, blk)

    def step(j, acc):
        cols, col_idx, col_ok, key_rows_ok = blk.key_block(j)
        kt = nk.load(k[b, h // group, cols, :], mask=key_rows_ok)
        vt = nk.load(v[b, h // group, cols, :], mask=key_rows_ok)
        allowed, p = _probabilities(blk, qt, kt, lse_t, col_idx, cols, col_ok, q_seg, k_seg, scale, causal,
                                    window_left, window_right)
        dp = nk.matmul(d_o, nk.transpose(vt))
        if dropout:
            dp = nk.where(_keep(blk.seed, blk.row_idx, col_idx, keys, dropout_p), dp / (1.0 - dropout_p), 0.0)
        return (acc + nk.matmul(p * (dp - delta), kt),)

    (acc,) = nk.fori(blocks(keys), step, (nk.zeros((P, dim), nk.float32),))
    nk.store(dq[b, h, blk.rows, :], acc * scale, mask=blk.row_ok)
    return dq


@nk.kernel
def attention_backward_dkdv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seed: torch.Tensor,
                            q_seg: Optional[torch.Tensor], k_seg: Optional[torch.Tensor], out: torch.Tensor,
                            d_out: torch.Tensor, lse: torch.Tensor, scale: float, causal: bool, window_left: int,
                            window_right: int, dropout: bool, dropout_p: float
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """dk, dv of one key block from one query head (per query head: a GQA group's are summed after)."""
    batch, heads, queries, dim = q.shape
    keys, group = k.shape[2], heads // k.shape[1]
    dk = nk.ndarray((batch, heads, keys, dim), nk.float32, buffer=nk.hbm)
    dv = nk.ndarray((batch, heads, keys, dim), nk.float32, buffer=nk.hbm)
    b, h, j = nk.program_id(0), nk.program_id(1), nk.program_id(2)
    probe = _Block(q, k, seed, b, h, 0, queries, keys)
    cols, col_idx, col_ok, key_rows_ok = probe.key_block(j)
    kt = nk.load(k[b, h // group, cols, :], mask=key_rows_ok)
    vt = nk.load(v[b, h // group, cols, :], mask=key_rows_ok)

    def step(i, dk_acc, dv_acc):
        blk = _Block(q, k, seed, b, h, i, queries, keys)
        qt, d_o, lse_t, delta = _query_side(q, out, d_out, lse, blk)
        allowed, p = _probabilities(blk, qt, kt, lse_t, col_idx, cols, col_ok, q_seg, k_seg, scale, causal,
                                    window_left, window_right)
        dp = nk.matmul(d_o, nk.transpose(vt))
        p_used = p
        if dropout:
            keep = _keep(blk.seed, blk.row_idx, col_idx, keys, dropout_p)
            p_used = nk.where(keep, p / (1.0 - dropout_p), 0.0)
            dp = nk.where(keep, dp / (1.0 - dropout_p), 0.0)
        return (dk_acc + nk.matmul(p * (dp - delta), qt, transpose_x=True),
                dv_acc + nk.matmul(p_used, d_o, transpose_x=True))

    dk_acc, dv_acc = nk.fori(blocks(queries), step, (nk.zeros((P, dim), nk.float32), nk.zeros((P, dim), nk.float32)))
    nk.store(dk[b, h, cols, :], dk_acc * scale, mask=key_rows_ok)
    nk.store(dv[b, h, cols, :], dv_acc, mask=key_rows_ok)
    return dk, dv


@nk.kernel
def dropout_keep_kernel(seed: torch.Tensor, q: torch.Tensor, k: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """The dropout mask attention draws for these shapes and seed: [batch, heads, queries, keys]."""
    batch, heads, queries = q.shape[0], q.shape[1], q.shape[2]
    keys = k.shape[2]
    keep = nk.ndarray((batch, heads, queries, keys), nk.bool_, buffer=nk.hbm)
    b, h = nk.program_id(0), nk.program_id(1)
    blk = _Block(q, k, seed, b, h, nk.program_id(2), queries, keys)
    for j in nk.affine_range(blocks(keys)):
        cols, col_idx, col_ok, _ = blk.key_block(j)
        nk.store(keep[b, h, blk.rows, cols], _keep(blk.seed, blk.row_idx, col_idx, keys, dropout_p),
                 mask=blk.row_ok & col_ok)
    return keep


def _query_grid(q, *rest):
    return (q.shape[0], q.shape[1], blocks(q.shape[2]))


def _key_grid(q, k, *rest):
    return (q.shape[0], q.shape[1], blocks(k.shape[2]))


def _backward(inputs, outputs, grads):
    q, k, v, seed, q_seg, k_seg, *options = inputs
    out, lse = outputs
    d_out = grads[0].contiguous()
    dq = _dq(q, k, v, seed, q_seg, k_seg, out, d_out, lse, *options)
    dk, dv = _dkdv(q, k, v, seed, q_seg, k_seg, out, d_out, lse, *options)
    batch, heads, keys, dim = dk.shape
    group = heads // k.shape[1]
    dk, dv = (d.reshape(batch, k.shape[1], group, keys, dim).sum(2).to(k.dtype) for d in (dk, dv))
    return (dq, dk, dv) + (None,) * (len(inputs) - 3)


_dq = nk.custom_op("torchneuron_kernels::attention_backward_dq", attention_backward_dq, grid=_query_grid)
_dkdv = nk.custom_op("torchneuron_kernels::attention_backward_dkdv", attention_backward_dkdv, grid=_key_grid)
_attention = nk.custom_op("torchneuron_kernels::attention", attention_forward, grid=_query_grid,
                          backward=_backward)
_dropout_keep = nk.custom_op("torchneuron_kernels::attention_dropout_keep", dropout_keep_kernel,
                             grid=lambda seed, q, k, dropout_p: _query_grid(q))


def _window(window, causal):
    if window is None:
        return -1, -1
    left, right = (window, window) if isinstance(window, int) else window
    if left < 0 or right < 0:
        raise ValueError(f"flash_attention: window sizes are non-negative, got {window}")
    return left, right


def _check(q, k, v):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise RuntimeError(f"flash_attention: q, k, v must be 4-D [batch, heads, seq, dim], got {tuple(q.shape)}, "
                           f"{tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or not q.dtype.is_floating_point:
        raise TypeError(f"flash_attention: q, k, v must share a floating point dtype, got {q.dtype}, {k.dtype}, "
                        f"{v.dtype}")
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise RuntimeError(f"flash_attention: k and v must be [batch, kv_heads, keys, dim] matching q; got "
                           f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise RuntimeError(f"flash_attention: {q.shape[1]} query heads do not group over {k.shape[1]} kv heads")
    if q.shape[3] > P:
        raise NotImplementedError(f"flash_attention: head dim {q.shape[3]} > {P} is not supported yet; report it "
                                  "at the project's issue tracker")


def _seed(q, dropout_p):
    if dropout_p > 0:
        return torch.randint(0, 2 ** 31 - 1, (1,), device=q.device, dtype=torch.int32)
    return torch.zeros(1, device=q.device, dtype=torch.int32)


def flash_attention(q, k, v, *, causal: bool = False, scale: Optional[float] = None, dropout_p: float = 0.0,
                    window=None, cu_seqlens=None):
    """Attention of q [batch, heads, queries, dim] over k, v [batch, kv_heads, keys, dim] (GQA/MQA when
    kv_heads divides heads), as F.scaled_dot_product_attention computes it.

    `causal`: keys after the query are masked (top-left aligned, as SDPA's is_causal). `window=(left,
    right)` (or an int for both): query i attends keys i-left..i+right. `dropout_p`: dropout on the
    attention probabilities, drawn from the device generator (torch.manual_seed reproduces it).
    `cu_seqlens` (int, [sequences + 1]): q, k, v are packed sequences [total, heads, dim] (flash-attn's
    varlen layout) and attention stays within each sequence; the output is [total, heads, dim].
    """
    if cu_seqlens is not None:
        return _varlen(q, k, v, cu_seqlens, causal=causal, scale=scale, dropout_p=dropout_p, window=window)
    return _flash(q, k, v, None, causal, scale, dropout_p, window)


def _flash(q, k, v, segments, causal, scale, dropout_p, window):
    _check(q, k, v)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"flash_attention: dropout_p must be in [0, 1), got {dropout_p}")
    left, right = _window(window, causal)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    out, _ = _attention(q.contiguous(), k.contiguous(), v.contiguous(), _seed(q, dropout_p), segments, segments,
                        scale, causal, left, right, dropout_p > 0, float(dropout_p))
    return out


def _varlen(q, k, v, cu_seqlens, **options):
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise RuntimeError(f"flash_attention: with cu_seqlens, q, k, v are [total, heads, dim], got {tuple(q.shape)}")
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"flash_attention: cu_seqlens must be a 1-D int tensor, got {cu_seqlens.dtype} "
                        f"{tuple(cu_seqlens.shape)}")
    total = q.shape[0]
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(q.device)
    segments = torch.repeat_interleave(torch.arange(lengths.numel(), device=q.device, dtype=torch.int32),
                                       lengths, output_size=total)[None]
    pack = (lambda t: t.transpose(0, 1)[None])
    out = _flash(pack(q), pack(k), pack(v), segments, options["causal"], options["scale"], options["dropout_p"],
                 options["window"])
    return out[0].transpose(0, 1)


def dropout_keep(q, k, seed, dropout_p):
    """The keep-mask [batch, heads, queries, keys] flash_attention draws with this seed (for tests and
    debugging)."""
    return _dropout_keep(seed, q, k, float(dropout_p))


def flash_attention_seed(q, dropout_p):
    """The seed tensor flash_attention draws from the device generator (the same draw as a call would make)."""
    return _seed(q, dropout_p)


def _for_sdpa(q, k, v, **options):
    """flash_attention for the SDPA calls it takes (head dim <= 128, 16/32-bit floats); NotImplemented
    leaves the others to the built-in lowering."""
    if q.shape[-1] > P or q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return NotImplemented
    return flash_attention(q, k, v, **options)


class use_for_sdpa:
    """Route F.scaled_dot_product_attention on neuron tensors (without attn_mask, head dim <= 128, 16/32-bit
    floats, where the built-in fused lowering would run) to flash_attention. Call `use_for_sdpa(True)` /
    `use_for_sdpa(False)`, or use it as a context manager (`with use_for_sdpa():`) that restores the
    previous choice."""

    def __init__(self, enabled: bool = True):
        from ...ops import attention
        self.previous = attention.kernel_override
        attention.kernel_override = _for_sdpa if enabled else None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        from ...ops import attention
        attention.kernel_override = self.previous
