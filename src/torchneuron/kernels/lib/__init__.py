"""The kernel library: kernels written in torchneuron.kernels, called as plain functions of torch tensors
with autograd."""
from .attention import flash_attention
from .matmul import matmul
from .norms import layer_norm, rms_norm
from .rope import rope
from .swiglu import swiglu

__all__ = ["flash_attention", "layer_norm", "matmul", "rms_norm", "rope", "swiglu"]
