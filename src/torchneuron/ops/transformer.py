"""The inference fast paths of nn.MultiheadAttention and nn.TransformerEncoderLayer.

Without gradients, in eval mode, these modules call one fused op each (`_native_multi_head_attention`,
`_transformer_encoder_layer_fwd`) on CPU, CUDA and PrivateUse1 devices alike: torchvision's ViT, and any
nn.Transformer encoder at inference. Their kernels compute in the input's precision with float32
accumulation; so do these (half-precision inputs widened). A mask of another dtype than bool excludes
where it is nonzero (the kernels convert it so); a query whose every key is excluded gets nan, as on the
CPU.
"""
import math

import jax
import jax.numpy as jnp
import torch

from .nn import native_layer_norm
from .promotion import opmath
from .registry import lower, meta_kernel

aten = torch.ops.aten


def _excluded(mask, mask_type, batch, heads, queries, keys):
    """The mask as (batch, heads, queries, keys) booleans, True where a key is excluded: mask_type 1 is a key
    padding mask (batch, keys); others broadcast, a 3-d one being (batch * heads, queries, keys)."""
    excluded = mask if mask.dtype == jnp.bool_ else mask != 0
    if mask_type == 1:
        excluded = excluded.reshape(batch, 1, 1, keys)
    elif excluded.ndim == 3:
        excluded = excluded.reshape(batch, heads, queries, keys)
    return jnp.broadcast_to(excluded, (batch, heads, queries, keys))


def _attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask,
               mask_type):
    """(output, weights per head), in float32 for half-precision inputs."""
    batch, queries, keys = query.shape[0], query.shape[1], key.shape[1]
    head_dim = embed_dim // num_head
    weights = jnp.split(opmath(qkv_weight), 3)
    biases = jnp.split(opmath(qkv_bias), 3)

    def heads(x, w, b):
        return (opmath(x) @ w.T + b).reshape(batch, x.shape[1], num_head, head_dim).transpose(0, 2, 1, 3)

    q = heads(query, weights[0], biases[0]) / math.sqrt(head_dim)
    k, v = heads(key, weights[1], biases[1]), heads(value, weights[2], biases[2])
    scores = q @ k.swapaxes(-1, -2)
    if mask is not None:
        scores = jnp.where(_excluded(mask, mask_type, batch, num_head, queries, keys), -jnp.inf, scores)
    probabilities = jax.nn.softmax(scores, axis=-1)
    context = (probabilities @ v).transpose(0, 2, 1, 3).reshape(batch, queries, embed_dim)
    return context @ opmath(proj_weight).T + opmath(proj_bias), probabilities


@lower(aten._native_multi_head_attention)
def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                proj_bias, mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
    out, probabilities = _attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                    proj_bias, mask, mask_type)
    if not need_weights:
        return out.astype(query.dtype), jnp.zeros((0,), query.dtype)
    per_query = probabilities.mean(1) if average_attn_weights else probabilities
    return out.astype(query.dtype), per_query.astype(query.dtype)


def _layer_norm(x, weight, bias, eps):
    return native_layer_norm(x, (x.shape[-1],), weight, bias, eps)[0]


@meta_kernel(aten._transformer_encoder_layer_fwd.default)  # before torch 2.13
def _shaped_as_source(src, *args, **kwargs):
    return torch.empty_like(src)


@lower(aten._transformer_encoder_layer_fwd)
def transformer_encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
                              norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1,
                              ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    activation = (lambda h: jax.nn.gelu(h, approximate=False)) if use_gelu else jax.nn.relu

    def attend(x):
        return _attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask,
                          mask_type)[0]

    def feed_forward(x):
        hidden = activation(x @ opmath(ffn_weight_1).T + opmath(ffn_bias_1))
        return hidden @ opmath(ffn_weight_2).T + opmath(ffn_bias_2)

    x = opmath(src)
    if norm_first:
        x = x + attend(_layer_norm(x, norm_weight_1, norm_bias_1, eps))
        x = x + feed_forward(_layer_norm(x, norm_weight_2, norm_bias_2, eps))
    else:
        x = _layer_norm(x + attend(x), norm_weight_1, norm_bias_1, eps)
        x = _layer_norm(x + feed_forward(x), norm_weight_2, norm_bias_2, eps)
    return x.astype(src.dtype)
