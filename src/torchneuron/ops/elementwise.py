"""Elementwise ops: arithmetic, comparisons, activations and their backward formulas."""
import jax
import jax.numpy as jnp
import jax.scipy.special as special
import torch
from jax import lax
from torch._meta_registrations import check_inplace_broadcast

from ..runtime.dtypes import convert, scalar_type_name
from .promotion import ALWAYS_BOOL, DEFAULT, INT_TO_FLOAT, NO_OPMATH, cast, elementwise, opmath, promote
from .registry import META, checked_meta, lower, meta_casting_into_out

aten = torch.ops.aten
prims = torch.ops.prims


def _register_all(table, kind):
    for op, fn in table:
        lower(op)(elementwise(fn, kind=kind))


def _is_integral(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_


def _sign(x):
    """(0 < x) - (x < 0), the CPU's and CUDA's formula for reals: 0 for nan, and +0 for -0 (jnp.sign keeps both)."""
    if x.dtype == jnp.bool_:
        return x
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.sign(x)
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


def _round_half_even(x):
    return jnp.round(x)


# XLA's complex functions ignore the sign of a zero part, which picks the side of a branch cut in C99 and on the
# CPU: sqrt(-1 - 0j) is -1j there, and asin(2.5 - 0j) has a negative imaginary part. Each is computed where XLA is
# right and signed by the function's symmetries.


def _signed_zero_aware(real_fn, complex_fn):
    def lowering(z):
        return complex_fn(z) if jnp.iscomplexobj(z) else real_fn(z)

    return lowering


def _first_quadrant(z):
    return lax.complex(jnp.abs(z.real), jnp.abs(z.imag))


def _odd_and_conjugate_symmetric(fn, first_quadrant_fn=None):
    """f(-z) = -f(z) and f(conj z) = conj f(z) (asin, asinh, atan, atanh): f of the first quadrant
    (`first_quadrant_fn`, else `fn`), signed."""
    def complex_fn(z):
        w = (first_quadrant_fn or fn)(_first_quadrant(z))
        return lax.complex(jnp.copysign(w.real, z.real), jnp.copysign(w.imag, z.imag))

    return _signed_zero_aware(fn, complex_fn)


def _complex_sqrt(z):
    """sqrt(conj z) = conj sqrt(z); the imaginary part has the sign of z's."""
    w = jnp.sqrt(z)
    return lax.complex(w.real, jnp.copysign(w.imag, z.imag))


def _complex_arccos(z):
    """acos(conj z) = conj acos(z), acos(-z) = pi - acos(z): from the first quadrant."""
    w = jnp.arccos(_first_quadrant(z))
    real = jnp.where(jnp.signbit(z.real), jnp.pi - w.real, w.real)
    return lax.complex(real, jnp.where(jnp.signbit(z.imag), -w.imag, w.imag))


def _complex_arccosh(z):
    """acosh(z) = i acos(z) in the upper half-plane, whose acos has an imaginary part <= 0; conjugated below."""
    w = _complex_arccos(lax.complex(z.real, jnp.abs(z.imag)))
    return lax.complex(-w.imag, jnp.where(jnp.signbit(z.imag), -w.real, w.real))


# |1 - z|^2 and the like underflow where z is within 1e-19 of a singularity (float32): there the real part is the
# logarithm of a distance, or half the difference of two (atanh(1 + 1e-20j) was inf, the CPU 23.37)
_NEAR_SINGULARITY = 1e-3


def _log_of_small(distance):
    """log(distance) where it is below _NEAR_SINGULARITY (0 elsewhere, where the caller takes XLA's value)."""
    return jnp.log(jnp.where(distance < _NEAR_SINGULARITY, distance, 1))


def _complex_arctanh(z):
    """atanh of the first quadrant: XLA's, with the real part near z = 1 from the distances to 1 and -1."""
    w = jnp.arctanh(z)
    gap = jnp.hypot(1 - z.real, z.imag)
    near = (jnp.log(jnp.hypot(1 + z.real, z.imag)) - _log_of_small(gap)) / 2
    return lax.complex(jnp.where(gap < _NEAR_SINGULARITY, near, w.real), w.imag)


def _complex_arctan(z):
    """atan of the first quadrant: XLA's, with the imaginary part near z = i from the distances to i and -i."""
    w = jnp.arctan(z)
    gap = jnp.hypot(z.real, 1 - z.imag)
    near = (jnp.log(jnp.hypot(z.real, 1 + z.imag)) - _log_of_small(gap)) / 2
    return lax.complex(w.real, jnp.where(gap < _NEAR_SINGULARITY, near, w.imag))


def _complex_log1p(z):
    """XLA's, with the real part log |1 + z| as the logarithm of that distance near z = -1."""
    w = jnp.log1p(z)
    gap = jnp.hypot(1 + z.real, z.imag)
    return lax.complex(jnp.where(gap < _NEAR_SINGULARITY, _log_of_small(gap), w.real), w.imag)


def _complex_rsqrt(z):
    """1 / sqrt(z), as the CPU computes it: exactly -1j for -1 (XLA's was 4e-8 off the axis)."""
    return 1 / _complex_sqrt(z)


def _sinh_times(x, trig):
    """sinh(x) * trig, and x itself (a signed zero) for x = 0, also beside an infinite Im z whose trig is nan
    (C99's cosh(i inf) = nan + 0j)."""
    return jnp.where(x == 0, x, jnp.sinh(x) * trig)


def _from_real_parts(fn, parts):
    """sinh or cosh of a complex z: `parts(x, y)` from the real functions where |Re z| < 1 (XLA's flushed
    sinh(1e-20 + 1j)'s real part to 0); XLA's elsewhere, with its overflow and special values."""
    def complex_fn(z):
        small = jnp.abs(z.real) < 1
        real, imag = parts(jnp.where(small, z.real, 0), z.imag)
        w = fn(z)
        return lax.complex(jnp.where(small, real, w.real), jnp.where(small, imag, w.imag))

    return _signed_zero_aware(fn, complex_fn)


def _complex_abs(z):
    """hypot's rule, as C99's cabs: an infinite part makes it infinite, even beside nan."""
    return jnp.where(jnp.isinf(z.real) | jnp.isinf(z.imag), jnp.inf, jnp.abs(z))


def _exp2(x):
    """XLA's exp2, exp(x * ln 2), is up to 33 ulps off in float32 (2^100 too), where its pow is within one."""
    return lax.pow(jnp.asarray(2, x.dtype), x)


def true_divide(a, b):
    """a / b as the CPU computes it. XLA rewrites a division by a broadcast divisor (a Python number, a row of
    norms) into a multiplication by its reciprocal: one ulp off for about a quarter of quotients, and a whole
    integer off once truncated (1.3 / 0.1 gave 13, the CPU 12). Behind an optimization barrier the divisor is
    no broadcast to that rewrite; the barrier is gone before fusion, so the division still fuses with the
    broadcast. Complex quotients keep XLA's division: c10's complex division multiplies by a reciprocal itself."""
    if jnp.iscomplexobj(a) or jnp.iscomplexobj(b):
        return jnp.true_divide(a, b)
    shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b))
    return jnp.true_divide(a, lax.optimization_barrier(jnp.broadcast_to(b, shape)))


