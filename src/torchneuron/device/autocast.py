"""`torch.autocast("neuron")`: CUDA's cast policy on the AutocastPrivateUse1 key.

PyTorch enables that key for a PrivateUse1 device but registers no kernels there
(every op then fails under autocast), so a backend brings its own policy. The op
lists mirror the CUDA ones in ATen/autocast_mode.h; unlisted ops fall through.
"""
import torch
from torch.utils._pytree import tree_map

aten = torch.ops.aten

LOWER_PRECISION = [
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr", "matmul",
    "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
]
FP32 = [
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh",
    "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm", "native_layer_norm",
    "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss",
    "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist",
    "renorm", "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d",
    "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
    # CUDA appends dtype=float32 to these norm overloads: the same as computing from float32 inputs
    "norm.Scalar", "norm.ScalarOpt_dim",
]
# float32 unless the caller chose a dtype
FP32_SET_OPT_DTYPE = [
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
]
PROMOTE = ["addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
           "tensordot", "scatter_add"]

_KEY = torch._C.DispatchKey.AutocastPrivateUse1
_registered = []


def _eligible(value) -> bool:
    return (isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64
            and value.device.type == "neuron")


def _cast_all(args, kwargs, dtype):
    return tree_map(lambda v: v.to(dtype) if _eligible(v) else v, (args, kwargs))


def _widest(args, kwargs):
    dtypes = [v.dtype for v in torch.utils._pytree.tree_leaves((args, kwargs)) if _eligible(v)]
    widest = dtypes[0] if dtypes else None
    for dtype in dtypes[1:]:
        widest = torch.promote_types(widest, dtype)
    return widest


def _lower_precision(op, args, kwargs):
    return _cast_all(args, kwargs, torch.get_autocast_dtype("neuron"))


def _fp32(op, args, kwargs):
    return _cast_all(args, kwargs, torch.float32)


def _fp32_set_opt_dtype(op, args, kwargs):
    if not _eligible(args[0]):
        return args, kwargs
    position = [a.name for a in op._schema.arguments].index("dtype")
    if len(args) > position:
        return (args if args[position] is not None else args[:position] + (torch.float32,) + args[position + 1:]), kwargs
    return args, kwargs if kwargs.get("dtype") is not None else dict(kwargs, dtype=torch.float32)


def _promote(op, args, kwargs):
    widest = _widest(args, kwargs)
    return (args, kwargs) if widest is None else _cast_all(args, kwargs, widest)


def _kernel(op, policy):
    def autocast(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_KEY)):
            args, kwargs = policy(op, args, kwargs)
            return op(*args, **kwargs)

    return autocast


def _overload(name):
    packet, _, overload = name.partition(".")
    packet = getattr(aten, packet, None)
    return getattr(packet, overload or "default", None) if packet is not None else None


def register() -> None:
    if _registered:
        return
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    library = torch.library.Library("aten", "IMPL")
    for names, policy in ((LOWER_PRECISION, _lower_precision), (FP32, _fp32),
                          (FP32_SET_OPT_DTYPE, _fp32_set_opt_dtype), (PROMOTE, _promote)):
        for name in names:
            op = _overload(name)
            if op is not None:
                library.impl(op, _kernel(op, policy), "AutocastPrivateUse1")
    _registered.extend([fallthrough, library])
