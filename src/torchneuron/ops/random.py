"""Random ops, each drawing from a key the dispatcher takes from the device generator (their first argument)."""
import math

import jax
import jax.numpy as jnp
import torch
from jax import lax
from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

from ..runtime.dtypes import scalar_type_name, to_jax
from ..runtime.tensor import NeuronTensor
from . import checks
from .promotion import opmath, type_meta_name
from .reductions import running_sum
from .registry import META, checked_meta, lower, meta_casting_into_out, meta_kernel

aten = torch.ops.aten


def _float(x):
    return x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32


def _check_uniform_bounds(x, low=0.0, high=1.0, **kwargs):
    """PyTorch's error for bad bounds, which its meta kernels do not check (the bounds are then static scalars,
    or later calls would reuse a program built without the check)."""
    # numbers as C++ prints doubles (a graph's are floats: 2.0 prints 2)
    torch._check(low <= high,
                 lambda: f"uniform_ expects to return a [from, to) range, but found from={low:g} > to={high:g}")


def _check_exponential_rate(x, lambd=1.0, **kwargs):
    torch._check(lambd > 0, lambda: f"exponential_ expects lambda > 0.0, but found lambda={lambd:g}")


def _drawn(key, shape, dtype, draw):
    """draw(key, shape, real dtype) as `dtype`, in float32 for half precision; a complex dtype gets its real
    and imaginary parts drawn independently, as PyTorch draws into view_as_real of the tensor."""
    wide = dtype in (jnp.float64, jnp.complex128)
    real = jnp.float64 if wide else jnp.float32
    if jnp.issubdtype(dtype, jnp.complexfloating):
        parts = draw(key, shape + (2,), real)
        return lax.complex(parts[..., 0], parts[..., 1]).astype(dtype)
    return draw(key, shape, real).astype(dtype)


def _uniform(key, shape, dtype, low=0.0, high=1.0):
    return _drawn(key, shape, dtype, lambda k, s, d: low + jax.random.uniform(k, s, d) * (high - low))


def _normal(key, shape, dtype, mean=0.0, std=1.0):
    # a complex normal's variance std**2 is split between its parts
    scale = std / math.sqrt(2) if jnp.issubdtype(dtype, jnp.complexfloating) else std
    return _drawn(key, shape, dtype, lambda k, s, d: mean + jax.random.normal(k, s, d) * scale)


@lower(aten.uniform, random=True, static_scalars=True)
def uniform(key, x, low=0.0, high=1.0, *, generator=None):
    return _uniform(key, x.shape, x.dtype, low, high)


@lower(aten.normal_functional, random=True)
def normal(key, x, mean=0.0, std=1.0, *, generator=None):
    return _normal(key, x.shape, x.dtype, mean, std)


@lower(torch.ops.prims.normal, random=True, static_scalars=True)  # the shape is static
def prims_normal(key, shape, mean, std, *, dtype, device=None, requires_grad=False, generator=None):
    return _drawn(key, tuple(shape), to_jax(dtype), lambda k, s, d: mean + jax.random.normal(k, s, d) * std)


@lower(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor, random=True)
def normal_tensors(key, mean, std=1.0, *, generator=None):
    if hasattr(std, "dtype"):  # CUDA's kernel reads it too (a float std is the meta kernel's to check)
        checks.require(std >= 0, RuntimeError, "normal expects all elements of std >= 0.0")
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    dtype = _float(mean) if hasattr(mean, "dtype") else _float(std)
    return (mean + jax.random.normal(key, shape, dtype) * std).astype(dtype)


@lower(aten.bernoulli.p, random=True)
def bernoulli_p(key, x, p=0.5, *, generator=None):
    return jax.random.bernoulli(key, p, x.shape).astype(x.dtype)


@lower(aten.bernoulli.default, aten.bernoulli.Tensor, random=True)
def bernoulli(key, x, p=None, *, generator=None):
    probability = x if p is None else jnp.broadcast_to(p, x.shape)
    checks.require((probability >= 0) & (probability <= 1), RuntimeError,
                   "Expected p_in >= 0 && p_in <= 1 to be true, but got false.  (Could this error message be improved?  "
                   "If so, please report an enhancement request to PyTorch.)")
    return (jax.random.uniform(key, x.shape, jnp.float32) < probability.astype(jnp.float32)).astype(x.dtype)


# the draws are cast into any out tensor, an integer one included
META[aten.bernoulli.out] = meta_casting_into_out(aten.bernoulli.default)


def _check_random_range(x, low, high=None, **kwargs):
    """The CPU kernel's errors for an empty range and for bounds the dtype cannot hold, which the meta
    kernel takes."""
    if high is None:
        return
    if low >= high:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    if x.dtype == torch.bool:
        lowest, highest = 0, 1
    else:
        info = torch.finfo(x.dtype) if x.dtype.is_floating_point else torch.iinfo(x.dtype)
        lowest, highest = info.min, info.max
    for name, bound in (("from", low), ("to - 1", high - 1)):
        if not lowest <= bound <= highest:
            raise RuntimeError(f"{name} is out of bounds for {type_meta_name(x.dtype)}")


