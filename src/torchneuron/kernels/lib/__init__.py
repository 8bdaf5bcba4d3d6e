"""The kernel library: kernels written in torchneuron.kernels, called as plain functions of torch tensors
with autograd."""
from .cross_entropy import linear_cross_entropy
from .adamw import adamw_step
from .moe import MoE, grouped_matmul, permute, route, unpermute
from .paged_attention import paged_attention_decode
from .attention import dropout_keep, flash_attention, flash_attention_seed, use_for_sdpa
from .matmul import matmul
from .norms import layer_norm, rms_norm
from .rope import rope
from .swiglu import swiglu

__all__ = ["paged_attention_decode", "MoE", "grouped_matmul", "permute", "route", "unpermute", "adamw_step", "linear_cross_entropy", "dropout_keep", "flash_attention", "flash_attention_seed", "use_for_sdpa", "layer_norm", "matmul", "rms_norm", "rope", "swiglu"]
