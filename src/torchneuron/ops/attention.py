"""Memory-efficient scaled dot product attention: blockwise online softmax, never the full score matrix.

PyTorch picks an SDPA backend per device in C++ (`_fused_sdp_choice_stub`), which a Python backend
cannot register for PrivateUse1, so neuron's choice is a kernel for `aten::scaled_dot_product_attention`
at AutogradPrivateUse1 (ahead of its CompositeImplicitAutograd math decomposition), in the order CUDA's
default makes it: `_scaled_dot_product_flash_attention` for calls without a mask (the op DTensor's
sharding rules and context parallelism's ring attention know), else the fused op PyTorch keeps for
out-of-tree devices (`_scaled_dot_product_fused_attention_overrideable`, which takes masks), each unless
`torch.nn.attention.sdpa_kernel` disabled it, else the math path, else PyTorch's "No available kernel"
error. Each op's derivative is its `_backward` op. One blockwise lowering serves both: the forward scans
over blocks of keys keeping a running max, denominator and output per query (FlashAttention) and returns
the log-sum-exp (which context parallelism merges chunks by); the backward recomputes each block's
probabilities from it. Dropout masks are drawn per block from the forward's PRNG key, which the
philox_seed output carries to the backward.
"""
import jax
import jax.numpy as jnp
import torch
from jax import lax

from .promotion import type_meta_name
from .registry import lower, meta_kernel

aten = torch.ops.aten

# keys per block: the score block (batch x heads x queries x _BLOCK) is the largest temporary
_BLOCK = 64


def _compute_dtype(x):
    return jnp.float64 if x.dtype == jnp.float64 else jnp.float32


