"""A fused AdamW step over a list of tensors: parameters, gradients and both moments of every tensor go
through one kernel launch as rows of 512 (the lists are concatenated, then split back)."""
import math

import torch

import torchneuron.kernels as nk

from .common import row_block, row_grid

WIDTH = 512


@nk.kernel
def adamw_kernel(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                 lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, bias_correction1: float,
                 bias_correction2_sqrt: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, width = param.shape
    new_param = nk.ndarray((n, width), param.dtype, buffer=nk.hbm)
    new_avg = nk.ndarray((n, width), exp_avg.dtype, buffer=nk.hbm)
    new_avg_sq = nk.ndarray((n, width), exp_avg_sq.dtype, buffer=nk.hbm)
    rows, valid = row_block(nk.program_id(0), n)
    p = nk.load(param[rows, :], mask=valid, dtype=nk.float32)
    g = nk.load(grad[rows, :], mask=valid, dtype=nk.float32)
    m = nk.load(exp_avg[rows, :], mask=valid, dtype=nk.float32) * beta1 + g * (1.0 - beta1)
    v = nk.load(exp_avg_sq[rows, :], mask=valid, dtype=nk.float32) * beta2 + g * g * (1.0 - beta2)
    p = p * (1.0 - lr * weight_decay)
    p = p - (m / (nk.sqrt(v) / bias_correction2_sqrt + eps)) * (lr / bias_correction1)
    nk.store(new_param[rows, :], p, mask=valid)
    nk.store(new_avg[rows, :], m, mask=valid)
    nk.store(new_avg_sq[rows, :], v, mask=valid)
    return new_param, new_avg, new_avg_sq


_adamw = nk.custom_op("torchneuron_kernels::adamw", adamw_kernel, grid=row_grid)


def _rows(tensors):
    flat = torch.cat([t.reshape(-1) for t in tensors])
    padded = torch.nn.functional.pad(flat, (0, -flat.numel() % WIDTH))
    return padded.reshape(-1, WIDTH)


@torch.no_grad()
def adamw_step(params, grads, exp_avgs, exp_avg_sqs, *, step: int, lr: float, betas=(0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 1e-2):
    """One AdamW step (torch.optim.AdamW's update, `step` counted from 1) on lists of same-dtype tensors,
    updated in place."""
    lists = (params, grads, exp_avgs, exp_avg_sqs)
    if len({len(x) for x in lists}) != 1:
        raise ValueError("adamw_step: params, grads, exp_avgs and exp_avg_sqs must have the same length")
    if not params:
        return
    for group in zip(*lists):
        if len({(t.shape, t.dtype, t.device) for t in group}) != 1:
            raise RuntimeError("adamw_step: a parameter, its gradient and moments must share shape, dtype and device")
    if len({p.dtype for p in params}) != 1:
        raise TypeError("adamw_step: all parameters must have one dtype (call it once per dtype)")
    beta1, beta2 = betas
    new_params, new_avgs, new_avg_sqs = _adamw(*(_rows(x) for x in lists), float(lr), float(beta1), float(beta2),
                                               float(eps), float(weight_decay), 1 - beta1 ** step,
                                               math.sqrt(1 - beta2 ** step))
    at = 0
    for p, m, v in zip(params, exp_avgs, exp_avg_sqs):
        n = p.numel()
        for target, source in ((p, new_params), (m, new_avgs), (v, new_avg_sqs)):
            target.copy_(source.reshape(-1)[at:at + n].view_as(target))
        at += n
