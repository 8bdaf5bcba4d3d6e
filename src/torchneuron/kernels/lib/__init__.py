"""The kernel library: kernels written in torchneuron.kernels, called as plain functions of torch tensors
with autograd. See docs/kernels.md."""
from .adamw import adamw_step
from .attention import dropout_keep, flash_attention, flash_attention_seed, use_for_sdpa
from .cross_entropy import linear_cross_entropy
from .matmul import matmul
from .mlp import swiglu
from .moe import MoE, grouped_matmul, permute, route, unpermute
from .norms import layer_norm, rms_norm
from .paged_attention import paged_attention_decode
from .rotary import rope

__all__ = ["MoE", "adamw_step", "dropout_keep", "flash_attention", "flash_attention_seed", "grouped_matmul",
           "layer_norm", "linear_cross_entropy", "matmul", "paged_attention_decode", "permute", "rms_norm", "rope",
           "route", "swiglu", "unpermute", "use_for_sdpa"]