@lower(getattr(aten.random, "from"), random=True)
def random_from(key, x, low, high=None, *, generator=None):
    high = _random_high(x) if high is None else high
    return jax.random.randint(key, x.shape, low, high, dtype=jnp.int64).astype(x.dtype)


def _check_random_to(x, high, **kwargs):
    _check_random_range(x, 0, high)


# the in-place ops eager runs (torch.randint calls random_), and the functional ones compiled graphs hold
for _check, _ops in ((_check_uniform_bounds, (aten.uniform_.default, aten.uniform.default)),
                     (_check_exponential_rate, (aten.exponential_.default, aten.exponential.default)),
                     (_check_random_range, (getattr(aten.random_, "from"), getattr(aten.random, "from"))),
                     (_check_random_to, (aten.random_.to, aten.random.to))):
    for _op in _ops:
        META[_op] = checked_meta(_check, _op)


@lower(aten.random.to, random=True)
def random_to(key, x, high, *, generator=None):
    return random_from(key, x, 0, high)


@lower(aten.random.default, random=True)
def random_default(key, x, *, generator=None):
    return random_from(key, x, 0, None)


def _random_high(x):
    if x.dtype == jnp.bool_:
        return 2
    if jnp.issubdtype(x.dtype, jnp.floating):
        return 2 ** jnp.finfo(x.dtype).nmant + 1
    return int(jnp.iinfo(x.dtype).max) + 1 if x.dtype != jnp.int64 else 2**63 - 1


@lower(aten.exponential, random=True, static_scalars=True)
def exponential(key, x, lambd=1.0, *, generator=None):
    return (jax.random.exponential(key, x.shape, _float(x)) / lambd).astype(x.dtype)


@lower(aten.randperm, random=True, static_scalars=True)
def randperm(key, n, *, dtype=None, layout=None, device=None, pin_memory=None, generator=None):
    return jax.random.permutation(key, n)


