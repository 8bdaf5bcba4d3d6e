"""flex_attention on neuron: its two higher-order ops, eager and compiled.

`torch.nn.attention.flex_attention` calls the `flex_attention` higher-order op (and autograd calls
`flex_attention_backward`). Eager, PyTorch's own dense implementation runs (`sdpa_dense`,
`sdpa_dense_backward`: the score matrix, `score_mod` and the mask applied through vmap, as ATen ops):
a higher-order op reaches a tensor subclass's kernel only through a rule registered for the subclass,
so each is registered here for `NeuronTensor`, and every ATen op inside runs through the lowering
table like any other.

In a compiled graph the two ops are lowered below, into the graph's own program: the same dense
computation written in JAX, with `score_mod` and `mask_mod` (subgraphs of ATen ops) run through the
lowering table under `jax.vmap` over (batch, head, query, key), as `sdpa_dense` maps them. The
backward follows `sdpa_dense_backward`, except that the gradient of `score_mod` is `jax.vjp` of its
lowering rather than the joint graph PyTorch traces for it.
"""
import math

import jax
import jax.numpy as jnp
from torch._higher_order_ops.flex_attention import (
    flex_attention,
    flex_attention_backward,
    sdpa_dense,
    sdpa_dense_backward,
)

from ..runtime.tensor import NeuronTensor
from . import checks
from .registry import lower
from .rules import run_graph

flex_attention.py_impl(NeuronTensor)(sdpa_dense)
flex_attention_backward.py_impl(NeuronTensor)(sdpa_dense_backward)

_LN2 = math.log(2)
_GRID_AXES = (3, 2, 1, 0)  # (b, h, q_idx, kv_idx), kv_idx mapped innermost as PyTorch's _vmap_for_bhqkv


def _over_grid(subgraph, n_mapped: int, n_buffers: int):
    """`subgraph`, a function of (*values, b, h, q_idx, kv_idx, *buffers) on scalars, over the whole
    (B, H, Q, KV) grid: the `n_mapped` values are grids themselves, the indices their aranges, the
    buffers whole. Its checks (a bias table indexed by position) come out of vmap's trace as grids of
    conditions, each reported as one."""
    found = []  # each check's (error type, message), as tracing the subgraph under vmap found them

    def on_scalars(*args):
        with checks.collecting() as conditions:
            out = run_graph(subgraph, list(args))
        found[:] = [(error, message) for _, error, message in conditions]
        return out, tuple(condition for condition, _, _ in conditions)

    mapped = on_scalars
    for axis in _GRID_AXES:
        index_axes = tuple(0 if i == axis else None for i in range(len(_GRID_AXES)))
        mapped = jax.vmap(mapped, in_axes=(0,) * n_mapped + index_axes + (None,) * n_buffers)

    def over_grid(*args):
        out, conditions = mapped(*args)
        checks.report((checks.over_all(grid, len(_GRID_AXES)), error, message)
                      for grid, (error, message) in zip(conditions, found))
        return out
    return over_grid


def _heads_and_batch(query, key, value):
    """Key and value repeated over the query heads they serve (grouped-query attention) and broadcast over the
    query batch."""
    groups = query.shape[1] // key.shape[1]
    return [jnp.broadcast_to(jnp.repeat(t, groups, axis=1), (query.shape[0], query.shape[1]) + t.shape[2:])
            for t in (key, value)]


def _working_dtype(query):
    return jnp.float64 if query.dtype == jnp.float64 else jnp.float32


def _scores(query, key, scale):
    working = _working_dtype(query)
    scores = jnp.matmul(query.astype(working), jnp.swapaxes(key.astype(working), -2, -1))
    return (scores * scale).astype(working)


def _grid(scores) -> list:
    return [jnp.arange(size, dtype=jnp.int64) for size in scores.shape]


def _kept(block_mask, grid, mask_buffers):
    return _over_grid(block_mask[-1], 0, len(mask_buffers))(*grid, *mask_buffers)


