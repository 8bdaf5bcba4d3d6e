"""Fused optimizer steps and the gradient scaler's ops (torch.amp.GradScaler)."""
import jax.numpy as jnp
import torch

from .promotion import opmath
from .registry import lower, meta_kernel

aten = torch.ops.aten


@lower(aten._amp_foreach_non_finite_check_and_unscale)
def non_finite_check_and_unscale(grads, found_inf, inv_scale):
    unscaled = [g * inv_scale.astype(g.dtype) for g in grads]
    non_finite = jnp.any(jnp.array([~jnp.all(jnp.isfinite(g)) for g in grads]))
    return unscaled, jnp.where(non_finite, jnp.ones_like(found_inf), found_inf)


@lower(aten._amp_update_scale)
def update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    found = found_inf > 0
    successful = growth_tracker + 1
    grow = ~found & (successful == growth_interval)
    grown = jnp.where(jnp.isfinite(scale * growth_factor), scale * growth_factor, scale)
    new_scale = jnp.where(found, scale * backoff_factor, jnp.where(grow, grown, scale))
    new_tracker = jnp.where(found | grow, jnp.zeros_like(growth_tracker), successful)
    return new_scale.astype(scale.dtype), new_tracker


def _fused_step(update, params, grads, states, grad_scale=None, found_inf=None, steps=None):
    """The lists a fused optimizer step writes: params, grads (unscaled by `grad_scale`), then each of
    `states` (an empty one, as momentum 0's buffers or Adam's without amsgrad, stays empty).

    `update(param, grad, *state, step)` gives a parameter's new value and new states, computed as the CPU
    and CUDA kernels compute them: in float32 for half-precision tensors. When the gradient scaler found
    non-finite gradients (`found_inf` is 1) those kernels return at once, so nothing changes, not even the
    gradients' scale."""
    outputs = [[] for _ in range(2 + len(states))]
    for i, (param, grad) in enumerate(zip(params, grads)):
        state = [s[i] if s else None for s in states]
        wide = opmath(param).dtype
        unscaled = grad.astype(wide)
        if grad_scale is not None:
            unscaled = unscaled / grad_scale.astype(wide)
        wide_state = [None if s is None else s.astype(wide) for s in state]
        step = None if steps is None else steps[i].astype(jnp.float32)
        new_param, *new_state = update(param.astype(wide), unscaled, *wide_state, step)
        for out, old, new in zip(outputs, (param, grad, *state), (new_param, unscaled, *new_state)):
            if old is not None:
                new = new.astype(old.dtype)
                out.append(new if found_inf is None else jnp.where(found_inf == 1, old, new))
    return outputs


def _adam(decoupled):
    def step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, *, lr, beta1, beta2, weight_decay, eps,
             amsgrad, maximize, grad_scale=None, found_inf=None):
        def update(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step):
            direction = -grad if maximize else grad
            if decoupled:
                param = param * (1 - lr * weight_decay)
            else:
                direction = direction + weight_decay * param
            exp_avg = exp_avg + (direction - exp_avg) * (1 - beta1)
            exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * direction * direction
            max_exp_avg_sq = jnp.maximum(max_exp_avg_sq, exp_avg_sq) if amsgrad else None
            denom = jnp.sqrt(max_exp_avg_sq if amsgrad else exp_avg_sq) / jnp.sqrt(1 - beta2**step) + eps
            return param - (lr / (1 - beta1**step)) * exp_avg / denom, exp_avg, exp_avg_sq, max_exp_avg_sq

        states = (exp_avgs, exp_avg_sqs, max_exp_avg_sqs if amsgrad else [])
        return _fused_step(update, params, grads, states, grad_scale, found_inf, steps)

    return step


lower(aten._fused_adam.default, aten._fused_adam.tensor_lr)(_adam(decoupled=False))
lower(aten._fused_adamw.default, aten._fused_adamw.tensor_lr)(_adam(decoupled=True))


@lower(aten._fused_sgd.default, aten._fused_sgd.tensor_lr)
def fused_sgd(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize,
              is_first_step, grad_scale=None, found_inf=None):
    # torch.optim passes no momentum buffers when momentum is 0: the buffer is None and only the step is taken
    def update(param, grad, buffer, _):
        grad = (-grad if maximize else grad) + param * weight_decay
        if buffer is not None:
            buffer = grad if is_first_step else buffer * momentum + grad * (1 - dampening)
            grad = grad + buffer * momentum if nesterov else buffer
        return param - grad * lr, buffer

    return _fused_step(update, params, grads, [momentum_buffer_list], grad_scale, found_inf)


def _adagrad(params, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps, maximize, grad_scale=None,
             found_inf=None):
    def update(param, grad, state_sum, step):
        grad = (-grad if maximize else grad) + param * weight_decay
        state_sum = state_sum + grad * grad
        return param - lr / (1 + (step - 1) * lr_decay) * grad / (jnp.sqrt(state_sum) + eps), state_sum

    return _fused_step(update, params, grads, [state_sums], grad_scale, found_inf, state_steps)


@lower(aten._fused_adagrad.default)
def fused_adagrad(params, grads, state_sums, state_steps, **options):
    # this overload's schema lists the steps among what it writes; the kernel only reads them
    return [*_adagrad(params, grads, state_sums, state_steps, **options), list(state_steps)]


lower(aten._fused_adagrad.tensor_lr)(_adagrad)


@meta_kernel(aten._fused_adam_.tensor_lr, aten._fused_adamw_.tensor_lr, aten._fused_sgd_.default,
             aten._fused_sgd_.tensor_lr, aten._fused_adagrad_.default, aten._fused_adagrad_.tensor_lr)
def _writes_in_place(*args, **kwargs):
    """An in-place fused optimizer step returns nothing and changes no shape."""