class _Layout:
    """Shapes of one attention call, and its tensors rearranged for grouped heads and key blocks.

    Queries are viewed as (batch, kv_heads, group * queries, dim): GQA's query head h reads kv head
    h // group, as repeat_interleave does in the math path, without copying keys or values. The group
    is folded into the rows rather than kept as an axis of its own: XLA:CPU ran the backward's
    products with a group axis (even of 1) at half the speed.
    """

    def __init__(self, q, k, attn_bias, is_causal, scale):
        self.batch, self.heads, self.queries, dim = q.shape
        self.kv_heads, self.keys = k.shape[1], k.shape[2]
        self.group = self.heads // self.kv_heads
        self.dtype = _compute_dtype(q)
        self.scale = 1 / dim**0.5 if scale is None else scale
        self.block = min(_BLOCK, self.keys)
        self.n_blocks = -(-self.keys // self.block)
        self.is_causal = is_causal
        self.bias = attn_bias

    def grouped(self, x):
        """(batch, kv_heads, group * queries, ...) from (batch, heads, queries, ...)."""
        return x.reshape(x.shape[0], self.kv_heads, self.group * self.queries, *x.shape[3:]).astype(self.dtype)

    def ungrouped(self, x):
        return x.reshape(x.shape[0], self.heads, self.queries, *x.shape[3:])

    def key_blocks(self, x):
        """(n_blocks, ..., block, last) from (..., keys, last), padded with zeros."""
        x = _pad_keys(x.astype(self.dtype), x.ndim - 2, self.n_blocks * self.block)
        x = x.reshape(*x.shape[:-2], self.n_blocks, self.block, x.shape[-1])
        return jnp.moveaxis(x, -3, 0)

    def bias_blocks(self):
        """The mask as (n_blocks, batch, kv_heads | 1, group | 1, queries | 1, block), or None: kept in its
        broadcast shape, and added to the scores in it (`scores`)."""
        if self.bias is None:
            return None
        bias = self.bias.reshape((1,) * (4 - self.bias.ndim) + self.bias.shape)
        b, h, rows, _ = bias.shape
        bias = bias.reshape(b, self.kv_heads if h > 1 else 1, self.group if h > 1 else 1, rows, bias.shape[-1])
        bias = jnp.broadcast_to(bias, bias.shape[:-1] + (self.keys,))
        bias = _pad_keys(bias, bias.ndim - 1, self.n_blocks * self.block)
        return jnp.moveaxis(bias.reshape(*bias.shape[:-1], self.n_blocks, self.block), -2, 0)

    def scores(self, q, k_block, bias_block, index):
        """Scaled scores of one key block, -inf where masked, causal-masked or padding."""
        s = jnp.einsum("bhqe,bhke->bhqk", q, k_block) * self.scale
        if bias_block is not None:
            # the rows as (group, queries) for the mask's broadcast shape: a reshape, not a copy
            s = s.reshape(*s.shape[:2], self.group, self.queries, self.block)
            s = jnp.where(bias_block, s, -jnp.inf) if bias_block.dtype == jnp.bool_ else s + bias_block
            s = s.reshape(*s.shape[:2], self.group * self.queries, self.block)
        columns = index * self.block + jnp.arange(self.block)
        valid = columns < self.keys
        if self.is_causal:
            rows = jnp.arange(self.group * self.queries) % self.queries  # each row's query position
            valid = valid & (columns <= rows[:, None])
        return jnp.where(valid, s, -jnp.inf)


def _pad_keys(x, axis, length):
    pad = length - x.shape[axis]
    if not pad:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def _dropout_scale(words, index, shape, p, dtype):
    """The dropout multiplier of one block (0 or 1/(1-p)), the same in forward and backward; `words` is
    the forward's threefry key data (2 x uint32), which each op's philox_seed output carries."""
    key = jax.random.wrap_key_data(words, impl="threefry2x32")
    keep = jax.random.bernoulli(jax.random.fold_in(key, index), 1 - p, shape)
    return jnp.where(keep, 1 / (1 - p), 0).astype(dtype)


def _scan_inputs(layout, k, v):
    return layout.key_blocks(k), layout.key_blocks(v), layout.bias_blocks(), jnp.arange(layout.n_blocks)


def _attend(key, q, k, v, attn_bias, dropout_p, is_causal, scale):
    """The blockwise forward: (layout, output, logsumexp, the key words its dropout drew from)."""
    layout = _Layout(q, k, attn_bias, is_causal, scale)
    words = jax.random.key_data(key) if dropout_p > 0 else jnp.zeros((2,), jnp.uint32)
    query = layout.grouped(q)
    shape = query.shape[:-1]

    def step(carry, block):
        top, total, acc = carry
        k_block, v_block, bias_block, index = block
        s = layout.scores(query, k_block, bias_block, index)
        new_top = jnp.maximum(top, s.max(-1))
        finite_top = jnp.where(new_top == -jnp.inf, 0, new_top)  # all masked so far: exp(-inf - 0) = 0
        p = jnp.exp(s - finite_top[..., None])
        rescale = jnp.exp(top - finite_top)
        if dropout_p > 0:
            p_kept = p * _dropout_scale(words, index, p.shape, dropout_p, p.dtype)
        else:
            p_kept = p
        acc = acc * rescale[..., None] + jnp.einsum("bhqk,bhkd->bhqd", p_kept, v_block)
        return (new_top, total * rescale + p.sum(-1), acc), None

    start = (jnp.full(shape, -jnp.inf, layout.dtype), jnp.zeros(shape, layout.dtype),
             jnp.zeros(shape + (v.shape[-1],), layout.dtype))
    (top, total, acc), _ = lax.scan(step, start, _scan_inputs(layout, k, v))
    # rows with every key masked give zeros, as the math path's _safe_softmax does
    out = jnp.where(total[..., None] > 0, acc / jnp.where(total > 0, total, 1)[..., None], 0)
    logsumexp = jnp.where(total > 0, top + jnp.log(jnp.where(total > 0, total, 1)), jnp.inf)
    return layout, layout.ungrouped(out).astype(q.dtype), layout.ungrouped(logsumexp), words


def _attend_backward(grad, q, k, v, attn_bias, want_bias, out, logsumexp, dropout_p, is_causal, words, scale):
    """The blockwise backward: (layout, dq, dk, dv, the score gradient's blocks when `want_bias`)."""
    layout = _Layout(q, k, attn_bias, is_causal, scale)
    query, d_out = layout.grouped(q), layout.grouped(grad)
    lse = layout.grouped(logsumexp)
    # rowsum(P * dP) of the softmax gradient, which equals rowsum(dO * O), with dropout too
    delta = jnp.sum(d_out * layout.grouped(out), -1)

    def step(d_query, block):
        k_block, v_block, bias_block, index = block
        p = jnp.exp(layout.scores(query, k_block, bias_block, index) - lse[..., None])
        d_p = jnp.einsum("bhqd,bhkd->bhqk", d_out, v_block)
        if dropout_p > 0:
            kept = _dropout_scale(words, index, p.shape, dropout_p, p.dtype)
            p_kept, d_p = p * kept, d_p * kept
        else:
            p_kept = p
        d_v = jnp.einsum("bhqk,bhqd->bhkd", p_kept, d_out)
        d_s = p * (d_p - delta[..., None])
        d_query = d_query + jnp.einsum("bhqk,bhke->bhqe", d_s, k_block) * layout.scale
        d_k = jnp.einsum("bhqk,bhqe->bhke", d_s, query) * layout.scale
        return d_query, (d_k, d_v, d_s if want_bias else None)

    d_query, (d_k, d_v, d_s) = lax.scan(step, jnp.zeros_like(query), _scan_inputs(layout, k, v))
    return (layout, layout.ungrouped(d_query).astype(q.dtype), _from_key_blocks(layout, d_k, k),
            _from_key_blocks(layout, d_v, v), d_s)


# The two fused ops differ only in their signatures and in how philox_seed holds the key words: the
# overrideable op's is one int64 (as its meta kernel says), flash attention's two uint64 (its CUDA layout).

@lower(aten._scaled_dot_product_fused_attention_overrideable, random=True, static_scalars=True)
def fused_attention(key, q, k, v, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
                    scale=None):
    layout, out, logsumexp, words = _attend(key, q, k, v, attn_bias, dropout_p, is_causal, scale)
    seed = lax.bitcast_convert_type(words, jnp.int64)
    return out, logsumexp, None, None, layout.queries, layout.keys, seed, jnp.zeros((), jnp.int64), None


@meta_kernel(aten._scaled_dot_product_fused_attention_overrideable_backward.default)  # before torch 2.13
def _gradients_shaped_as_inputs(grad_out, query, key, value, attn_bias, *args, **kwargs):
    return (torch.empty_like(query), torch.empty_like(key), torch.empty_like(value),
            None if attn_bias is None else torch.empty_like(attn_bias))


@lower(aten._scaled_dot_product_fused_attention_overrideable_backward, static_scalars=True)
def fused_attention_backward(grad, q, k, v, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k,
                             max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    want_bias = attn_bias is not None and grad_input_mask[3]
    words = lax.bitcast_convert_type(philox_seed, jnp.uint32)
    layout, d_q, d_k, d_v, d_s = _attend_backward(grad, q, k, v, attn_bias, want_bias, out, logsumexp, dropout_p,
                                                  is_causal, words, scale)
    if attn_bias is None:
        d_bias = None
    elif want_bias:
        d_bias = _bias_gradient(layout, d_s, attn_bias)
    else:
        d_bias = jnp.zeros(attn_bias.shape, attn_bias.dtype)  # PyTorch's meta kernel returns one regardless
    return d_q, d_k, d_v, d_bias


@lower(aten._scaled_dot_product_flash_attention, random=True, static_scalars=True)
def flash_attention(key, q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    if return_debug_mask:
        raise NotImplementedError("aten::_scaled_dot_product_flash_attention with return_debug_mask=True")
    layout, out, logsumexp, words = _attend(key, q, k, v, None, dropout_p, is_causal, scale)
    return (out, logsumexp, None, None, layout.queries, layout.keys, words.astype(jnp.uint64),
            jnp.zeros((), jnp.uint64), jnp.zeros((0,), q.dtype))


@lower(aten._scaled_dot_product_flash_attention_backward, static_scalars=True)
def flash_attention_backward(grad, q, k, v, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                             is_causal, philox_seed, philox_offset, *, scale=None):
    _, d_q, d_k, d_v, _ = _attend_backward(grad, q, k, v, None, False, out, logsumexp, dropout_p, is_causal,
                                           philox_seed.astype(jnp.uint32), scale)
    return d_q, d_k, d_v


# Flash attention's own op (`_flash_attention_forward`), which nested (jagged) tensors' attention calls: its
# inputs are (batch, sequence, heads, dim), or with cumulative sequence lengths every sequence packed into
# (total, heads, dim), attended as one batch row that a mask keeps within each sequence (causal from each
# sequence's start, as dense attention of each sequence on its own is).

def _sequence_positions(cum_seq, total):
    """Each packed position's sequence and its place in that sequence."""
    positions = jnp.arange(total)
    sequence = jnp.searchsorted(cum_seq, positions, side="right") - 1
    return sequence, positions - cum_seq[sequence]


def _packed_mask(cum_seq_q, cum_seq_k, total_q, total_k, is_causal):
    sequence_q, position_q = _sequence_positions(cum_seq_q, total_q)
    sequence_k, position_k = _sequence_positions(cum_seq_k, total_k)
    mask = sequence_q[:, None] == sequence_k[None, :]
    return mask & (position_k[None, :] <= position_q[:, None]) if is_causal else mask


def _heads_first(x, cum_seq):
    """(batch, heads, sequence, dim) from flash attention's layout."""
    return jnp.swapaxes(x if cum_seq is None else x[None], 1, 2)


def _flash_layout(x, cum_seq):
    x = jnp.swapaxes(x, 1, 2)
    return x if cum_seq is None else x[0]


def _flash_mask(q, k, cum_seq_q, cum_seq_k, is_causal, window_size_left, window_size_right):
    """The mask of packed sequences (None for a batch), and whether the causal mask is left to _Layout."""
    if window_size_left not in (None, -1) or window_size_right not in (None, -1):
        raise NotImplementedError("aten::_flash_attention_forward with a sliding window on neuron; please report "
                                  "it at the TorchNeuron issue tracker with the model that needs it")
    if cum_seq_q is None:
        return None, is_causal
    return _packed_mask(cum_seq_q, cum_seq_k, q.shape[0], k.shape[0], is_causal), False


@lower(aten._flash_attention_forward, random=True, static_scalars=True)
def flash_attention_packed(key, q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                           return_debug_mask, *, scale=None, window_size_left=None, window_size_right=None,
                           seqused_k=None, alibi_slopes=None, block_table=None, num_splits=None):
    if return_debug_mask or seqused_k is not None or alibi_slopes is not None or block_table is not None:
        raise NotImplementedError("aten::_flash_attention_forward with a debug mask, seqused_k, ALiBi slopes or a "
                                  "block table on neuron; please report it at the TorchNeuron issue tracker")
    mask, causal = _flash_mask(q, k, cum_seq_q, cum_seq_k, is_causal, window_size_left, window_size_right)
    _, out, logsumexp, words = _attend(key, _heads_first(q, cum_seq_q), _heads_first(k, cum_seq_k),
                                       _heads_first(v, cum_seq_k), mask, dropout_p, causal, scale)
    return (_flash_layout(out, cum_seq_q), logsumexp if cum_seq_q is None else logsumexp[0],
            words.astype(jnp.uint64), jnp.zeros((), jnp.uint64), jnp.zeros((0,), q.dtype))


@lower(aten._flash_attention_backward, static_scalars=True)
def flash_attention_packed_backward(grad, q, k, v, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                                    is_causal, rng_state, unused, *, scale=None, window_size_left=None,
                                    window_size_right=None):
    mask, causal = _flash_mask(q, k, cum_seq_q, cum_seq_k, is_causal, window_size_left, window_size_right)
    _, d_q, d_k, d_v, _ = _attend_backward(
        _heads_first(grad, cum_seq_q), _heads_first(q, cum_seq_q), _heads_first(k, cum_seq_k),
        _heads_first(v, cum_seq_k), mask, False, _heads_first(out, cum_seq_q),
        logsumexp if cum_seq_q is None else logsumexp[None], dropout_p, causal, rng_state.astype(jnp.uint32), scale)
    return _flash_layout(d_q, cum_seq_q), _flash_layout(d_k, cum_seq_k), _flash_layout(d_v, cum_seq_k)


def _from_key_blocks(layout, blocks, like):
    x = jnp.moveaxis(blocks, 0, -3)
    return x.reshape(*x.shape[:-3], -1, x.shape[-1])[..., : layout.keys, :].astype(like.dtype)


def _bias_gradient(layout, d_s, bias):
    """d_s blocks (n_blocks, batch, kv_heads, group * queries, block) summed to the bias's broadcast shape."""
    full = jnp.moveaxis(d_s, 0, -2)
    full = full.reshape(*full.shape[:-2], -1)[..., : layout.keys]
    full = full.reshape(full.shape[0], layout.heads, layout.queries, layout.keys)
    padded = (1,) * (4 - bias.ndim) + bias.shape
    axes = tuple(i for i, n in enumerate(padded) if n == 1 and full.shape[i] != 1)
    return full.sum(axes, keepdims=True).reshape(bias.shape).astype(bias.dtype)


# torchneuron.kernels.lib.use_for_sdpa installs the kernel library's flash attention here (opt-in): it is
# offered the calls without a mask that the fused lowering would take, and returns NotImplemented to decline
kernel_override = None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                                 enable_gqa=False):
    """aten::scaled_dot_product_attention for neuron tensors: the backend choice PyTorch makes in C++."""
    _check_inputs(query, key, value, attn_mask)
    fused = _fused_fits(query, key, value, attn_mask, enable_gqa)
    # flash attention's op takes no mask, and its meta kernel gives the output the query's head dim
    flash = fused and attn_mask is None and value.shape[-1] == query.shape[-1] and torch._C._get_flash_sdp_enabled()
    overrideable = fused and torch._C._get_overrideable_sdp_enabled()
    if kernel_override is not None and attn_mask is None and (flash or overrideable):
        out = kernel_override(query, key, value, causal=is_causal, scale=scale, dropout_p=dropout_p)
        if out is not NotImplemented:
            return out
    if flash:
        return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, scale=scale)[0]
    if overrideable:
        return aten._scaled_dot_product_fused_attention_overrideable(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale)[0]
    if torch._C._get_math_sdp_enabled():
        return aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]
    raise RuntimeError("No available kernel. Aborting execution.")


