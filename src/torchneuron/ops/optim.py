"""Fused optimizer steps and the gradient scaler's ops (torch.amp.GradScaler)."""
import jax.numpy as jnp
import torch

from .registry import lower

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


def _adam(decoupled):
    def step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, *, lr, beta1, beta2, weight_decay, eps,
             amsgrad, maximize, grad_scale=None, found_inf=None):
        outputs = [], [], [], [], []
        for i, (p, g, m, v, s) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, steps)):
            g = g if grad_scale is None else g / grad_scale.astype(g.dtype)
            direction = -g if maximize else g
            if decoupled:
                new_p = p * (1 - lr * weight_decay)
            else:
                new_p, direction = p, direction + weight_decay * p
            new_m = m + (direction - m) * (1 - beta1)
            new_v = v * beta2 + (1 - beta2) * direction * direction
            s = s.astype(jnp.float32)
            correction2 = jnp.sqrt(1 - beta2**s)
            new_max = jnp.maximum(max_exp_avg_sqs[i], new_v) if amsgrad else None
            denom = jnp.sqrt(new_max if amsgrad else new_v) / correction2 + eps
            new_p = new_p - (lr / (1 - beta1**s)) * new_m / denom
            # a step with non-finite (scaled) gradients changes nothing but the unscaled gradients
            keep = found_inf is not None and found_inf > 0
            values = (new_p, g, new_m, new_v, new_max)
            olds = (p, g, m, v, max_exp_avg_sqs[i] if amsgrad else None)
            for out, new, old in zip(outputs, values, olds):
                if new is not None:
                    out.append((jnp.where(keep, old, new) if found_inf is not None else new).astype(old.dtype))
        return tuple(list(o) for o in outputs)

    return step


lower(aten._fused_adam.default, aten._fused_adam.tensor_lr)(_adam(decoupled=False))
lower(aten._fused_adamw.default, aten._fused_adamw.tensor_lr)(_adam(decoupled=True))
