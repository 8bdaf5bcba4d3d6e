"""Pieces the library's kernels and entry points share."""
import torch

import torchneuron.kernels as nk

P = 128  # rows per tile: the partition axis


def blocks(n: int, size: int = P) -> int:
    return -(-n // size)


def row_block(i, n: int, size: int = P):
    """Inside a kernel: the window of `size` rows starting at block `i` of `n` rows, and its [size, 1] mask."""
    return nk.ds(i * size, size), nk.iota((size, 1), 0) + i * size < n


def row_grid(x, *rest):
    """One program per 128 rows of the first (2-D) argument."""
    return (blocks(x.shape[0]),)


def check_floating(name: str, **tensors):
    for arg, t in tensors.items():
        if t is not None and not t.dtype.is_floating_point:
            raise TypeError(f"{name}: {arg} must be a floating point tensor, got {t.dtype}")


def check_last_dim(name: str, x: torch.Tensor, what: str, other: torch.Tensor):
    if other is not None and (other.dim() != 1 or other.shape[0] != x.shape[-1]):
        raise RuntimeError(f"{name}: {what} must have shape ({x.shape[-1]},) to match the input's last dimension, "
                           f"got {tuple(other.shape)}")
