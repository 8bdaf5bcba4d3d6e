"""Neural-network ops: softmax, losses, normalisation, embedding, convolution, dropout."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from torch._prims_common import canonicalize_dim

from ..runtime.dtypes import not_implemented_for, to_torch
from ..runtime.layout import conv_memory_format
from . import checks
from .rules import decomposed, lowering_for, vjp
from .pooling import per_dim, window_slice
from .promotion import accumulation_type, cast, elementwise, opmath
from .registry import META, checked_meta, lower, meta_kernel, meta_like_input

aten = torch.ops.aten


def _dim(x, dim):
    return dim % max(x.ndim, 1)


def _check_dim(x, dim, *args, **kwargs):
    """The CPU kernel's IndexError for a dimension out of range, which the meta kernel wraps round."""
    canonicalize_dim(x.ndim, dim)


@lower(aten._softmax, meta=checked_meta(_check_dim, aten._softmax.default))
def softmax(x, dim, half_to_float=False):
    out = jax.nn.softmax(opmath(x), axis=_dim(x, dim)) if x.ndim else jnp.ones_like(opmath(x))
    return out if half_to_float else out.astype(x.dtype)


@lower(aten._log_softmax, meta=checked_meta(_check_dim, aten._log_softmax.default))
def log_softmax(x, dim, half_to_float=False):
    out = jax.nn.log_softmax(opmath(x), axis=_dim(x, dim)) if x.ndim else jnp.zeros_like(opmath(x))
    return out if half_to_float else out.astype(x.dtype)


def _axis(x, dim):
    """The reduction axis, or None (the whole 0-d value) for a 0-d tensor."""
    return _dim(x, dim) if x.ndim else None


@lower(aten._softmax_backward_data)
def softmax_backward(grad, y, dim, input_dtype):
    g, v = opmath(grad), opmath(y)
    return (v * (g - jnp.sum(g * v, axis=_axis(y, dim), keepdims=True))).astype(grad.dtype)


@lower(aten._log_softmax_backward_data)
def log_softmax_backward(grad, y, dim, input_dtype):
    g, v = opmath(grad), opmath(y)
    return (g - jnp.exp(v) * jnp.sum(g, axis=_axis(y, dim), keepdims=True)).astype(grad.dtype)


def _nll_pick(x, target, weight, ignore_index):
    """Per-element -w[t] * x[t] and w[t] (zero where target == ignore_index); class dim is 1 (or 0 for 1-d x)."""
    class_axis = 1 if x.ndim > 1 else 0
    safe = jnp.where(target == ignore_index, 0, target)
    picked = jnp.take_along_axis(x, jnp.expand_dims(safe, class_axis), axis=class_axis).squeeze(class_axis)
    w = jnp.ones_like(picked) if weight is None else weight.astype(x.dtype)[safe]
    w = jnp.where(target == ignore_index, 0, w)
    return -picked * w, w


@lower(aten.nll_loss_forward, aten.nll_loss2d_forward)
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    classes = x.shape[1 if x.ndim > 1 else 0]
    checks.require((target == ignore_index) | ((target >= 0) & (target < classes)), IndexError,
                   "Target {} is out of bounds.", culprit=target)
    losses, w = _nll_pick(x, target, weight, ignore_index)
    if reduction == 0:
        return losses, jnp.zeros((), x.dtype)
    total = jnp.sum(w)
    if reduction == 1:
        return jnp.sum(losses) / total, total
    return jnp.sum(losses), total


@lower(aten.nll_loss_backward, aten.nll_loss2d_backward)
def nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    class_axis = 1 if x.ndim > 1 else 0
    _, w = _nll_pick(x, target, weight, ignore_index)
    scale = w * (grad if reduction == 0 else (grad / total_weight if reduction == 1 else grad))
    safe = jnp.where(target == ignore_index, 0, target)
    onehot = jax.nn.one_hot(safe, x.shape[class_axis], dtype=x.dtype, axis=class_axis)
    return -onehot * jnp.expand_dims(scale, class_axis)


@lower(aten.one_hot)
def one_hot(x, num_classes=-1):
    checks.require(x >= 0, RuntimeError, "Class values must be non-negative.")
    checks.require(x < num_classes, RuntimeError, "Class values must be smaller than num_classes.")
    return (x[..., None] == jnp.arange(num_classes, dtype=x.dtype)).astype(jnp.int64)