_register_all(
    [
        (aten.exp, jnp.exp),
        (aten.exp2, _exp2),
        (aten.expm1, jnp.expm1),
        (aten.log, jnp.log),
        (aten.log2, jnp.log2),
        (aten.log10, jnp.log10),
        (aten.log1p, _signed_zero_aware(jnp.log1p, _complex_log1p)),
        (aten.sqrt, _signed_zero_aware(jnp.sqrt, _complex_sqrt)),
        (aten.rsqrt, _signed_zero_aware(lax.rsqrt, _complex_rsqrt)),
        (aten.sin, jnp.sin),
        (aten.cos, jnp.cos),
        (aten.tan, jnp.tan),
        (aten.asin, _odd_and_conjugate_symmetric(jnp.arcsin)),
        (aten.acos, _signed_zero_aware(jnp.arccos, _complex_arccos)),
        (aten.atan, _odd_and_conjugate_symmetric(jnp.arctan, _complex_arctan)),
        (aten.sinh, _from_real_parts(jnp.sinh, lambda x, y: (_sinh_times(x, jnp.cos(y)), jnp.cosh(x) * jnp.sin(y)))),
        (aten.cosh, _from_real_parts(jnp.cosh, lambda x, y: (jnp.cosh(x) * jnp.cos(y), _sinh_times(x, jnp.sin(y))))),
        (aten.tanh, jnp.tanh),
        (aten.asinh, _odd_and_conjugate_symmetric(jnp.arcsinh)),
        (aten.acosh, _signed_zero_aware(jnp.arccosh, _complex_arccosh)),
        (aten.atanh, _odd_and_conjugate_symmetric(jnp.arctanh, _complex_arctanh)),
        (aten.sigmoid, jax.nn.sigmoid),
        (aten.erf, special.erf),
        (aten.erfc, special.erfc),
        (aten.erfinv, special.erfinv),
        (aten.reciprocal, jnp.reciprocal),
        (aten.atan2, jnp.arctan2),
        (aten.copysign, jnp.copysign),
        (aten.div.Tensor, true_divide),
        (aten.div.Scalar, true_divide),
        (aten.sinc, jnp.sinc),
        (aten.deg2rad, jnp.deg2rad),
        (aten.rad2deg, jnp.rad2deg),
    ],
    INT_TO_FLOAT,
)

