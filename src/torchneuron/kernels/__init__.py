"""The kernel language (`import torchneuron.kernels as nk`): tile kernels checked by a NumPy simulator,
lowered to JAX, and used from PyTorch as custom ops. See docs/kernels.md."""
# flake8: noqa: F401  (the language's namespace)
from .context import KernelError, use_lowering
from .custom_op import custom_op
from .kernel import Kernel, kernel
from .language import (HBMTensor, Tile, abs, add, affine_range, bfloat16, bool_, broadcast_to, copy, cos,
                       divide, ds, expect, floor_divide, fori, equal, exp, float16, float32, float64, full, gelu, greater, greater_equal,
                       hbm, int32, iota, less, less_equal, load, log, logical_and, logical_not, logical_or,
                       matmul, max, maximum, mean, min, minimum, multiply, ndarray, negative, not_equal,
                       num_programs, power, program_id, psum, random_uniform, reciprocal, relu, remainder, rsqrt, sbuf,
                       sequential_range, sigmoid, silu, sin, sqrt, square, store, subtract, sum, tanh,
                       transpose, uint32, where, zeros)
