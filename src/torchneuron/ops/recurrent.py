"""Recurrent cells: the fused LSTM and GRU cells and their backward.

PyTorch's LSTM and GRU layers call the fused cell ops on every device but the CPU (as on CUDA), and
autograd calls their fused backward. The `workspace` is the fused cell's own record for its backward
(CUDA's layout: the activated gates, and for the GRU the hidden state and the hidden gate's `n` part).
Arithmetic is in float32 for half-precision inputs, as CUDA's kernels compute it.
"""
import jax
import jax.numpy as jnp
import torch

from .promotion import opmath
from .registry import lower

aten = torch.ops.aten


def _gates(input_gates, hidden_gates, input_bias, hidden_bias):
    """The input and hidden gate pre-activations with their biases, widened for arithmetic."""
    gates = [opmath(input_gates), opmath(hidden_gates)]
    if input_bias is not None:
        gates = [gates[0] + opmath(input_bias), gates[1] + opmath(hidden_bias)]
    return gates


def _lstm_cell_meta(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    # PyTorch's meta kernel reads the biases' devices even when there are none (LSTM(bias=False))
    if input_bias is None:
        input_bias = hidden_bias = input_gates.new_empty(input_gates.shape[1:])
    return aten._thnn_fused_lstm_cell.default(input_gates, hidden_gates, cx, input_bias, hidden_bias)


@lower(aten._thnn_fused_lstm_cell, meta=_lstm_cell_meta)
def lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = sum(_gates(input_gates, hidden_gates, input_bias, hidden_bias))
    i, f, g, o = jnp.split(gates, 4, axis=1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * opmath(cx) + i * g
    hy = o * jnp.tanh(cy)
    dtype = input_gates.dtype
    return hy.astype(dtype), cy.astype(dtype), jnp.concatenate([i, f, g, o], axis=1).astype(dtype)


@lower(aten._thnn_fused_lstm_cell_backward_impl)
def lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = jnp.split(opmath(workspace), 4, axis=1)
    cx, cy = opmath(cx), opmath(cy)
    grad_hy = jnp.zeros_like(cy) if grad_hy is None else opmath(grad_hy)
    grad_cy = jnp.zeros_like(cy) if grad_cy is None else opmath(grad_cy)
    tanh_cy = jnp.tanh(cy)
    grad_c = grad_hy * o * (1 - tanh_cy * tanh_cy) + grad_cy
    grad_gates = jnp.concatenate([
        grad_c * g * (1 - i) * i,
        grad_c * cx * (1 - f) * f,
        grad_c * i * (1 - g * g),
        grad_hy * tanh_cy * (1 - o) * o,
    ], axis=1)
    dtype = workspace.dtype
    grad_bias = grad_gates.sum(0).astype(dtype) if has_bias else None
    return grad_gates.astype(dtype), (grad_c * f).astype(dtype), grad_bias


def _gru_cell_meta(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    # PyTorch has no meta kernel for it; the shapes of CUDA's
    workspace = input_gates.new_empty((input_gates.shape[0], hx.shape[1] * 5))
    return torch.empty_like(hx, memory_format=torch.contiguous_format), workspace


@lower(aten._thnn_fused_gru_cell, meta=_gru_cell_meta)
def gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    input_part, hidden_part = _gates(input_gates, hidden_gates, input_bias, hidden_bias)
    input_r, input_i, input_n = jnp.split(input_part, 3, axis=1)
    hidden_r, hidden_i, hidden_n = jnp.split(hidden_part, 3, axis=1)
    r = jax.nn.sigmoid(input_r + hidden_r)
    i = jax.nn.sigmoid(input_i + hidden_i)
    n = jnp.tanh(input_n + r * hidden_n)
    hx = opmath(hx)
    hy = n + i * (hx - n)
    dtype = input_gates.dtype
    return hy.astype(dtype), jnp.concatenate([r, i, n, hidden_n, hx], axis=1).astype(dtype)


def _gru_cell_backward_meta(grad_hy, workspace, has_bias):
    batch, hidden = grad_hy.shape
    gates = [grad_hy.new_empty((batch, 3 * hidden)) for _ in range(2)]
    biases = [grad_hy.new_empty((3 * hidden,)) for _ in range(2)] if has_bias else [None, None]
    return gates[0], gates[1], torch.empty_like(grad_hy, memory_format=torch.contiguous_format), *biases


@lower(aten._thnn_fused_gru_cell_backward, meta=_gru_cell_backward_meta)
def gru_cell_backward(grad_hy, workspace, has_bias):
    r, i, n, hidden_n, hx = jnp.split(opmath(workspace), 5, axis=1)
    grad_hy = opmath(grad_hy)
    grad_i = grad_hy * (hx - n) * (1 - i) * i
    grad_n = grad_hy * (1 - i) * (1 - n * n)
    grad_r = grad_n * hidden_n * (1 - r) * r
    grad_input_gates = jnp.concatenate([grad_r, grad_i, grad_n], axis=1)
    grad_hidden_gates = jnp.concatenate([grad_r, grad_i, grad_n * r], axis=1)
    results = [grad_input_gates, grad_hidden_gates, grad_hy * i]
    results += [grad_input_gates.sum(0), grad_hidden_gates.sum(0)] if has_bias else [None, None]
    return tuple(None if r is None else r.astype(workspace.dtype) for r in results)