_register_all(
    [
        (aten.neg, jnp.negative),
        (aten._neg_view, jnp.negative),  # a lazy view eagerly (eager/math_bits.py); its values in a graph
        (aten.abs, _signed_zero_aware(jnp.abs, _complex_abs)),
        (aten.sign, _sign),
        (aten.sgn, _sign),
        (aten.square, jnp.square),
        (aten.relu, jax.nn.relu),
        (aten.floor, lambda x: x if _is_integral(x) else jnp.floor(x)),
        (aten.ceil, lambda x: x if _is_integral(x) else jnp.ceil(x)),
        (aten.trunc, lambda x: x if _is_integral(x) else jnp.trunc(x)),
        (aten.frac, lambda x: x - jnp.trunc(x)),
        (aten.round.default, lambda x: x if _is_integral(x) else _round_half_even(x)),
        (aten.bitwise_not, lambda x: jnp.logical_not(x) if x.dtype == jnp.bool_ else jnp.invert(x)),
        (aten.bitwise_and, jnp.bitwise_and),
        (aten.bitwise_or, jnp.bitwise_or),
        (aten.bitwise_xor, jnp.bitwise_xor),
        (aten.bitwise_left_shift, jnp.left_shift),
        (aten.bitwise_right_shift, jnp.right_shift),
        (aten.__lshift__, jnp.left_shift),
        (aten.__rshift__, jnp.right_shift),
        (aten.maximum, jnp.maximum),
        (aten.minimum, jnp.minimum),
        (aten.fmax, jnp.fmax),
        (aten.fmin, jnp.fmin),
        (aten.mul, jnp.multiply),
        (aten.hypot, jnp.hypot),
        (aten.heaviside, lambda x, v: jnp.where(x == 0, v, (x > 0).astype(x.dtype))),
    ],
    DEFAULT,
)

# the next value of the tensor's own dtype: a half-precision step is lost if computed in float32 and rounded
_register_all([(aten.nextafter, jnp.nextafter)], NO_OPMATH)