def _check_inputs(query, key, value, attn_mask):
    """validate_sdpa_input's checks, which the math kernel's own ops would report differently."""
    torch._check(
        query.dtype == key.dtype == value.dtype,
        lambda: f"Expected query, key, and value to have the same dtype, but got query.dtype: "
        f"{type_meta_name(query.dtype)} key.dtype: {type_meta_name(key.dtype)} and value.dtype: "
        f"{type_meta_name(value.dtype)} instead.")
    torch._check(
        attn_mask is None or attn_mask.dtype in (torch.bool, query.dtype),
        lambda: f"Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: "
        f"{type_meta_name(attn_mask.dtype)} and  query.dtype: {type_meta_name(query.dtype)} instead.")


def _fused_fits(query, key, value, attn_mask, enable_gqa) -> bool:
    """Shapes the fused lowering takes; the math path handles (and reports) the rest."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or not query.dtype.is_floating_point:
        return False
    batch, heads = query.shape[0], query.shape[1]
    kv_heads = key.shape[1]
    if attn_mask is not None:
        scores = (batch, heads, query.shape[2], key.shape[2])
        if attn_mask.dim() > 4 or any(n not in (1, m) for n, m in zip(reversed(attn_mask.shape), reversed(scores))):
            return False
    grouped = kv_heads == heads or enable_gqa and kv_heads and heads % kv_heads == 0
    return (grouped and key.shape[0] == value.shape[0] == batch and value.shape[1] == kv_heads
            and key.shape[2] == value.shape[2] and key.shape[3] == query.shape[3])


_library = torch.library.Library("aten", "IMPL")
_library.impl("scaled_dot_product_attention", scaled_dot_product_attention, "AutogradPrivateUse1")