def _normalize(v, axes, eps):
    mean = jnp.mean(v, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(v - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    return (v - mean) * rstd, mean, rstd


def _affine(out, weight, bias, shape):
    if weight is not None:
        out = out * opmath(weight).reshape(shape)
    if bias is not None:
        out = out + opmath(bias).reshape(shape)
    return out


@lower(aten.native_layer_norm)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    out, mean, rstd = _normalize(opmath(x), axes, eps)
    return _affine(out, weight, bias, tuple(normalized_shape)).astype(x.dtype), mean, rstd


@lower(aten.native_layer_norm_backward)
def native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    lead = tuple(range(x.ndim - len(normalized_shape)))
    g, v = opmath(grad), opmath(x)
    xhat = (v - mean) * rstd
    wg = g * opmath(weight) if weight is not None else g
    dx = rstd * (wg - jnp.mean(wg, axis=axes, keepdims=True) - xhat * jnp.mean(wg * xhat, axis=axes, keepdims=True))
    dw = jnp.sum(g * xhat, axis=lead) if weight is not None and output_mask[1] else None
    db = jnp.sum(g, axis=lead) if bias is not None and output_mask[2] else None
    return dx if output_mask[0] else None, dw, db


def _channel_shape(x):
    return (1, -1) + (1,) * (x.ndim - 2)


def _all_but_channels(x):
    """The axes batch norm reduces: all but the channels' (1)."""
    return (0,) + tuple(range(2, x.ndim))


def _eval_statistics_meta(op, training_position):
    """The CPU kernels save empty statistics in eval mode; the meta kernels per-channel ones (as CUDA does)."""
    def meta(x, *args, **kwargs):
        out, mean, invstd = op(x, *args, **kwargs)
        training = training_position is not None and kwargs.get("training", args[training_position - 1])
        return (out, mean, invstd) if training else (out, x.new_empty((0,)), x.new_empty((0,)))
    return meta


# a mutating op runs through its functional variant's lowering: only its output metadata is set here
META[aten._native_batch_norm_legit.default] = _eval_statistics_meta(aten._native_batch_norm_legit.default, 5)


@lower(aten._native_batch_norm_legit_functional)
def batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    v = opmath(x)
    axes = _all_but_channels(x)
    shape = _channel_shape(x)
    if training:
        out, mean, rstd = _normalize(v, axes, eps)
        n = v.size // v.shape[1]
        batch_var = jnp.var(v, axis=axes) * (n / max(n - 1, 1))
        new_mean = (1 - momentum) * running_mean + momentum * mean.reshape(-1)
        new_var = (1 - momentum) * running_var + momentum * batch_var
        out = _affine(out, weight, bias, shape)
        return out.astype(x.dtype), mean.reshape(-1), rstd.reshape(-1), new_mean, new_var
    rstd = lax.rsqrt(opmath(running_var) + eps)
    out = (v - opmath(running_mean).reshape(shape)) * rstd.reshape(shape)
    out = _affine(out, weight, bias, shape)
    # eval mode saves nothing: empty statistics, as the CPU kernels' (`_eval_statistics_meta`)
    unused = jnp.zeros((0,), x.dtype)
    return out.astype(x.dtype), unused, unused, running_mean, running_var


@lower(aten._native_batch_norm_legit_no_training,
       meta=_eval_statistics_meta(aten._native_batch_norm_legit_no_training.default, None))
def batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return batch_norm_functional(x, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@lower(aten._native_batch_norm_legit.no_stats)
def batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    v = opmath(x)
    axes = _all_but_channels(x)
    out, mean, rstd = _normalize(v, axes, eps)
    return _affine(out, weight, bias, _channel_shape(x)).astype(x.dtype), mean.reshape(-1), rstd.reshape(-1)


@lower(aten.native_batch_norm_backward)
def native_batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                               output_mask):
    g, v = opmath(grad), opmath(x)
    axes = _all_but_channels(x)
    shape = _channel_shape(x)
    if train:
        mean, rstd = save_mean.reshape(shape), save_invstd.reshape(shape)
    else:
        mean, rstd = opmath(running_mean).reshape(shape), lax.rsqrt(opmath(running_var) + eps).reshape(shape)
    xhat = (v - mean) * rstd
    w = opmath(weight).reshape(shape) if weight is not None else 1.0
    if train:
        dx = w * rstd * (g - jnp.mean(g, axis=axes, keepdims=True) - xhat * jnp.mean(g * xhat, axis=axes, keepdims=True))
    else:
        dx = g * w * rstd
    dw = jnp.sum(g * xhat, axis=axes) if output_mask[1] else None
    db = jnp.sum(g, axis=axes) if output_mask[2] else None
    return dx if output_mask[0] else None, dw, db


# SyncBatchNorm's steps within each process (torch.nn.modules._functions.SyncBatchNorm), kernels PyTorch has
# for CUDA alone: computed as CUDA computes them, statistics in the accumulation dtype (float32 for half
# precision) and the data's layout kept

def _accumulation_dtype(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@meta_kernel(aten.batch_norm_stats.default)
def _batch_norm_stats_meta(x, eps):
    return tuple(x.new_empty((x.shape[1],), dtype=_accumulation_dtype(x.dtype)) for _ in range(2))


@lower(aten.batch_norm_stats)
def batch_norm_stats(x, eps):
    _, mean, rstd = _normalize(opmath(x), _all_but_channels(x), eps)
    return mean.reshape(-1), rstd.reshape(-1)


@meta_kernel(aten.batch_norm_gather_stats_with_counts.default)
def _gathered_stats_meta(x, mean, invstd, *args):
    return mean.new_empty(mean.shape[1:]), mean.new_empty(mean.shape[1:])


@lower(aten.batch_norm_gather_stats_with_counts)
def batch_norm_gather_stats_with_counts(x, mean, invstd, running_mean, running_var, momentum, eps, counts):
    """The statistics of all processes' data from each process's mean, invstd and count (one row each)."""
    counts = counts.astype(mean.dtype)[:, None]
    total = jnp.sum(counts)
    global_mean = jnp.sum(counts * mean, axis=0) / total
    spread = jnp.sum(counts * (1 / jnp.square(invstd) - eps + jnp.square(mean - global_mean)), axis=0)
    return global_mean, lax.rsqrt(spread / total + eps)


def _gather_stats_updating_running_statistics(x, mean, invstd, running_mean, running_var, momentum, eps, counts):
    """CUDA's kernel also updates the running statistics, which the op's schema does not say it writes: they
    are updated here, above the op, which stays functional."""
    with torch._C._AutoDispatchBelowAutograd():
        global_mean, global_invstd = aten.batch_norm_gather_stats_with_counts.default(
            x, mean, invstd, None, None, momentum, eps, counts)
        total = counts.sum()
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(global_mean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = (global_invstd.double().pow(-2) - eps) * (total / (total - 1))
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
    return global_mean, global_invstd


_library = torch.library.Library("aten", "IMPL")
_library.impl("batch_norm_gather_stats_with_counts", _gather_stats_updating_running_statistics, "AutogradPrivateUse1")


@meta_kernel(aten.batch_norm_elemt.default)
def _like_data(x, *args, **kwargs):
    return torch.empty_like(x, memory_format=torch._prims_common.suggest_memory_format(x))


@lower(aten.batch_norm_elemt)
def batch_norm_elemt(x, weight, bias, mean, invstd, eps):
    shape = _channel_shape(x)
    out = (opmath(x) - mean.reshape(shape)) * invstd.reshape(shape)
    return _affine(out, weight, bias, shape).astype(x.dtype)


@meta_kernel(aten.batch_norm_backward_reduce.default)
def _backward_reduce_meta(grad, x, mean, invstd, weight, input_g, weight_g, bias_g):
    sums = [mean.new_empty(mean.shape) if input_g else None for _ in range(2)]
    parameter = weight if weight is not None else mean
    return (*sums, *[parameter.new_empty(mean.shape) if wanted else None for wanted in (weight_g, bias_g)])


@lower(aten.batch_norm_backward_reduce)
def batch_norm_backward_reduce(grad, x, mean, invstd, weight, input_g, weight_g, bias_g):
    """Each process's sums of the gradient and of its product with the centred data (all-reduced by
    SyncBatchNorm), and its share of the weight and bias gradients."""
    shape, axes = _channel_shape(x), _all_but_channels(x)
    g = opmath(grad)
    sum_dy = jnp.sum(g, axis=axes)
    sum_dy_xmu = jnp.sum(g * (opmath(x) - mean.reshape(shape)), axis=axes)
    dtype = weight.dtype if weight is not None else mean.dtype
    return (sum_dy.astype(mean.dtype) if input_g else None, sum_dy_xmu.astype(mean.dtype) if input_g else None,
            (sum_dy_xmu * invstd).astype(dtype) if weight_g else None, sum_dy.astype(dtype) if bias_g else None)


meta_kernel(aten.batch_norm_backward_elemt.default)(_like_data)


@lower(aten.batch_norm_backward_elemt)
def batch_norm_backward_elemt(grad, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    shape = _channel_shape(x)
    total = jnp.sum(count).astype(mean.dtype)
    invstd = invstd.reshape(shape)
    centred = opmath(x) - mean.reshape(shape)
    dx = opmath(grad) - (sum_dy / total).reshape(shape) - centred * jnp.square(invstd) * (sum_dy_xmu / total).reshape(shape)
    scale = invstd * opmath(weight).reshape(shape) if weight is not None else invstd
    return (dx * scale).astype(x.dtype)


def _embedding_meta(weight, indices, *args, **kwargs):
    # the meta kernel asserts this; the CPU kernel raises a RuntimeError
    torch._check(weight.dim() == 2, lambda: "'weight' must be 2-D")
    return aten.embedding.default(weight, indices, *args, **kwargs)


@lower(aten.embedding, meta=_embedding_meta)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    checks.index_in_range(indices, weight.shape[0], negative=False)
    return jnp.take(weight, indices, axis=0)


@lower(aten.embedding_dense_backward)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    flat = indices.reshape(-1)
    g = opmath(grad).reshape(flat.shape[0], -1)
    if padding_idx >= 0:
        g = jnp.where((flat == padding_idx)[:, None], 0, g)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[flat].add(1)
        g = g / counts[flat][:, None]
    return jnp.zeros((num_weights, g.shape[1]), g.dtype).at[flat].add(g).astype(grad.dtype)


_EMBEDDING_BAG_SUM, _EMBEDDING_BAG_MEAN, _EMBEDDING_BAG_MAX = 0, 1, 2


def _rows(x, index, fill=0):
    """x[index] along axis 0, `fill` where index is out of range (jnp.take refuses an empty x)."""
    if x.shape[0] == 0:
        return jnp.full(index.shape + x.shape[1:], fill, x.dtype)
    return jnp.take(x, index, axis=0, mode="fill", fill_value=fill)


def _bags(indices, offsets, include_last_offset, padding_idx):
    """Each index's bag (num_bags, out of range, past an include_last_offset end), its use, and the bag count."""
    num_bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    if offsets.shape[0]:
        checks.require(offsets[0] == 0, RuntimeError,
                       "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from position 0.")
        checks.require(offsets[-1] <= indices.shape[0], RuntimeError,
                       f"offsets[-1] can not be greater than input's length {indices.shape[0]} but got "
                       "offsets[-1] of {}", culprit=offsets[-1])
    bag = jnp.searchsorted(offsets, jnp.arange(indices.shape[0], dtype=offsets.dtype), side="right") - 1
    bag = jnp.where(bag < 0, num_bags, bag).astype(indices.dtype)
    used = (bag < num_bags) & (indices != padding_idx) if padding_idx >= 0 else bag < num_bags
    return bag, used, num_bags


def _embedding_bag_max(rows, indices, bag, used, num_bags):
    """Per-bag maxima and the first index reaching them (-1 for an empty bag), as PyTorch's CPU kernel picks."""
    values = jax.ops.segment_max(jnp.where(used[:, None], rows, -jnp.inf), bag, num_bags)
    position = jnp.arange(indices.shape[0])[:, None]
    hits = used[:, None] & (rows == _rows(values, bag, jnp.nan))
    first = jax.ops.segment_min(jnp.where(hits, position, indices.shape[0]), bag, num_bags)
    winners = _rows(indices, first, -1)
    return jnp.where(winners >= 0, values, 0), winners


@lower(aten._embedding_bag, aten._embedding_bag_forward_only)
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False, per_sample_weights=None,
                  include_last_offset=False, padding_idx=-1):
    bag, used, num_bags = _bags(indices, offsets, include_last_offset, padding_idx)
    in_range = (indices >= 0) & (indices < weight.shape[0])
    if mode == 2 or padding_idx >= 0:  # the CPU kernel's paths word it differently
        checks.require(in_range, RuntimeError,
                       "embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be {}",
                       culprit=indices)
    else:
        checks.require(in_range, RuntimeError,
                       f"Index {{}} of input takes value {{}} which is not in the valid range [0, {weight.shape[0]})",
                       culprit=(jnp.arange(indices.shape[0]), indices))
    # bag sizes count only non-padding indices; one slot per offset, as the CUDA kernel lays them out
    bag_size = jax.ops.segment_sum(used.astype(indices.dtype), bag, offsets.shape[0])
    rows = _rows(opmath(weight), indices)
    if mode == _EMBEDDING_BAG_MAX:
        out, max_indices = _embedding_bag_max(rows, indices, bag, used, num_bags)
        return out.astype(weight.dtype), bag, bag_size, max_indices.astype(indices.dtype)
    if per_sample_weights is not None:
        rows = rows * opmath(per_sample_weights)[:, None]
    out = jax.ops.segment_sum(jnp.where(used[:, None], rows, 0), bag, num_bags).astype(weight.dtype)
    if mode == _EMBEDDING_BAG_MEAN:
        out = out / jnp.maximum(bag_size[:num_bags], 1).astype(weight.dtype)[:, None]
    return out, bag, bag_size, jnp.zeros((0,), indices.dtype)


@lower(aten._embedding_bag_dense_backward)
def embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq,
                                 mode, per_sample_weights=None, padding_idx=-1):
    g = opmath(grad)
    out = jnp.zeros((num_weights, g.shape[1]), g.dtype)
    if mode == _EMBEDDING_BAG_MAX:
        rows = jnp.where(maximum_indices < 0, num_weights, maximum_indices)
        return out.at[rows, jnp.arange(g.shape[1])].add(g, mode="drop").astype(grad.dtype)
    used = offset2bag < g.shape[0]
    if padding_idx >= 0:
        used = used & (indices != padding_idx)
    scale = used.astype(g.dtype)
    if scale_grad_by_freq:
        scale = scale / jnp.zeros((num_weights,), g.dtype).at[indices].add(1)[indices]
    if mode == _EMBEDDING_BAG_MEAN:
        scale = scale / _rows(jnp.maximum(bag_size, 1).astype(g.dtype), offset2bag, 1)
    if per_sample_weights is not None:
        scale = scale * opmath(per_sample_weights)
    return out.at[indices].add(_rows(g, offset2bag) * scale[:, None], mode="drop").astype(grad.dtype)


@lower(aten._embedding_bag_backward)
def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                           scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1):
    if sparse:
        # eager makes it from dense ops (eager/sparse.py); a compiled graph, whose tensors are dense, has none
        raise NotImplementedError("torchneuron: a sparse gradient in a lowering")
    return embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                        scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@lower(aten._embedding_bag_per_sample_weights_backward)
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    g = opmath(grad)
    out = jnp.sum(_rows(g, offset2bag) * _rows(opmath(weight), indices), axis=1)
    if padding_idx >= 0:
        out = jnp.where(indices == padding_idx, 0, out)
    return out.astype(grad.dtype)


def _conv_dimension_numbers(n):
    spatial = "DHW"[-n:] if n <= 3 else None
    return (f"NC{spatial}", f"OI{spatial}", f"NC{spatial}")


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    """The convolution unrounded: float32 for half-precision inputs, so a bias is added before the one rounding."""
    if not transposed and _by_patches(x, w.shape[2:], stride, padding, dilation, groups):
        xla_conv = functools.partial(_xla_conv, stride=stride, padding=padding, dilation=dilation, groups=groups)
        by_patches = functools.partial(_conv_by_patches, stride=stride, padding=padding, dilation=dilation)
        return lax.platform_dependent(x, w, cpu=by_patches, default=xla_conv)
    return _xla_conv(x, w, stride, padding, dilation, transposed, output_padding, groups)


def _xla_conv(x, w, stride, padding, dilation, transposed=False, output_padding=None, groups=1):
    n = x.ndim - 2
    numbers = _conv_dimension_numbers(n)
    acc = accumulation_type(x)
    if not transposed:
        return lax.conv_general_dilated(
            x, w, window_strides=stride, padding=[(p, p) for p in padding], rhs_dilation=dilation,
            dimension_numbers=numbers, feature_group_count=groups, preferred_element_type=acc,
        )
    # a transposed convolution is the gradient of a convolution: dilate the input, flip the kernel
    cin = w.shape[0]
    w = w.reshape((groups, cin // groups) + w.shape[1:])
    w = jnp.swapaxes(w, 1, 2).reshape((w.shape[2] * groups, cin // groups) + w.shape[3:])
    w = jnp.flip(w, axis=tuple(range(2, 2 + n)))
    pads = [
        (d * (k - 1) - p, d * (k - 1) - p + op)
        for k, p, d, op in zip(w.shape[2:], padding, dilation, output_padding)
    ]
    return lax.conv_general_dilated(
        x, w, window_strides=(1,) * n, padding=pads, lhs_dilation=stride, rhs_dilation=dilation,
        dimension_numbers=numbers, feature_group_count=groups, preferred_element_type=acc,
    )


def _check_convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    """The argument checks of the CPU kernel that PyTorch's meta kernel leaves out."""
    for values, ok, message in (
        (padding, lambda p: p >= 0, "negative padding is not supported"),
        (output_padding, lambda p: p >= 0, "negative output_padding is not supported"),
        (stride, lambda s: s > 0, "non-positive stride is not supported"),
        (dilation, lambda d: d > 0, "dilation should be greater than zero"),
    ):
        if not all(ok(v) for v in values):
            raise RuntimeError(message)
    if transposed:
        _check_output_padding(x.ndim - 2, stride, dilation, output_padding)


def _convolution_layout(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    """PyTorch's meta kernel, which leaves the memory format to the backend (its backward's follows this rule)."""
    out = aten.convolution.default(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)
    return out.to(memory_format=conv_memory_format(x, w))


def _check_output_padding(n: int, stride, dilation, output_padding) -> None:
    """A transposed convolution's output padding is below its stride or its dilation, in each dimension."""
    given = [per_dim(v, n) for v in (output_padding, stride, dilation)]
    if all(p < max(s, d) for p, s, d in zip(*given)):
        return
    if n == 1:  # the CPU checks a 1-d convolution as a 2-d one of height 1
        given = [(0, *given[0]), (1, *given[1]), (1, *given[2])]
    names = ("depth", "height", "width")[-len(given[0]):]
    parts = [f"{kind}_{name}: {value}" for kind, values in zip(("output_padding", "stride", "dilation"), given)
             for name, value in zip(names, values)]
    raise RuntimeError("output padding must be smaller than either stride or dilation, but got " + " ".join(parts))


@lower(aten.convolution, meta=checked_meta(_check_convolution, _convolution_layout))
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    n = x.ndim - 2
    out = _conv(x, w, per_dim(stride, n), per_dim(padding, n), per_dim(dilation, n), transposed,
                per_dim(output_padding, n), groups)
    if bias is not None:
        out = out + opmath(bias).reshape((1, -1) + (1,) * n)
    return out.astype(x.dtype)


# XLA:CPU's convolution is slow with few input channels (an image's 3): as a bare jax.jit, the 3-channel 3x3
# convolution of a batch of 32x32 images took 1.8-2.0 ms against PyTorch's 0.3, and 0.5-0.7 ms as products of
# the input's windows (its patches); the weight gradient 1.2-1.5 ms by kernel offsets (below), 0.6 from the
# patches. With more channels, larger kernels (a 16x16 patch embedding: 7.4 against 5.6 ms, and 2.4 s to
# compile its 256 slices) or patches larger than a cache holds (a 7x7 stem on 224x224 images: 101 against
# 47 ms), XLA's convolution is the faster.
_PATCH_CHANNELS = 4
_PATCH_OFFSETS = 9
_PATCH_BYTES = 16 << 20


def _output_sizes(spatial, kernel, stride, padding, dilation) -> list:
    return [(size + 2 * p - d * (k - 1) - 1) // s + 1
            for size, k, s, p, d in zip(spatial, kernel, stride, padding, dilation)]


def _by_patches(x, kernel, stride, padding, dilation, groups) -> bool:
    """Whether XLA:CPU runs this convolution (and its weight gradient) faster from the input's patches (see
    above)."""
    batch, channels = x.shape[:2]
    out = _output_sizes(x.shape[2:], kernel, stride, padding, dilation)
    patch_bytes = batch * math.prod(out) * math.prod(kernel) * channels * x.dtype.itemsize
    return (groups == 1 and channels <= _PATCH_CHANNELS and math.prod(kernel) <= _PATCH_OFFSETS
            and patch_bytes <= _PATCH_BYTES)


def _offset_slices(x, kernel, stride, padding, dilation, out):
    """For each kernel offset in order, the zero-padded input's strided slice that it reads for every output
    position: (batch, channels, *out)."""
    batch, channels = x.shape[:2]
    padded = lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0)] * 2 + [(p, p, 0) for p in padding])
    for offset in np.ndindex(*kernel):
        starts, limits = window_slice(offset, dilation, out, stride)
        yield lax.slice(padded, (0, 0, *starts), (batch, channels, *limits), (1, 1, *stride))


def _patches(x, kernel, stride, padding, dilation):
    """The input's windows, (batch, kernel offsets x channels, output positions): the offsets' slices stacked;
    and the output's spatial sizes."""
    out = _output_sizes(x.shape[2:], kernel, stride, padding, dilation)
    windows = jnp.stack(list(_offset_slices(x, kernel, stride, padding, dilation, out)), axis=1)
    return windows.reshape(x.shape[0], -1, math.prod(out)), out


def _conv_by_patches(x, w, stride, padding, dilation):
    # products batched over the batch, so that the output comes out in its layout, channels before positions
    patches, out = _patches(x, w.shape[2:], stride, padding, dilation)
    weights = jnp.moveaxis(w, 1, -1).reshape(w.shape[0], -1)  # (out channels, kernel offsets x channels)
    weights = jnp.broadcast_to(weights, (x.shape[0],) + weights.shape)
    y = lax.dot_general(weights, patches, (((2,), (1,)), ((0,), (0,))), preferred_element_type=accumulation_type(x))
    return y.reshape(x.shape[0], w.shape[0], *out)


def _weight_grad_by_patches(kernel, stride, padding, dilation, grad, x):
    patches, _ = _patches(x, kernel, stride, padding, dilation)
    g = grad.reshape(grad.shape[0], grad.shape[1], -1)
    per_image = lax.dot_general(g, patches, (((2,), (2,)), ((0,), (0,))), preferred_element_type=accumulation_type(x))
    dw = per_image.sum(axis=0).reshape(grad.shape[1], *kernel, x.shape[1])
    return jnp.moveaxis(dw, -1, 1).astype(x.dtype)


def _weight_grad_by_offsets(kernel, stride, padding, dilation, groups, grad, x):
    """A convolution's weight gradient as one contraction per kernel offset: the output gradient against
    the input's strided slice at that offset, over the batch and the output positions."""
    batch, cin = x.shape[:2]
    cout, out = grad.shape[1], grad.shape[2:]
    g = grad.reshape(batch, groups, cout // groups, -1)
    acc = accumulation_type(x)
    shares = []
    for window in _offset_slices(x, kernel, stride, padding, dilation, out):
        window = window.reshape(batch, groups, cin // groups, -1)
        # contract batch and positions, groups as the batch of the product: (groups, cout/groups, cin/groups)
        shares.append(lax.dot_general(g, window, (((0, 3), (0, 3)), ((1,), (1,))), preferred_element_type=acc))
    return jnp.stack(shares, axis=-1).reshape((cout, cin // groups) + tuple(kernel)).astype(x.dtype)


# XLA:CPU runs the vjp's convolution (the whole image as its window, the batch as its features) after
# transposing both operands so that the positions, the innermost axis, become the outermost. Contractions
# over strided slices per kernel offset keep the positions innermost: in a small CNN's training step (32
# channels of 16x16) its backward program took 6.4 ms against 8.9 with the vjp. With more positions or
# channels the vjp is the faster (bare jax.jits: 8x64x56x56, 24 against 13 ms, and a compiled conv-BN-ReLU
# step's median 160 against 39 ms; 8x256x14x14, 7.1 against 5.7 ms), and so with large kernels (a 16x16
# patch embedding: 11 against 8 ms, and 2.2 s to compile its 256 slices). Other platforms have convolution
# libraries for the vjp's form.
_OFFSETS_POSITIONS = 256
_OFFSETS_CHANNELS = 128
_OFFSETS_KERNEL = 25


def _by_offsets(grad, x, kernel, groups) -> bool:
    """Whether XLA:CPU runs this convolution's weight gradient faster by kernel offsets (see above)."""
    return (math.prod(grad.shape[2:]) <= _OFFSETS_POSITIONS and x.shape[1] // groups <= _OFFSETS_CHANNELS
            and math.prod(kernel) <= _OFFSETS_KERNEL)


def _weight_grad(grad, x, w, args):
    def by_vjp(grad, x):
        return jax.vjp(lambda b: _xla_conv(x, b, *args), w)[1](opmath(grad))[0]

    stride, padding, dilation, transposed, _, groups = args
    kernel = w.shape[2:]
    if transposed:
        return by_vjp(grad, x)
    if _by_patches(x, kernel, stride, padding, dilation, groups):
        on_cpu = functools.partial(_weight_grad_by_patches, kernel, stride, padding, dilation)
    elif _by_offsets(grad, x, kernel, groups):
        on_cpu = functools.partial(_weight_grad_by_offsets, kernel, stride, padding, dilation, groups)
    else:
        return by_vjp(grad, x)
    return lax.platform_dependent(grad, x, cpu=on_cpu, default=by_vjp)


@lower(aten.convolution_backward)
def convolution_backward(grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                         output_mask):
    n = x.ndim - 2
    args = (per_dim(stride, n), per_dim(padding, n), per_dim(dilation, n), transposed, per_dim(output_padding, n),
            groups)
    dx = jax.vjp(lambda a: _xla_conv(a, w, *args), x)[1](opmath(grad))[0] if output_mask[0] else None
    dw = _weight_grad(grad, x, w, args) if output_mask[1] else None
    db = jnp.sum(opmath(grad), axis=(0,) + tuple(range(2, grad.ndim))).astype(grad.dtype) if output_mask[2] else None
    return dx, dw, db


def _check_dropout_dtype(x, p, train):
    """Dropout of complex input: the CPU's composite dropout refuses it at its bernoulli mask and CUDA's
    fused kernel refuses it; PyTorch's meta kernel (a decomposition) fails with another error."""
    if x.is_complex():
        raise not_implemented_for("native_dropout", x.dtype)


@lower(aten.native_dropout, random=True, static_scalars=True,  # branches on p
       meta=checked_meta(_check_dropout_dtype, aten.native_dropout.default))
def native_dropout(key, x, p, train):
    if not train:
        return x, jnp.ones(x.shape, jnp.bool_)
    # p is a traced scalar: p == 0 keeps everything and p == 1 scales by zero without branching
    keep = jax.random.bernoulli(key, 1 - p, x.shape)
    scale = jnp.where(p < 1, 1.0 / (1 - p), 0.0).astype(x.dtype)
    return jnp.where(keep, x * scale, jnp.zeros_like(x)), keep


@lower(aten.native_dropout_backward)
def native_dropout_backward(grad, mask, scale):
    # PyTorch's kernel, grad * (mask.type_as(grad) * scale), promotes as written: the float scale takes a bool
    # or integer grad to the default float dtype before the product
    return _multiply(grad, _multiply(mask.astype(grad.dtype), scale))


_multiply = elementwise(jnp.multiply)


@lower(aten.mse_loss)
def mse_loss(x, target, reduction=1):
    return _reduce(jnp.square(x - target), reduction)


@lower(aten.binary_cross_entropy)
def binary_cross_entropy(x, target, weight=None, reduction=1):
    """PyTorch's decomposition, after the CPU's checks of the probabilities (CUDA's kernel asserts them)."""
    for name, p in (("input", x), ("target", target)):
        checks.require((p >= 0) & (p <= 1), RuntimeError, f"all elements of {name} should be between 0 and 1")
    return decomposed(aten.binary_cross_entropy.default)(x, target, weight, reduction)


def _check_beta(x, target, reduction=1, beta=1.0, **out):
    if beta < 0:  # PyTorch's meta kernel takes it (its huber_loss's refuses a non-positive delta)
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")


for _overload in (aten.smooth_l1_loss.default, aten.smooth_l1_loss.out):
    META[_overload] = checked_meta(_check_beta, _overload)


def _reduce(losses, reduction):
    if reduction == 0:
        return losses
    if reduction == 1:
        return jnp.mean(opmath(losses)).astype(losses.dtype)
    return jnp.sum(opmath(losses)).astype(losses.dtype)


def _padded_targets(targets, target_lengths, max_length):
    """Targets as (batch, max_length), from padded 2-D or concatenated 1-D targets; -1 past each length."""
    lengths = jnp.asarray(target_lengths)
    positions = jnp.arange(max_length)
    if targets.ndim == 2:
        padded = targets[:, :max_length]
    elif max_length == 0:
        padded = jnp.zeros((lengths.shape[0], 0), targets.dtype)
    else:
        starts = jnp.cumsum(lengths) - lengths
        padded = targets[jnp.clip(starts[:, None] + positions, 0, targets.shape[0] - 1)]
    return jnp.where(positions < lengths[:, None], padded, -1)


def _logsumexp(*terms):
    """log of the sum of exp(terms): -inf when all are, with zero (not nan) gradients there, unlike jnp.logaddexp."""
    top = lax.stop_gradient(functools.reduce(jnp.maximum, terms))
    top = jnp.where(jnp.isneginf(top), 0, top)
    total = sum(jnp.exp(t - top) for t in terms)
    return jnp.where(total > 0, jnp.log(jnp.where(total > 0, total, 1)), -jnp.inf) + top


def _ctc_alphas(log_probs, targets, input_lengths, target_lengths, max_length, blank):
    """log alpha over time (T + 1, batch, 2L + 1), the first row the start before any input.

    States alternate blank and target label; a state is entered from itself, the one before, or
    the one two before when that holds a different label. Starting from a virtual state before
    the first blank makes the first step the same recursion as every other.
    """
    lp = opmath(log_probs)
    labels = _padded_targets(targets, target_lengths, max_length)
    batch, length = labels.shape
    extended = jnp.full((batch, 2 * length + 1), blank, labels.dtype).at[:, 1::2].set(jnp.maximum(labels, 0))
    emissions = jnp.take_along_axis(lp, jnp.broadcast_to(extended, (lp.shape[0],) + extended.shape), axis=2)
    states = jnp.arange(extended.shape[1])
    valid = states < 2 * jnp.asarray(target_lengths)[:, None] + 1
    skip = (states >= 2) & (extended != jnp.roll(extended, 2, axis=1))
    neginf = jnp.full((batch, 1), -jnp.inf, lp.dtype)

    def step(alpha, emission):
        before = jnp.concatenate([neginf, alpha[:, :-1]], axis=1)
        two_before = jnp.where(skip, jnp.concatenate([neginf, before[:, :-1]], axis=1), -jnp.inf)
        alpha = _logsumexp(alpha, before, two_before) + emission
        alpha = jnp.where(valid, alpha, -jnp.inf)
        return alpha, alpha

    start = jnp.broadcast_to(jnp.where(states == 0, 0, -jnp.inf).astype(lp.dtype), extended.shape)
    _, alphas = lax.scan(step, start, emissions)
    return jnp.concatenate([start[None], alphas])


def _ctc_nll(alphas, input_lengths, target_lengths):
    """-log of the probability of ending in the last label or the blank after it, at each input's end."""
    batch = jnp.arange(alphas.shape[1])
    last = alphas[jnp.asarray(input_lengths), batch]
    ends = 2 * jnp.asarray(target_lengths)
    final_blank = last[batch, ends]
    final_label = jnp.where(ends > 0, last[batch, jnp.maximum(ends - 1, 0)], -jnp.inf)
    return -_logsumexp(final_blank, final_label)


def _ctc_forward(log_probs, targets, input_lengths, target_lengths, max_length, blank):
    alphas = _ctc_alphas(log_probs, targets, input_lengths, target_lengths, max_length, blank)
    nll = _ctc_nll(alphas, input_lengths, target_lengths)
    # past each input's end nothing is reachable
    steps = jnp.arange(alphas.shape[0] - 1)[:, None, None]
    log_alpha = jnp.where(steps < jnp.asarray(input_lengths)[:, None], alphas[1:], -jnp.inf)
    return nll.astype(log_probs.dtype), jnp.transpose(log_alpha, (1, 0, 2)).astype(log_probs.dtype)


# lengths given as tensors run outside any compiled program: compile once per shape, not per lengths
_ctc_forward_compiled = jax.jit(_ctc_forward, static_argnames=("max_length", "blank"))


@lower(aten._ctc_loss.default)
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    return _ctc_forward(log_probs, targets, input_lengths, target_lengths, max(target_lengths, default=0), blank)


@lower(aten._ctc_loss.Tensor, dynamic_shape=True)  # log_alpha's last size is twice the longest target, plus one
def ctc_loss_lengths_tensor(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    input_lengths, target_lengths = input_lengths.reshape(-1).tolist(), target_lengths.reshape(-1).tolist()
    # this overload has no meta kernel: the int-list one's raises the CPU's errors
    aten._ctc_loss.default(_meta(log_probs), _meta(targets), input_lengths, target_lengths, blank)
    return _ctc_forward_compiled(log_probs, targets, jnp.asarray(input_lengths), jnp.asarray(target_lengths),
                                 max_length=max(target_lengths, default=0), blank=blank)


def _meta(x):
    return torch.empty(x.shape, dtype=to_torch(x.dtype), device="meta")


@lower(aten._ctc_loss_backward, meta=meta_like_input)
def ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                      blank, zero_infinity=False):
    max_length = (log_alpha.shape[2] - 1) // 2
    input_lengths, target_lengths = jnp.asarray(input_lengths).reshape(-1), jnp.asarray(target_lengths).reshape(-1)

    def nll(lp):
        alphas = _ctc_alphas(lp, targets, input_lengths, target_lengths, max_length, blank)
        return _ctc_nll(alphas, input_lengths, target_lengths)

    g = opmath(grad)
    infinite = jnp.isinf(opmath(neg_log_likelihood))
    dlp = vjp(nll, jnp.where(infinite, 0, g), (opmath(log_probs),))[0]
    # PyTorch's kernel gives the gradient as if log_probs came from a log_softmax of logits; its
    # exp(log_probs) term cancels through log_softmax's backward (pytorch/pytorch#52241)
    inside = jnp.arange(log_probs.shape[0])[:, None, None] < jnp.asarray(input_lengths)[:, None]
    dlp = dlp + jnp.where(inside, jnp.exp(opmath(log_probs)) * g[:, None], 0)
    # an impossible alignment has no gradient: nan, or zero when asked to ignore it
    return jnp.where(inside & infinite[:, None], 0 if zero_infinity else jnp.nan, dlp).astype(log_probs.dtype)


@lower(aten.hardshrink_backward, aten.softshrink_backward)
def shrink_backward(grad, x, lambd):
    return jnp.where(jnp.abs(x) > lambd, grad, jnp.zeros_like(grad))


def _hinge(z, p=1):
    """max(0, z)**p with PyTorch's zero gradient at the kink (jnp.maximum would split it)."""
    return jnp.where(z > 0, z, jnp.zeros_like(z)) ** p


def _multi_margin_losses(x, target, p, margin, weight):
    v = opmath(x)
    rows = v.reshape(-1, v.shape[-1]) if v.ndim else v.reshape(1, 1)
    checks.require((target >= 0) & (target < rows.shape[1]), RuntimeError, "target out of range")
    labels = target.reshape(-1, 1)
    picked = jnp.take_along_axis(rows, labels, axis=1)
    z = _hinge(margin - picked + rows, p)
    if weight is not None:
        z = z * opmath(weight)[labels]
    z = jnp.where(jnp.arange(rows.shape[1]) == labels, 0, z)
    losses = jnp.sum(z, axis=1) / rows.shape[1]
    return losses.reshape(target.shape).astype(x.dtype)


@lower(aten.multi_margin_loss)
def multi_margin_loss(x, target, p=1, margin=1, weight=None, reduction=1):
    return _reduce(_multi_margin_losses(x, target, p, margin, weight), reduction)


@lower(aten.multi_margin_loss_backward, meta=meta_like_input)
def multi_margin_loss_backward(grad, x, target, p, margin, weight=None, reduction=1):
    return vjp(lambda v: multi_margin_loss(v, target, p, margin, weight, reduction), grad, (x,))[0]


def _multilabel_targets(target, num_classes):
    """Which target slots count (those before the first -1), and the per-class is-a-target mask."""
    valid = jnp.cumprod(target != -1, axis=-1).astype(jnp.bool_)
    labels = jnp.where(valid, target, 0)
    hits = jax.nn.one_hot(labels, num_classes, dtype=jnp.bool_) & valid[..., None]
    return valid, labels, jnp.any(hits, axis=-2)


@lower(aten.multilabel_margin_loss_forward)
def multilabel_margin_loss_forward(x, target, reduction):
    if x.ndim == 0:
        loss, is_target = multilabel_margin_loss_forward(x.reshape(1), target.reshape(1), reduction)
        return loss, is_target.reshape(())
    checks.require((target >= -1) & (target < x.shape[-1]), RuntimeError, "argument #2 'target' is out of range")
    v = opmath(x)
    valid, labels, is_target = _multilabel_targets(target, v.shape[-1])
    picked = jnp.take_along_axis(v, labels, axis=-1)
    z = _hinge(1 - picked[..., :, None] + v[..., None, :])
    z = jnp.where(valid[..., :, None] & ~is_target[..., None, :], z, 0)
    losses = (jnp.sum(z, axis=(-2, -1)) / v.shape[-1]).astype(x.dtype)
    return _reduce(losses, reduction), is_target.astype(x.dtype)


@lower(aten.multilabel_margin_loss_backward, meta=meta_like_input)
def multilabel_margin_loss_backward(grad, x, target, reduction, is_target):
    return vjp(lambda v: multilabel_margin_loss_forward(v, target, reduction)[0], grad, (x,))[0]


def _distance_parts(x1, x2, p):
    """Pairwise differences [..., R1, R2, M] and p-norm distances [..., R1, R2]."""
    diff = opmath(x1)[..., :, None, :] - opmath(x2)[..., None, :, :]
    a = jnp.abs(diff)
    if p == 0:
        dist = jnp.sum((a != 0).astype(a.dtype), axis=-1)
    elif p == 1:
        dist = jnp.sum(a, axis=-1)
    elif p == 2:
        dist = jnp.sqrt(jnp.sum(a * a, axis=-1))
    elif p == float("inf"):
        dist = jnp.max(a, axis=-1, initial=0.0)
    else:
        dist = jnp.sum(a ** p, axis=-1) ** (1 / p)
    return diff, dist


def _distance_grad(grad, diff, dist, p):
    """d dist / d x1 summed against grad over the second set of rows, zero where a distance is zero."""
    d = dist[..., None]
    if p == 0:
        return jnp.zeros(diff.shape[:-2] + diff.shape[-1:], diff.dtype)
    if p == 1:
        local = jnp.sign(diff)
    elif p == 2:
        local = diff / jnp.where(d == 0, 1, d)
    elif p == float("inf"):
        local = jnp.sign(diff) * (jnp.abs(diff) == d)
    else:
        local = diff * jnp.abs(diff) ** (p - 2) / jnp.where(d == 0, 1, d) ** (p - 1)
    local = jnp.where(d == 0, 0, local)
    return jnp.sum(opmath(grad)[..., None] * local, axis=-2)


@lower(aten._cdist_forward, static_scalars=True)  # p picks the formula
def cdist_forward(x1, x2, p, compute_mode=None):
    return _distance_parts(x1, x2, p)[1].astype(x1.dtype)


@lower(aten._cdist_backward, static_scalars=True)
def cdist_backward(grad, x1, x2, p, cdist):
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    if 0 in batch + x1.shape[-2:] + x2.shape[-2:-1]:
        return jnp.zeros_like(x1)  # PyTorch's shortcut keeps x1's own shape
    x1 = jnp.broadcast_to(x1, batch + x1.shape[-2:])
    diff, dist = _distance_parts(x1, x2, p)
    return _distance_grad(grad, diff, dist, p).astype(x1.dtype)


@lower(aten._pdist_forward, static_scalars=True)
def pdist_forward(x, p=2):
    rows, cols = jnp.triu_indices(x.shape[0], 1)
    return _distance_parts(x, x, p)[1][rows, cols].astype(x.dtype)


@lower(aten._pdist_backward, static_scalars=True)
def pdist_backward(grad, x, p, pdist):
    rows, cols = jnp.triu_indices(x.shape[0], 1)
    # each pair's distance moves both rows: scatter to a symmetric matrix of pair gradients
    full = jnp.zeros((x.shape[0], x.shape[0]), opmath(grad).dtype).at[rows, cols].set(grad)
    diff, dist = _distance_parts(x, x, p)
    return _distance_grad(full + full.T, diff, dist, p).astype(x.dtype)


@lower(aten._trilinear)
def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    # half precision is multiplied and summed in float32 and rounded once, as the CPU's matmuls do
    product = (jnp.expand_dims(opmath(i1), tuple(expand1)) * jnp.expand_dims(opmath(i2), tuple(expand2))
               * jnp.expand_dims(opmath(i3), tuple(expand3)))
    return (jnp.sum(product, axis=tuple(sumdim)) if sumdim else product).astype(i1.dtype)


@lower(aten.rrelu_with_noise_functional, random=True)
def rrelu_with_noise(key, x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    if not training:
        return jnp.where(x >= 0, x, x * cast((lower + upper) / 2, x.dtype)), noise
    slopes = jax.random.uniform(key, x.shape, opmath(x).dtype, lower, upper).astype(x.dtype)
    noise = jnp.where(x <= 0, slopes, jnp.ones_like(slopes)).astype(noise.dtype)
    return x * noise.astype(x.dtype), noise


@lower(aten.embedding_renorm, static_scalars=True)  # norm_type picks the norm
def embedding_renorm(weight, indices, max_norm, norm_type):
    flat = indices.reshape(-1)
    rows = opmath(weight[flat])
    norms = jnp.linalg.norm(rows, ord=norm_type, axis=-1, keepdims=True)
    scale = jnp.where(norms > max_norm, max_norm / (norms + 1e-7), 1)
    return weight.at[flat].set((rows * scale).astype(weight.dtype))



@lower(aten._weight_norm_interface_backward)
def weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    forward = lowering_for(aten._weight_norm_interface.default)
    return vjp(lambda v, g: forward(v, g, dim)[0], grad_w, (saved_v, saved_g))