@lower(flex_attention)
def flex_attention_lowering(query, key, value, score_mod, block_mask, scale, kernel_options, score_mod_buffers=(),
                            mask_mod_buffers=()):
    key, value = _heads_and_batch(query, key, value)
    scores = _scores(query, key, scale)
    grid = _grid(scores)
    modded = _over_grid(score_mod, 1, len(score_mod_buffers))(scores, *grid, *score_mod_buffers)
    masked = jnp.where(_kept(block_mask, grid, mask_mod_buffers), modded.astype(scores.dtype), -jnp.inf)
    empty_rows = jnp.all(masked == -jnp.inf, axis=-1)
    logsumexp = jnp.where(empty_rows, -jnp.inf, jax.nn.logsumexp(masked, axis=-1))
    max_scores = jnp.max(masked, axis=-1)
    weights = jnp.where(empty_rows[..., None], 0, jax.nn.softmax(masked, axis=-1))  # PyTorch's _safe_softmax
    out = jnp.matmul(weights.astype(query.dtype), value.astype(query.dtype))
    # in log2 units, as the op's kernels return them
    return out, logsumexp / _LN2, max_scores / _LN2


@lower(flex_attention_backward)
def flex_attention_backward_lowering(query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph,
                                     block_mask, scale, kernel_options, score_mod_buffers=(), mask_mod_buffers=()):
    batch_kv, heads_kv = key.shape[:2]
    groups = query.shape[1] // heads_kv
    full_key, full_value = _heads_and_batch(query, key, value)
    grad_out = jnp.zeros_like(out) if grad_out is None else grad_out
    grad_logsumexp = jnp.zeros_like(logsumexp) if grad_logsumexp is None else grad_logsumexp
    logsumexp, grad_logsumexp = logsumexp * _LN2, grad_logsumexp / _LN2
    scores = _scores(query, full_key, scale)
    grid = _grid(scores)
    learnable = [i for i, buffer in enumerate(score_mod_buffers)
                 if hasattr(buffer, "dtype") and jnp.issubdtype(buffer.dtype, jnp.inexact)]

    def score_mod(scores, *learnable_values):
        buffers = list(score_mod_buffers)
        for i, v in zip(learnable, learnable_values):
            buffers[i] = v
        return _over_grid(fw_graph, 1, len(buffers))(scores, *grid, *buffers).astype(scores.dtype)

    with checks.unchecked():  # the forward checked them; their values would not leave vjp's trace
        modded, score_mod_vjp = jax.vjp(score_mod, scores, *[score_mod_buffers[i] for i in learnable])
    kept = _kept(block_mask, grid, mask_mod_buffers)
    masked = jnp.where(kept, modded, -jnp.inf)
    weights = jnp.where((logsumexp == -jnp.inf)[..., None], 0, jnp.exp(masked - logsumexp[..., None]))
    working = weights.dtype
    grad_value = jnp.matmul(jnp.swapaxes(weights.astype(query.dtype), -2, -1), grad_out)
    grad_weights = jnp.matmul(grad_out.astype(working), jnp.swapaxes(full_value.astype(working), -2, -1))
    rows = jnp.sum(out.astype(working) * grad_out.astype(working), axis=-1, keepdims=True)
    grad_modded = weights * (grad_weights - rows + grad_logsumexp[..., None])
    grad_scores, *grad_learnable = score_mod_vjp(grad_modded)
    grad_scores = jnp.where(kept, (grad_scores * scale).astype(query.dtype), 0)
    grad_query = jnp.matmul(grad_scores, full_key.astype(query.dtype))
    grad_key = jnp.matmul(jnp.swapaxes(grad_scores, -2, -1), query)
    # summed over the query heads each key head serves, and over the query batch a broadcast one served
    grad_key, grad_value = [g.reshape(g.shape[0], heads_kv, groups, *g.shape[2:]).sum(axis=2)
                            for g in (grad_key, grad_value)]
    if batch_kv != query.shape[0]:
        grad_key, grad_value = grad_key.sum(axis=0, keepdims=True), grad_value.sum(axis=0, keepdims=True)
    grad_buffers = [None] * len(score_mod_buffers)
    for i, grad in zip(learnable, grad_learnable):
        grad_buffers[i] = grad
    return grad_query, grad_key, grad_value, tuple(grad_buffers)