_register_all(
    [
        (aten.eq, jnp.equal),
        (aten.ne, jnp.not_equal),
        (aten.lt, jnp.less),
        (aten.le, jnp.less_equal),
        (aten.gt, jnp.greater),
        (aten.ge, jnp.greater_equal),
        (aten.logical_and, jnp.logical_and),
        (aten.logical_or, jnp.logical_or),
        (aten.logical_xor, jnp.logical_xor),
        (aten.logical_not, jnp.logical_not),
        (aten.isnan, jnp.isnan),
        (aten.isinf, jnp.isinf),
        (aten.isfinite, jnp.isfinite),
        (aten.isposinf, jnp.isposinf),
        (aten.isneginf, jnp.isneginf),
        (aten.signbit, jnp.signbit),
    ],
    ALWAYS_BOOL,
)


def _check_alpha(x, y, *, alpha=1):
    """PyTorch's meta kernel lets a float alpha through for boolean tensors; its CPU kernel does not."""
    if isinstance(alpha, float) and torch.result_type(x, y) == torch.bool:
        raise RuntimeError("For integral input tensors, argument alpha must not be a floating point number.")


@lower(aten.add.Tensor, aten.add.Scalar, meta=checked_meta(_check_alpha, aten.add))
def add(x, y, *, alpha=1):
    (x, y), result = promote(x, y)
    if alpha is not None and not (isinstance(alpha, (int, float)) and alpha == 1):
        y = y * cast(alpha, y.dtype) if y.dtype != jnp.bool_ else jnp.logical_and(y, alpha)
    out = jnp.logical_or(x, y) if x.dtype == jnp.bool_ else x + y
    return out.astype(result)


@lower(aten.sub.Tensor, aten.sub.Scalar)
def sub(x, y, *, alpha=1):
    (x, y), result = promote(x, y)
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        y = y * cast(alpha, y.dtype)
    return (x - y).astype(result)