@lower(aten.rand_like, random=True)
def rand_like(key, x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _uniform(key, x.shape, to_jax(dtype) if dtype is not None else x.dtype)


@lower(aten.randn_like, random=True)
def randn_like(key, x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _normal(key, x.shape, to_jax(dtype) if dtype is not None else x.dtype)


def _multinomial_meta(probabilities, num_samples, replacement=False, **kwargs):
    """The CPU kernel's argument checks, which PyTorch's meta kernel leaves out."""
    torch._check(probabilities.is_floating_point(), lambda: "multinomial only supports floating-point dtypes for "
                 f"input, got: {scalar_type_name(probabilities.dtype)}")
    torch._check(replacement or num_samples <= probabilities.size(-1),
                 lambda: "cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    return aten.multinomial.default(probabilities, num_samples, replacement, **kwargs)


META[aten.multinomial.default] = _multinomial_meta


def _check_multinomial_out(*args, out, **kwargs):
    torch._check(out.dtype == torch.int64, lambda: f"multinomial expects Long tensor out, got: {scalar_type_name(out.dtype)}")


META[aten.multinomial.out] = checked_meta(_check_multinomial_out, aten.multinomial.out)


@lower(aten.multinomial, random=True)
def multinomial(key, probabilities, num_samples, replacement=False, *, generator=None):
    p = probabilities.astype(jnp.float32)
    checks.require(jnp.isfinite(p) & (p >= 0), RuntimeError,
                   "probability tensor contains either `inf`, `nan` or element < 0")
    checks.require(jnp.sum(p, axis=-1) > 0, RuntimeError, "invalid multinomial distribution (sum of probabilities <= 0)")
    if replacement:
        return _inverse_transform_samples(key, p, num_samples)
    # Gumbel top-k draws without replacement in one pass (in float32: XLA:CPU's TopK is fast for it alone)
    perturbed = jnp.log(p) + jax.random.gumbel(key, p.shape, jnp.float32)
    return jax.lax.top_k(perturbed, num_samples)[1].astype(jnp.int64)


def _inverse_transform_samples(key, p, num_samples):
    """Draws with replacement as PyTorch's CPU kernel makes them, a binary search of the running sum per draw:
    jax.random.categorical's Gumbel maximum draws a number for every category of every sample (8 draws from
    64 rows of 32000: 288 ms on XLA:CPU)."""
    cumulative = running_sum(p, p.ndim - 1)
    rows = cumulative.reshape(-1, p.shape[-1])
    draws = jax.random.uniform(key, (rows.shape[0], num_samples), jnp.float32) * rows[:, -1:]
    index = jax.vmap(lambda row, u: jnp.searchsorted(row, u, side="right"))(rows, draws)
    # a draw rounded up to the total would fall past the end: it takes the last category that can be drawn
    last = p.shape[-1] - 1 - jnp.argmax(jnp.flip(p.reshape(rows.shape) > 0, -1), axis=-1)
    return jnp.minimum(index, last[:, None]).reshape(*p.shape[:-1], num_samples).astype(jnp.int64)


@lower(aten.randint_like, random=True)
def randint_like(key, x, *bounds, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                 memory_format=None):
    low, high = (0, bounds[0]) if len(bounds) == 1 else bounds
    return jax.random.randint(key, x.shape, low, high, dtype=jnp.int64)


def _in_float32_for_half(draw):
    """A sampler of float arrays (`draw(key, x, *more)`) run in float32 for half-precision `x`, as the CPU
    samples in its accumulation type; the result in `x`'s dtype."""
    def sample(key, x, *more):
        return draw(key, opmath(x), *map(opmath, more)).astype(x.dtype)
    return sample


def _gamma(key, alpha):
    # the CPU and CUDA kernels keep every sample at least the smallest normal number (Gamma.rsample's
    # callers divide by it), a non-positive concentration included
    tiny = jnp.finfo(alpha.dtype).tiny
    return jnp.where(alpha > 0, jnp.maximum(jax.random.gamma(key, alpha, dtype=alpha.dtype), tiny), tiny)


@lower(aten._standard_gamma, random=True)
def standard_gamma(key, alpha, generator=None):
    return _in_float32_for_half(_gamma)(key, alpha)


@lower(aten._standard_gamma_grad)
def standard_gamma_grad(alpha, sample):
    """d sample / d alpha of a Gamma(alpha, 1) sample held fixed in probability (implicit reparameterization)."""
    return lax.random_gamma_grad(opmath(alpha), opmath(sample)).astype(alpha.dtype)


@lower(aten._sample_dirichlet, random=True)
def sample_dirichlet(key, concentration, generator=None):
    # normalised Gamma samples, as the CPU and CUDA kernels draw them (so all-zero concentrations are uniform)
    def draw(key, alpha):
        gammas = _gamma(key, alpha)
        return gammas / jnp.sum(gammas, axis=-1, keepdims=True)
    return _in_float32_for_half(draw)(key, concentration)


@lower(aten.poisson, random=True)
def poisson(key, rate, generator=None):
    checks.require((rate >= 0) | jnp.isnan(rate), RuntimeError, "invalid Poisson rate, expected rate to be non-negative")
    counts = jax.random.poisson(key, opmath(rate), dtype=jnp.int64)
    return counts.astype(rate.dtype)


@lower(aten.binomial, random=True)
def binomial(key, count, probability, generator=None):
    # as the CPU kernel: no trials for a count below 1, a probability outside [0, 1] taken as its bound
    def draw(key, count, probability):
        return jnp.where(count > 0, jax.random.binomial(key, jnp.maximum(count, 0), jnp.clip(probability, 0, 1)), 0)
    return _in_float32_for_half(draw)(key, count, probability)


# (_standard_gamma's and poisson's arrived in torch 2.13)
@meta_kernel(aten._standard_gamma.default, aten.poisson.default, aten._standard_gamma_grad.default,
             aten._sample_dirichlet.default)
def _shaped_as_first(x, *args, **kwargs):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@meta_kernel(aten.binomial.default)
def _binomial_meta(count, probability, generator=None):
    torch._check(probability.dtype == count.dtype, lambda: f"Found dtype {scalar_type_name(probability.dtype)} but "
                 f"expected {scalar_type_name(count.dtype)}")
    return count.new_empty(torch.broadcast_shapes(count.shape, probability.shape))


def _device_module_of(args, kwargs):
    device = next(t.device for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
                  and t.device.type != "cpu")
    return torch.get_device_module(device), device


def _run_and_save_rng_state(op, *args, **kwargs):
    module, device = _device_module_of(args, kwargs)
    return module.get_rng_state(device), op(*args, **kwargs)


def _run_with_rng_state(rng_state, op, *args, **kwargs):
    module, device = _device_module_of(args, kwargs)
    current = module.get_rng_state(device)
    module.set_rng_state(rng_state.cpu(), device)
    try:
        return op(*args, **kwargs)
    finally:
        module.set_rng_state(current, device)


# A compiled graph whose random ops activation checkpointing recomputes in backward saves the generator's state
# before each one and replays it: these higher-order ops run between the graph's compiled pieces, as CUDA's
# rules (PyTorch has none for other devices) save and set its generator's state
run_and_save_rng_state.py_impl(NeuronTensor)(_run_and_save_rng_state)
run_with_rng_state.py_impl(NeuronTensor)(_run_with_rng_state)
