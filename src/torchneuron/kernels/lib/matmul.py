"""A tiled matmul kernel: out [M, N] = a [M, K] @ b [K, N], 128 x 512 output tiles accumulated in psum
over 128-deep slices of K; ragged edges are masked."""
import torch

import torchneuron.kernels as nk

from .common import P, blocks

N_TILE = 512


def matmul_tile(out, a, b, i, j, m, k, n, lead=()):
    """Inside a kernel: out[*lead, i-th 128 rows, j-th 512 columns] = a[*lead] @ b[*lead], in float32."""
    rows, row_ok = nk.ds(i * P, P), nk.iota((P, 1), 0) + i * P < m
    cols, col_ok = nk.ds(j * N_TILE, N_TILE), nk.iota((1, N_TILE), 1) + j * N_TILE < n

    def step(kk, acc):
        depth = nk.iota((1, P), 1) + kk * P < k
        at = nk.load(a[(*lead, rows, nk.ds(kk * P, P))], mask=row_ok & depth)
        bt = nk.load(b[(*lead, nk.ds(kk * P, P), cols)], mask=nk.transpose(depth) & col_ok)
        acc += nk.matmul(at, bt)
        return (acc,)

    (acc,) = nk.fori(blocks(k), step, (nk.zeros((P, N_TILE), nk.float32, buffer=nk.psum),))
    nk.store(out[(*lead, rows, cols)], acc, mask=row_ok & col_ok)


@nk.kernel
def matmul_kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    (m, k), n = a.shape, b.shape[1]
    out = nk.ndarray((m, n), a.dtype, buffer=nk.hbm)
    matmul_tile(out, a, b, nk.program_id(0), nk.program_id(1), m, k, n)
    return out


def _grid(a, b):
    return (blocks(a.shape[0]), blocks(b.shape[1], N_TILE))


_matmul = nk.custom_op("torchneuron_kernels::matmul", matmul_kernel, grid=_grid)


def matmul(a, b):
    """a [M, K] @ b [K, N] through the kernel (no autograd: the library's backward passes use it)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise RuntimeError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied")
    return _matmul(a.contiguous(), b.contiguous())
