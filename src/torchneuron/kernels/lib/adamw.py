"""A fused AdamW step over a list of tensors: one op whose lowering launches the kernel on each tensor
(viewed as rows of 512) inside one XLA program, without concatenating the lists: on neuron one
dispatch per step, and no copy of the parameters, gradients and moments into one buffer."""
import math

import jax.numpy as jnp
import torch

import torchneuron.kernels as nk

from ... import library
from .common import blocks, row_block, row_grid

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


def _launches(lists, scalars, step, pad):
    """New params, exp_avgs, exp_avg_sqs: `step(param, grad, exp_avg, exp_avg_sq, *scalars)` on each tensor's
    rows of 512 (a view where 512 divides its size; else `pad` pads the tail)."""
    results = [[], [], []]
    for group in zip(*lists):
        shape, n = group[0].shape, math.prod(group[0].shape)
        rows = [(pad(t.reshape(-1), (0, -n % WIDTH)) if n % WIDTH else t).reshape(-1, WIDTH) for t in group]
        for out, new in zip(results, step(*rows, *scalars)):
            out.append(new.reshape(-1)[:n].reshape(shape))
    return results


@torch.library.custom_op("torchneuron_kernels::adamw_list", mutates_args=())
def _adamw_list(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                exp_avg_sqs: list[torch.Tensor], lr: float, beta1: float, beta2: float, eps: float,
                weight_decay: float, bias_correction1: float, bias_correction2_sqrt: float) -> list[torch.Tensor]:
    """The new params, then exp_avgs, then exp_avg_sqs (on CPU tensors: the single-tensor op per tensor)."""
    scalars = (lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2_sqrt)
    return sum(_launches((params, grads, exp_avgs, exp_avg_sqs), scalars, _adamw, torch.nn.functional.pad), [])


@_adamw_list.register_fake
def _(params, grads, exp_avgs, exp_avg_sqs, *scalars):
    return [torch.empty_like(t) for t in (*params, *exp_avgs, *exp_avg_sqs)]


@library.lowering(torch.ops.torchneuron_kernels.adamw_list.default)
def _(params, grads, exp_avgs, exp_avg_sqs, *scalars):
    def launch(p, g, m, v, *scalars):
        return adamw_kernel[(blocks(p.shape[0]),)].lower(p, g, m, v, *scalars)
    return sum(_launches((params, grads, exp_avgs, exp_avg_sqs), scalars, launch, jnp.pad), [])


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
    new = _adamw_list(*([t.contiguous() for t in x] for x in lists), float(lr), float(beta1), float(beta2),
                      float(eps), float(weight_decay), 1 - beta1 ** step, math.sqrt(1 - beta2 ** step))
    for target, source in zip((*params, *exp_avgs, *exp_avg_sqs), new):
        target.copy_(source)
