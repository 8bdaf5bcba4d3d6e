"""Paged-attention decode: one new query per sequence over a KV cache kept in fixed-size blocks, found
through a block table (vLLM's layout). One program per (sequence, kv head) serves the query heads of its
GQA group, walking the sequence's blocks with an online softmax."""
import torch

import torchneuron.kernels as nk

NEG = -1e30


@nk.kernel
def paged_decode_kernel(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                        seq_lens: torch.Tensor, block_size: int, scale: float) -> torch.Tensor:
    """q [batch, heads, dim]; caches [blocks * block_size, kv_heads, dim]; block_table [batch, max_blocks]."""
    batch, heads, dim = q.shape
    group = heads // k_cache.shape[1]
    out = nk.ndarray(q.shape, q.dtype, buffer=nk.hbm)
    b, h = nk.program_id(0), nk.program_id(1)
    qt = nk.load(q[b, nk.ds(h * group, group), :])
    length = nk.load(seq_lens[nk.ds(b, 1), None])
    offsets = nk.iota((block_size, 1), 0)

    def step(j, m, l, o):
        present = offsets + j * block_size < length
        rows = nk.load(block_table[nk.ds(b, 1), nk.ds(j, 1)]) * block_size + offsets
        kt = nk.load(k_cache[rows, h, :], mask=present)
        vt = nk.load(v_cache[rows, h, :], mask=present)
        allowed = nk.transpose(present)
        s = nk.where(allowed, nk.matmul(qt, nk.transpose(kt)) * scale, NEG)
        m_new = nk.maximum(m, nk.max(s))
        p = nk.where(allowed, nk.exp(s - m_new), 0.0)
        alpha = nk.exp(m - m_new)
        return m_new, l * alpha + nk.sum(p), o * alpha + nk.matmul(p, vt)

    m, l, o = nk.fori(block_table.shape[1], step, (nk.full((group, 1), NEG, nk.float32),
                                                   nk.zeros((group, 1), nk.float32), nk.zeros((group, dim), nk.float32)))
    nk.store(out[b, nk.ds(h * group, group), :], o / nk.where(l == 0.0, 1.0, l))
    return out


_paged_decode = nk.custom_op("torchneuron_kernels::paged_attention_decode", paged_decode_kernel,
                             grid=lambda q, k_cache, *rest: (q.shape[0], k_cache.shape[1]))


def paged_attention_decode(q, k_cache, v_cache, block_table, seq_lens, *, scale=None):
    """Attention of q [batch, heads, dim] (one decode step) over each sequence's first seq_lens[b] cached
    keys and values; caches are [num_blocks, block_size, kv_heads, dim] and block_table[b, j] is the cache
    block holding positions j*block_size.. of sequence b. Returns [batch, heads, dim]."""
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise RuntimeError(f"paged_attention_decode: expected q [batch, heads, dim] and caches [blocks, block_size, "
                           f"kv_heads, dim]; got {tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    blocks, block_size, kv_heads, dim = k_cache.shape
    if q.shape[2] != dim or q.shape[1] % kv_heads or block_size > 128 or q.shape[1] // kv_heads > 128:
        raise RuntimeError(f"paged_attention_decode: q {tuple(q.shape)} does not fit caches {tuple(k_cache.shape)} "
                           "(heads a multiple of kv_heads, block_size <= 128)")
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise TypeError("paged_attention_decode: block_table and seq_lens must be int32")
    scale = dim ** -0.5 if scale is None else float(scale)
    flat = (lambda c: c.reshape(blocks * block_size, kv_heads, dim).contiguous())
    return _paged_decode(q.contiguous(), flat(k_cache), flat(v_cache), block_table.contiguous(),
                         seq_lens.contiguous(), block_size, scale)