@lower(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(x, y, *, alpha=1):
    return sub(y, x, alpha=alpha)


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(x, y, *, rounding_mode=None):
    if rounding_mode is None:
        return elementwise(true_divide, INT_TO_FLOAT)(x, y)
    (x, y), result = promote(x, y)
    if rounding_mode == "trunc":
        # lax.div truncates, but neither broadcasts nor promotes
        if _is_integral(x):
            out = lax.div(*jnp.broadcast_arrays(x, jnp.asarray(y, x.dtype)))
        else:
            out = jnp.trunc(true_divide(x, y))
    else:
        out = jnp.floor_divide(x, y) if _is_integral(x) else _div_floor_floating(x, y)
    return out.astype(result)


def _div_floor_floating(a, b):
    """PyTorch's floor division of floats (c10's div_floor_floating, the CPU's and CUDA's): from the exact
    remainder, not floor(a / b), whose rounded quotient can reach the next integer (7 // 0.1 is 69 in float32,
    not 70), and nan for an infinite dividend."""
    mod = jnp.fmod(a, b)
    div = (a - mod) / b
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floordiv = jnp.floor(div)
    floordiv = jnp.where(div - floordiv > 0.5, floordiv + 1, floordiv)
    floordiv = jnp.where(div != 0, floordiv, jnp.copysign(jnp.zeros_like(div), a / b))
    return jnp.where(b == 0, a / b, floordiv)


@lower(aten.logit)
def logit(x, eps=None):
    (x,), result = promote(x, kind=INT_TO_FLOAT)
    if eps is not None:
        # the CPU kernel's bounds, tested in its order: with eps above 0.5, below eps reads eps, not 1 - eps
        x = jnp.where(x < eps, eps, jnp.where(x > 1 - eps, 1 - eps, x))
    return jnp.log(x / (1 - x)).astype(result)


@lower(aten.round.decimals)
def round_decimals(x, *, decimals):
    """In float32 for half precision, as the CPU and CUDA compute it (65504 * 100 is no inf there)."""
    wide = opmath(x)
    scale = jnp.asarray(10.0 ** abs(decimals), wide.dtype)
    if decimals >= 0:
        return true_divide(_round_half_even(wide * scale), scale).astype(x.dtype)
    return (_round_half_even(true_divide(wide, scale)) * scale).astype(x.dtype)


@lower(aten._conj_physical, aten.conj_physical, aten._conj)  # _conj: a lazy view eagerly, its values in a graph
def conj_physical(x):
    return jnp.conj(x)


@lower(aten.angle.default)
def angle(x):
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.angle(x)
    (v,), result = promote(x, kind=INT_TO_FLOAT)
    # PyTorch: pi for negative values (not for -0.0), NaN stays NaN
    return jnp.where(jnp.isnan(v), v, jnp.where(v < 0, jnp.pi, 0.0)).astype(result)


def _check_complex_parts(a, b, **out):
    """The CPU kernels' checks, which PyTorch's meta kernel makes with other exceptions or not at all."""
    floating = (torch.float16, torch.float32, torch.float64)
    names = scalar_type_name(a.dtype), scalar_type_name(b.dtype)
    torch._check(
        a.dtype in floating and b.dtype in floating,
        lambda: f"Expected both inputs to be Half, Float or Double tensors but got {names[0]} and {names[1]}",
    )
    torch._check(
        a.dtype == b.dtype,
        lambda: f"Expected object of scalar type {names[0]} but got scalar type {names[1]} for second argument",
    )
    if out:
        wanted, given = scalar_type_name(a.dtype.to_complex()), scalar_type_name(out["out"].dtype)
        torch._check(
            wanted == given,
            lambda: f"Expected object of scalar type {wanted} but got scalar type {given} for argument 'out'",
        )


def _complex_meta(op):
    return checked_meta(_check_complex_parts, op)


def _complex_from_parts(real, imag):
    # float16 parts make complex32, carried as complex64 (runtime.dtypes)
    return lax.complex(*jnp.broadcast_arrays(opmath(real), opmath(imag)))


@lower(aten.complex.default, meta=_complex_meta(aten.complex.default))
def complex_(real, imag):
    return _complex_from_parts(real, imag)


@lower(aten.polar.default, meta=_complex_meta(aten.polar.default))
def polar(abs, angle):
    return _complex_from_parts(abs * jnp.cos(angle), abs * jnp.sin(angle))


@lower(aten.view_as_real, aten.view_as_real_copy)
def view_as_real(x):
    # eager runs these as views (the storage is reinterpreted on read); traced graphs need values
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@lower(aten.view_as_complex, aten.view_as_complex_copy)
def view_as_complex(x):
    return _complex_from_parts(x[..., 0], x[..., 1])


# out= overloads have no lowering of their own, only these checks
META[aten.complex.out] = _complex_meta(aten.complex.out)
META[aten.polar.out] = _complex_meta(aten.polar.out)
# a complex input's absolute value is cast into any out tensor the CPU accepts, complex included
META[aten.abs.out] = meta_casting_into_out(aten.abs.default)


@lower(aten.floor_divide)
def floor_divide(x, y):
    return div_mode(x, y, rounding_mode="floor")


@lower(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(x, y):
    (x, y), result = promote(x, y)
    return jnp.remainder(x, y).astype(result)


@lower(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(x, y):
    (x, y), result = promote(x, y)
    return jnp.fmod(x, y).astype(result)


def _gcd(a, b):
    """Euclid's algorithm as PyTorch's kernel runs it: truncated remainders of absolute values that wrap,
    so gcd(-128, 6) is -2 in int8. |a| shrinks every step (the wrapped minimum turns into |b| first);
    finished elements (a == 0) keep a = b % 1 = 0."""

    def step(pair):
        a, b = pair
        live = a != 0
        return lax.rem(b, jnp.where(live, a, 1)), jnp.where(live, a, b)

    pair = tuple(jnp.broadcast_arrays(jnp.abs(a), jnp.abs(b)))
    return lax.while_loop(lambda pair: jnp.any(pair[0] != 0), step, pair)[1]


def _lcm(a, b):
    """|a / gcd * b|, computed in C's int for narrower types (so the absolute value is taken before narrowing)."""
    dtype = a.dtype
    a, b = (v.astype(jnp.promote_types(dtype, jnp.int32)) for v in (a, b))
    g = _gcd(a, b)
    return jnp.where(g == 0, 0, jnp.abs(lax.div(a, jnp.where(g == 0, 1, g)) * b)).astype(dtype)


lower(aten.gcd.default, prims.gcd.default)(elementwise(_gcd))
lower(aten.lcm.default)(elementwise(_lcm))


def _integer_power(x, y):
    """x^y for y >= 0, squaring over every bit of y and wrapping as the CPU's powi does: jnp.power reads only
    y's low 6 bits (2^64 gave 1, 2^100 gave 2^36, the CPU 0)."""
    x, y = jnp.broadcast_arrays(x, jnp.asarray(y, x.dtype))
    result = jnp.ones_like(x)
    for _ in range(jnp.iinfo(y.dtype).bits):
        result = jnp.where(y & 1 == 1, result * x, result)
        x, y = x * x, y >> 1
    return result


def _complex_power(x, y):
    """x^y, with the CPU's values at x = 0, where exp(y log x) is nan: 0 if Re(y) > 0, inf + nan j if Re(y) < 0,
    nan otherwise (also for a tensor y = 0; a number 0 gives 1)."""
    real = jnp.real(y)
    at_zero = jnp.where(real > 0, 0, jnp.where(real < 0, complex(jnp.inf, jnp.nan), complex(jnp.nan, jnp.nan)))
    return jnp.where(x == 0, at_zero.astype(x.dtype), jnp.power(x, y))


@lower(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def pow_(x, y):
    exponent_zero = isinstance(y, (int, float, complex)) and y == 0
    (x, y), result = promote(x, y)
    if jnp.issubdtype(x.dtype, jnp.complexfloating) and not exponent_zero:
        return _complex_power(x, y).astype(result)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        return jnp.power(x, y).astype(result)
    # XLA leaves integer powers with negative exponents undefined; PyTorch gives 1/x^n truncated to an integer
    reciprocal = jnp.where(x == 1, 1, jnp.where(x == -1, 1 - 2 * (y % 2), 0)).astype(x.dtype)
    return jnp.where(y < 0, reciprocal, _integer_power(x, jnp.maximum(y, 0))).astype(result)


def _bool_power_meta(op):
    """PyTorch's meta kernels promote a bool exponent as an integer (a bool tensor to the power True is int64 by
    them, and its in-place power refused); the CPU's result type is bool."""
    def meta(x, exponent, **kwargs):
        if not (x.dtype == torch.bool and type(exponent) is bool):
            return op(x, exponent, **kwargs)
        if op is aten.pow_.Scalar:
            return x
        if "out" in kwargs:
            return torch._refs._maybe_resize_out(kwargs["out"], x.shape)
        return torch.empty_like(x)
    return meta


for _op in (aten.pow.Tensor_Scalar, aten.pow_.Scalar, aten.pow.Tensor_Scalar_out):
    META[_op] = _bool_power_meta(_op)


@lower(aten.clamp.default, aten.clamp.Tensor)
def clamp(x, min=None, max=None):
    (x, lo, hi), result = promote(x, min, max)
    out = x
    if min is not None:
        out = jnp.maximum(out, lo)
    if max is not None:
        out = jnp.minimum(out, hi)
    return out.astype(result)


@lower(aten.clamp_min)
def clamp_min(x, min):
    return clamp(x, min=min)


@lower(aten.clamp_max)
def clamp_max(x, max):
    return clamp(x, max=max)


@lower(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(condition, x, y):
    (x, y), result = promote(x, y)
    return jnp.where(condition, x, y).astype(result)


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x, mask, value):
    return jnp.where(mask, cast(value, x.dtype), x)


@lower(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(start, end, weight):
    """PyTorch's formula, from the nearer end: lerp(-inf, 1, 0.9) is -inf (quantile's interpolation), not nan."""
    (start, end, weight), result = promote(start, end, weight)
    small = jnp.abs(weight) < 0.5
    return jnp.where(small, start + weight * (end - start), end - (end - start) * (1 - weight)).astype(result)


def _lerp_inplace_meta(overload):
    """PyTorch's meta kernel of lerp_ calls the `lerp` overload packet, whose matching formats each argument an
    overload rejects: inside forward-mode AD (jvp of quantile) formatting a tensor fails. The overload itself."""
    def meta(x, end, weight):
        check_inplace_broadcast(x.shape, overload(x, end, weight).shape)
        return x
    return meta


META[aten.lerp_.Scalar] = _lerp_inplace_meta(aten.lerp.Scalar)
META[aten.lerp_.Tensor] = _lerp_inplace_meta(aten.lerp.Tensor)


@lower(aten.addcmul)
def addcmul(x, a, b, *, value=1):
    (x, a, b), result = promote(x, a, b)
    return (x + cast(value, x.dtype) * a * b).astype(result)


@lower(aten.addcdiv)
def addcdiv(x, a, b, *, value=1):
    (x, a, b), result = promote(x, a, b)
    return (x + true_divide(cast(value, x.dtype) * a, b)).astype(result)


@lower(aten.nan_to_num)
def nan_to_num(x, nan=0.0, posinf=None, neginf=None):
    if _is_integral(x):
        return x
    info = jnp.finfo(x.dtype)
    return jnp.nan_to_num(x, nan=nan, posinf=info.max if posinf is None else posinf, neginf=info.min if neginf is None else neginf)


# --- activations -----------------------------------------------------------------


def _gelu(x, approximate="none"):
    if approximate == "tanh":
        return jax.nn.gelu(x, approximate=True)
    # PyTorch's CPU and CUDA kernels' formula. jax.nn.gelu's, x * erfc(-x / sqrt 2) / 2, is more exact far into
    # the negative tail (where PyTorch gives -0), and took 2.4x as long on XLA:CPU (0.60 against 0.25 ms for 1M floats)
    return 0.5 * x * (1 + lax.erf(x * 0.7071067811865476))


lower(aten.gelu)(lambda x, *, approximate="none": elementwise(lambda v: _gelu(v, approximate), INT_TO_FLOAT)(x))
lower(aten.silu)(elementwise(jax.nn.silu, INT_TO_FLOAT))
lower(aten.mish)(elementwise(lambda x: x * jnp.tanh(jax.nn.softplus(x)), INT_TO_FLOAT))
# the CPU's and CUDA's formulas, clip(x + 3, 0, 6) / 6: x / 6 + 0.5 rounds differently (hardsigmoid(-1) was 1 ulp off)
lower(aten.hardsigmoid)(elementwise(lambda x: true_divide(jnp.clip(x + 3, 0, 6), 6), DEFAULT))
lower(aten.hardswish)(elementwise(lambda x: true_divide(x * jnp.clip(x + 3, 0, 6), 6), DEFAULT))


@lower(aten.leaky_relu)
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * cast(negative_slope, x.dtype))


@lower(aten.elu)
def elu(x, alpha=1, scale=1, input_scale=1):
    (v,), result = promote(x)
    neg = cast(alpha, v.dtype) * jnp.expm1(v * cast(input_scale, v.dtype))
    return (cast(scale, v.dtype) * jnp.where(v > 0, v, neg)).astype(result)


@lower(aten.hardtanh)
def hardtanh(x, min_val=-1, max_val=1):
    return jnp.clip(x, cast(min_val, x.dtype), cast(max_val, x.dtype))


@lower(aten.softplus)
def softplus(x, beta=1, threshold=20):
    (v,), result = promote(x)
    scaled = v * cast(beta, v.dtype)
    return jnp.where(scaled > threshold, v, jnp.log1p(jnp.exp(scaled)) / cast(beta, v.dtype)).astype(result)


@lower(aten.threshold)
def threshold(x, threshold, value):
    return jnp.where(x <= threshold, cast(value, x.dtype), x)


# --- backward formulas -----------------------------------------------------------


@lower(aten.threshold_backward)
def threshold_backward(grad, x, threshold):
    return jnp.where(x <= threshold, jnp.zeros_like(grad), grad)


@lower(aten.sigmoid_backward)
def sigmoid_backward(grad, y):
    (grad, y), result = promote(grad, y)
    return (grad * y * (1 - y)).astype(result)


@lower(aten.tanh_backward)
def tanh_backward(grad, y):
    (grad, y), result = promote(grad, y)
    return (grad * (1 - y * y)).astype(result)


@lower(aten.gelu_backward)
def gelu_backward(grad, x, *, approximate="none"):
    (grad, x), result = promote(grad, x)
    _, vjp = jax.vjp(lambda v: _gelu(v, approximate), x)
    return vjp(grad)[0].astype(result)


@lower(aten.silu_backward)
def silu_backward(grad, x):
    (grad, x), result = promote(grad, x)
    s = jax.nn.sigmoid(x)
    return (grad * s * (1 + x * (1 - s))).astype(result)


@lower(aten.leaky_relu_backward)
def leaky_relu_backward(grad, x, negative_slope, self_is_result):
    return jnp.where(x > 0, grad, grad * cast(negative_slope, grad.dtype))


@lower(aten.hardtanh_backward)
def hardtanh_backward(grad, x, min_val, max_val):
    return jnp.where((x <= min_val) | (x >= max_val), jnp.zeros_like(grad), grad)


# --- copies and casts ------------------------------------------------------------


@lower(aten.clone)
def clone(x, *, memory_format=None):
    return x


@lower(aten.copy)
def copy(x, src, non_blocking=False):
    return jnp.broadcast_to(convert(src, x.dtype), x.shape)


@lower(aten._to_copy)
def to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    from ..runtime.dtypes import to_jax

    return x if dtype is None else convert(x, to_jax(dtype))


@lower(prims.convert_element_type)
def convert_element_type(x, dtype):
    from ..runtime.dtypes import to_jax

    return convert(x, to_jax(dtype))


@lower(aten.fill.Scalar, aten.fill.Tensor)
def fill(x, value):
    if type(value) is int and jnp.issubdtype(x.dtype, jnp.unsignedinteger):
        value %= 1 << (8 * x.dtype.itemsize)  # a negative integer wraps, as the CPU's two's complement does
    return jnp.full(x.shape, cast(value, x.dtype))


@lower(aten.zero)
def zero(x):
    return jnp.zeros_like(x)


@lower(aten.lift_fresh_copy)
def lift_fresh_copy(x):
    return x



# --- bit patterns ------------------------------------------------------------------


@lower(aten.hash_tensor)
def hash_tensor(x, dim=(), *, keepdim=False, mode=0):
    # mode 0, the only one: xor of the elements widened to 64 bits and read as uint64
    wide = x.astype(jnp.float64 if jnp.issubdtype(x.dtype, jnp.floating) else jnp.int64)
    bits = lax.bitcast_convert_type(wide, jnp.uint64)
    axes = tuple(sorted({d % x.ndim for d in dim})) if dim and x.ndim else tuple(range(x.ndim))
    out = lax.reduce(bits, jnp.uint64(0), lax.bitwise_xor, axes)
    return jnp.expand_dims(out, axes) if keepdim else out
