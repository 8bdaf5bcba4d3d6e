"""Special functions: Bessel and Airy functions, the gamma and zeta family, orthogonal polynomials.

JAX's library serves where it has the function. Elsewhere the lowerings evaluate the mathematical
definitions (power series near the origin, asymptotic expansions or integral representations away
from it), which agree with PyTorch's Cephes-based CPU kernels well within the conformance
tolerances. Edge cases (poles, negative degrees, nan and inf) follow the CPU kernels
(ATen/native/Math.h).
"""
import math

import jax.numpy as jnp
import jax.scipy.special as jsp
import torch
from jax import lax

from .promotion import INT_TO_FLOAT, elementwise, promote
from .registry import META, checked_meta, lower

aten = torch.ops.aten
prims = torch.ops.prims

_EULER_GAMMA = 0.5772156649015329


def _float_op(*ops):
    """Register `fn` of floating arrays as the lowering of `ops`, integer inputs promoted to float."""

    def register(fn):
        lower(*ops)(elementwise(fn, INT_TO_FLOAT))
        return fn

    return register


for _ops, _fn in [
    ((prims.bessel_i0, aten.special_modified_bessel_i0), jsp.i0),
    ((prims.bessel_i0e,), jsp.i0e),
    ((prims.bessel_i1, aten.special_modified_bessel_i1), jsp.i1),
    ((prims.bessel_i1e,), jsp.i1e),
    ((prims.ndtri,), jsp.ndtri),
]:
    _float_op(*_ops)(_fn)


_ERFCX_SERIES_TERMS = 14


@_float_op(prims.erfcx)
def erfcx(x):
    """JAX computes exp(x^2) erfc(x) until erfc underflows, and XLA:CPU flushes erfc's subnormal values to zero:
    erfcx was 0 for x in [9.19, 9.42] in float32 and [26.54, 26.64] in float64. From a point where erfc is still
    normal on, the asymptotic series sum (-1)^k (2k-1)!! / (2x^2)^k / (x sqrt(pi))."""
    start = 9.0 if x.dtype == jnp.float32 else 26.0
    large = jnp.maximum(x, start)
    step = 1 / (2 * large * large)
    term = total = jnp.ones_like(large)
    for k in range(1, _ERFCX_SERIES_TERMS + 1):
        term = -term * (2 * k - 1) * step
        total = total + term
    return jnp.where(x >= start, total / (math.sqrt(math.pi) * large), jsp.erfcx(x))


@_float_op(aten.special_log_ndtr)
def log_ndtr(x):
    """The CPU's formula. JAX's takes log(ndtr(x)) up to x = 5 in float32, where ndtr(x) rounds to 1 - 2^-22:
    log_ndtr(5) was 4% off."""
    t = x * (1 / math.sqrt(2))
    low = x < -1
    below = jnp.log(erfcx(-jnp.where(low, t, -1)) / 2) - t * t
    return jnp.where(low, below, jnp.log1p(-jsp.erfc(t) / 2))


# Temme's uniform expansion (DLMF 8.12): Q(a, x) = erfc(eta sqrt(a/2)) / 2 + R, with lambda = x / a,
# eta = sign(lambda - 1) sqrt(2 (lambda - 1 - log lambda)),
# R = exp(-a eta^2 / 2) / sqrt(2 pi a) (C0(eta) + C1(eta) / a).
# Near eta = 0 the closed forms of C0 and C1 cancel, and their Taylor series serve.
_TEMME_C0 = [-1 / 3, 1 / 12, -2 / 135, 1 / 864, 1 / 2835, -139 / 777600]
_TEMME_C1 = [-1 / 540, -1 / 288, 1 / 378, -139 / 51840]
# from here on lax.igamma falls behind (float32: 1e-4 off at a = 1e3, 8% at 1e5, 0.5 at 1e7; float64: 0.675 for
# P(1e14, 1e14), and no end for a >= 1e16), and C2 / a^2 is below the dtype's precision
_TEMME_FROM = {jnp.dtype(jnp.float32): 20.0, jnp.dtype(jnp.float64): 1e5}
_TEMME_SERIES_BELOW = {jnp.dtype(jnp.float32): 0.3, jnp.dtype(jnp.float64): 1e-3}


def _polynomial_value(coefficients, z):
    total = jnp.zeros_like(z)
    for c in reversed(coefficients):
        total = total * z + c
    return total


def _temme(a, x):
    """(P, Q) of large a by Temme's expansion, which the CPU also takes for large a near the transition."""
    d = (x - a) / a
    near = jnp.abs(d) < 0.1
    near_d = jnp.where(near, d, 0)
    half_eta_squared = jnp.where(near, sum((-near_d) ** k / k for k in range(2, 14)), d - jnp.log1p(d))
    eta = jnp.sign(d) * jnp.sqrt(2 * half_eta_squared)
    series = jnp.abs(eta) < _TEMME_SERIES_BELOW[eta.dtype]
    safe_d, safe_eta = jnp.where(series, 1, d), jnp.where(series, 1, eta)
    c0 = jnp.where(series, _polynomial_value(_TEMME_C0, eta), 1 / safe_d - 1 / safe_eta)
    c1 = jnp.where(series, _polynomial_value(_TEMME_C1, eta),
                   1 / safe_eta**3 - 1 / safe_d**3 - 1 / safe_d**2 - 1 / (12 * safe_d))
    r = jnp.exp(-a * half_eta_squared) / jnp.sqrt(2 * jnp.pi * a) * (c0 + c1 / a)
    root = eta * jnp.sqrt(a / 2)
    return jsp.erfc(-root) / 2 - r, jsp.erfc(root) / 2 + r


def _small_x_series(a, x):
    """(P, Q) where the CPU takes DLMF 8.7.3 for Q, x <= 1.1 and a small against it: with S = sum over n >= 1 of
    (-x)^n / (n! (a + n)) and F = x^a / Gamma(a + 1), P = F (1 + a S) and Q = -expm1(a log x - lgamma(1 + a)) - F a S
    (1 - F without cancellation). lax computes Q as 1 - P there (0 for a below 1e-6 in float32, where the CPU's is
    about a), and its factor x^a e^-x / Gamma(a) of P flushes to zero for a near the smallest normal float (P was
    0, not 1)."""
    log_front = a * jnp.log(x) - _lgamma_one_plus(a)
    term, total = jnp.ones_like(x), jnp.zeros_like(x)
    for n in range(1, 21):  # x^n / n! below 1e-17 by n = 20 for x <= 1.1
        term = term * -x / n
        total = total + term / (a + n)
    front = jnp.exp(log_front)
    return front * (1 + a * total), -jnp.expm1(log_front) - front * a * total


def _in_small_x_series(a, x):
    """Where the CPU kernel computes Q by the series of `_small_x_series`."""
    return (a > 0) & (x > 0) & (((x <= 0.5) & (-0.4 / jnp.log(x) >= a)) | ((x > 0.5) & (x <= 1.1) & (x * 1.1 >= a)))


def _incomplete_gamma(regularized, lower: bool):
    """lax's regularized incomplete gamma function inside the CPU kernel's boundaries (SciPy's), tested in its
    order, so that nan meets them as it does there: a or x below 0 is nan; a = 0 gives the whole integral for
    x > 0; x = 0 the empty one; infinite a the empty one (nan for infinite x); infinite x the whole one."""
    empty, whole = (0.0, 1.0) if lower else (1.0, 0.0)

    def fn(a, x):
        # each side gets harmless arguments where the other's result is taken: lax.igamma does not end for a >= 1e16
        start = _TEMME_FROM[a.dtype]
        large = a >= start
        expanded = _temme(jnp.where(large, a, start), jnp.where(large, x, start))[0 if lower else 1]
        value = jnp.where(large, expanded, regularized(jnp.where(large, 1, a), jnp.where(large, 1, x)))
        small = _in_small_x_series(a, x)
        value = jnp.where(small, _small_x_series(jnp.where(small, a, 0.5), jnp.where(small, x, 0.5))[0 if lower else 1],
                          value)
        value = jnp.where(jnp.isinf(x), whole, value)
        value = jnp.where(jnp.isinf(a), jnp.where(jnp.isinf(x), jnp.nan, empty), value)
        value = jnp.where(x == 0, empty, value)
        value = jnp.where(a == 0, jnp.where(x > 0, whole, jnp.nan), value)
        # clipped: for tiny a lax.igammac, computed as 1 - igamma, fell below 0
        return jnp.where((x < 0) | (a < 0), jnp.nan, jnp.clip(value, 0, 1)).astype(value.dtype)

    return fn


_float_op(prims.igamma)(_incomplete_gamma(lax.igamma, lower=True))
_float_op(prims.igammac)(_incomplete_gamma(lax.igammac, lower=False))


@lower(prims.frexp)
def frexp(x):
    return jnp.frexp(x)


@_float_op(prims.spherical_bessel_j0)
def spherical_bessel_j0(x):
    safe = jnp.where(x == 0, jnp.ones_like(x), x)
    return jnp.where(jnp.isinf(x), 0, jnp.where(x == 0, 1, jnp.sin(safe) / safe)).astype(x.dtype)


# --- zeta and polygamma ---------------------------------------------------------------

_ZETA_SHIFT = 9.0  # JAX's Hurwitz zeta is accurate from here on; smaller q are summed term by term


def _hurwitz_zeta(s, q):
    """zeta(s, q) = sum over k >= 0 of (q + k)^-s, also for negative non-integer q with integer s."""
    start = jnp.broadcast_to(q, jnp.broadcast_shapes(s.shape, q.shape))
    s = jnp.broadcast_to(s, start.shape)
    # the CPU kernel's order: the pole at s = 1, s < 1, poles at integer q <= 0, then non-integer s for q <= 0;
    # those are not summed (q = -2^31 would take 2^31 steps)
    pole = (start <= 0) & (start == jnp.floor(start))
    undefined = (start <= 0) & (s != jnp.floor(s))
    decided = jnp.where(pole, jnp.inf, jnp.where(undefined, jnp.nan, 0))
    decided = jnp.where(s == 1, jnp.inf, jnp.where(s < 1, jnp.nan, decided))
    summed = ~(s <= 1) & ~pole & ~undefined

    def pending(a):
        return (a < _ZETA_SHIFT) & jnp.isfinite(a) & summed

    def body(state):
        total, a = state
        step = pending(a)
        return total + jnp.where(step, jnp.power(a, -s), 0), jnp.where(step, a + 1, a)

    total, shifted = lax.while_loop(lambda state: jnp.any(pending(state[1])), body, (jnp.zeros_like(start), start))
    tail_start = jnp.maximum(shifted, _ZETA_SHIFT)
    # where s is so large that the tail's terms are all 0, JAX's zeta is nan; the CPU's is 0 unless q is infinite
    # or its Euler-Maclaurin product of 23 factors near s overflows a double (s beyond 2.5e13), and no summed term
    # (q <= 1) is non-zero
    vanishing = (jnp.power(tail_start, -s) == 0) & jnp.isfinite(tail_start)
    tail = jnp.where(vanishing & ((total != 0) | (s < 2.5e13)), 0, jsp.zeta(s, tail_start))
    return jnp.where(summed, total + tail, decided).astype(total.dtype)


_float_op(prims.zeta, aten.special_zeta)(_hurwitz_zeta)


def _zeta_minus_one(k: int) -> float:
    """zeta(k) - 1 for an integer k >= 2: fifty terms and the Euler-Maclaurin remainder, to double precision."""
    n = 50
    head = sum(m**-k for m in range(2, n + 1))
    remainder = n ** (1 - k) / (k - 1) - n**-k / 2 + k * n ** (-k - 1) / 12
    remainder -= k * (k + 1) * (k + 2) * n ** (-k - 3) / 720
    return head + remainder


# Taylor coefficients of lgamma(1 + z) and lgamma(2 + z) from z^1 on: -gamma z + sum (-1)^k zeta(k) / k z^k, and
# (1 - gamma) z + sum (-1)^k (zeta(k) - 1) / k z^k
_LGAMMA_NEAR_1 = [-_EULER_GAMMA] + [(-1) ** k * (_zeta_minus_one(k) + 1) / k for k in range(2, 17)]
_LGAMMA_NEAR_2 = [1 - _EULER_GAMMA] + [(-1) ** k * _zeta_minus_one(k) / k for k in range(2, 23)]


def _series(coefficients, z):
    """sum of c_k z^k from k = 1, +0 at z = 0 (as lgamma(1) is)"""
    return jnp.where(z == 0, 0, z * _polynomial_value(coefficients, z))


def _lgamma_one_plus(z):
    """lgamma(1 + z), accurate for small z, which 1 + z would round away."""
    near = jnp.abs(z) < 0.1
    return jnp.where(near, _series(_LGAMMA_NEAR_1, jnp.where(near, z, 0)), lgamma(1 + z))


@_float_op(aten.lgamma)
def lgamma(x):
    """In float32, XLA's lgamma loses its relative accuracy near its zeros at 1 and 2 (lgamma(1) was 4.8e-7,
    lgamma(1.999) 0.3% off): there the Taylor series around 1 and 2 take over, as accurate as the CPU's."""
    value = jsp.gammaln(x)
    if x.dtype != jnp.float32:
        return value
    near_1 = (x > 0.75) & (x < 1.25)
    near_2 = (x >= 1.25) & (x < 2.75)
    value = jnp.where(near_2, _series(_LGAMMA_NEAR_2, jnp.where(near_2, x - 2, 0)), value)
    return jnp.where(near_1, _series(_LGAMMA_NEAR_1, jnp.where(near_1, x - 1, 0)), value)


@_float_op(aten.digamma)
def digamma(x):
    # the pole at zero keeps the sign of the zero: digamma(+-0) = -+inf
    return jnp.where(x == 0, jnp.copysign(jnp.inf, -x), jsp.digamma(x)).astype(x.dtype)


def _trigamma_limits(x, value):
    """PyTorch's trigamma is its own kernel: 0 at +inf, nan at -inf (not zeta's pole)."""
    return jnp.where(x == jnp.inf, 0, jnp.where(x == -jnp.inf, jnp.nan, value)).astype(x.dtype)


@lower(aten.polygamma, aten.special_polygamma)
def polygamma(n, x):
    if not isinstance(n, int):  # the in-place polygamma_(self, n) passes its arguments the other way round
        n, x = x, n
    (x,), result = promote(x, kind=INT_TO_FLOAT)
    if n == 0:
        return digamma(x).astype(result)
    scale = (1 if n % 2 else -1) * math.factorial(n)
    value = scale * _hurwitz_zeta(jnp.full_like(x, n + 1), x)
    return (_trigamma_limits(x, value) if n == 1 else value).astype(result)


# --- Bessel functions of the first and second kind ----------------------------------------

_SERIES_TERMS = 24
_HANKEL_TERMS = 14
_SERIES_LIMIT = 8.0  # |x| up to which the power series beats the asymptotic expansion in float32


def _harmonic(k):
    return sum(1.0 / j for j in range(1, k + 1))


def _digamma_pair(k):
    """digamma(k + 1) + digamma(k + 2), the weights of the order-1 series of Y_1 and K_1."""
    return _harmonic(k) + _harmonic(k + 1) - 2 * _EULER_GAMMA


def _bessel_series(x, nu, alternating, weight=lambda k: 1.0):
    """sum over k of weight(k) (+-1)^k (x/2)^(2k+nu) / (k! (k+nu)!): J_nu (alternating) or I_nu."""
    half = x / 2
    z = -half * half if alternating else half * half
    term = half**nu / math.factorial(nu)
    total = weight(0) * term
    for k in range(1, _SERIES_TERMS):
        term = term * z / (k * (k + nu))
        total = total + weight(k) * term
    return total


def _hankel(x, nu):
    """J_nu and Y_nu for large x from Hankel's asymptotic expansion (DLMF 10.17.3-4)."""
    mu = 4 * nu * nu
    p = q = 0
    coefficient = 1.0
    for k in range(_HANKEL_TERMS):
        term = coefficient / x**k
        if k % 2 == 0:
            p = p + (-1) ** (k // 2) * term
        else:
            q = q + (-1) ** (k // 2) * term
        coefficient *= (mu - (2 * k + 1) ** 2) / ((k + 1) * 8)
    chi = x - (nu / 2 + 0.25) * math.pi
    scale = jnp.sqrt(2 / (math.pi * x))
    return scale * (p * jnp.cos(chi) - q * jnp.sin(chi)), scale * (p * jnp.sin(chi) + q * jnp.cos(chi))


def _split(x, limit):
    """x where |x| <= limit (else a harmless substitute), and x where |x| > limit: each branch of a
    piecewise function sees only arguments in its own range, so neither produces inf or nan."""
    small = jnp.abs(x) <= limit
    return small, jnp.where(small, x, 0), jnp.where(small, limit + 1, jnp.abs(x))


@_float_op(prims.bessel_j0)
def bessel_j0(x):
    small, near, far = _split(x, _SERIES_LIMIT)
    return jnp.where(small, _bessel_series(near, 0, True), _hankel(far, 0)[0])


@_float_op(prims.bessel_j1)
def bessel_j1(x):
    small, near, far = _split(x, _SERIES_LIMIT)
    return jnp.where(small, _bessel_series(near, 1, True), jnp.sign(x) * _hankel(far, 1)[0])


def _positive_only(x, value, at_zero):
    """PyTorch's convention for functions defined on x > 0: nan below, `at_zero` at zero."""
    return jnp.where(x < 0, jnp.nan, jnp.where(x == 0, at_zero, value)).astype(x.dtype)


@_float_op(aten.special_bessel_y0)
def bessel_y0(x):
    small, near, far = _split(x, _SERIES_LIMIT)
    near = jnp.where(near > 0, near, 1)
    series = (2 / math.pi) * (
        (jnp.log(near / 2) + _EULER_GAMMA) * _bessel_series(near, 0, True) - _bessel_series(near, 0, True, _harmonic)
    )
    return _positive_only(x, jnp.where(small, series, _hankel(far, 0)[1]), -jnp.inf)


@_float_op(aten.special_bessel_y1)
def bessel_y1(x):
    small, near, far = _split(x, _SERIES_LIMIT)
    near = jnp.where(near > 0, near, 1)
    series = (
        -2 / (math.pi * near)
        + (2 / math.pi) * jnp.log(near / 2) * _bessel_series(near, 1, True)
        - _bessel_series(near, 1, True, _digamma_pair) / math.pi
    )
    return _positive_only(x, jnp.where(small, series, _hankel(far, 1)[1]), -jnp.inf)


# --- modified Bessel functions of the second kind and the Airy function ------------------

_K_SERIES_LIMIT = 2.0
# nodes of the trapezoidal rule for e^x K_nu(x) = int_0^inf exp(-x (cosh t - 1)) cosh(nu t) dt,
# in u = sqrt(x) t, where the integrand is close to exp(-u^2 / 2) for every x above ~1.5
_K_STEP = 0.4
_K_NODES = [i * _K_STEP for i in range(20)]


def _scaled_k_integral(x, nu):
    """e^x K_nu(x) for x >= ~1.5 (the trapezoidal rule converges exponentially on this integrand)."""
    root = jnp.sqrt(x)[..., None]
    u = jnp.asarray(_K_NODES, x.dtype)
    t = u / root
    integrand = jnp.exp(-2 * x[..., None] * jnp.sinh(t / 2) ** 2) * jnp.cosh(nu * t) / root
    weights = jnp.asarray([0.5] + [1.0] * (len(_K_NODES) - 1), x.dtype)
    return _K_STEP * jnp.sum(integrand * weights, axis=-1)


def _k_series(x, order):
    """K_0, K_1 near the origin (DLMF 10.31.1)."""
    log_half = jnp.log(x / 2)
    if order == 0:
        return -(log_half + _EULER_GAMMA) * _bessel_series(x, 0, False) + _bessel_series(x, 0, False, _harmonic)
    return 1 / x + log_half * _bessel_series(x, 1, False) - _bessel_series(x, 1, False, _digamma_pair) / 2


def _modified_k(x, order, scaled):
    small = x <= _K_SERIES_LIMIT
    near = jnp.where(small & (x > 0), x, 1)
    far = jnp.where(small | (x == jnp.inf), _K_SERIES_LIMIT + 1, x)
    series = _k_series(near, order) * (jnp.exp(near) if scaled else 1)
    integral = _scaled_k_integral(far, order) * (1 if scaled else jnp.exp(-far))
    value = jnp.where(small, series, jnp.where(x == jnp.inf, 0, integral))
    return _positive_only(x, value, jnp.inf)


for _order, _scaled, _op in [
    (0, False, aten.special_modified_bessel_k0),
    (1, False, aten.special_modified_bessel_k1),
    (0, True, aten.special_scaled_modified_bessel_k0),
    (1, True, aten.special_scaled_modified_bessel_k1),
]:
    _float_op(_op)(lambda x, order=_order, scaled=_scaled: _modified_k(x, order, scaled))

_AIRY_AI_0 = 0.355028053887817239  # Ai(0)
_AIRY_AIP_0 = 0.258819403792806798  # -Ai'(0)
_AIRY_SERIES_RANGE = (-4.0, 2.0)
_AIRY_SERIES_TERMS = 16
_AIRY_ASYMPTOTIC_TERMS = 12


def _airy_maclaurin(x):
    """Ai(x) near the origin: Ai(0) f(x) + Ai'(0) g(x), the two power series of Airy's equation."""
    cube = x * x * x
    f_term, g_term = jnp.ones_like(x), x
    f, g = f_term, g_term
    for k in range(_AIRY_SERIES_TERMS):
        f_term = f_term * cube / ((3 * k + 2) * (3 * k + 3))
        g_term = g_term * cube / ((3 * k + 3) * (3 * k + 4))
        f, g = f + f_term, g + g_term
    return _AIRY_AI_0 * f - _AIRY_AIP_0 * g


# (c, Ai(c), Ai'(c)) from mpmath at 30 digits: Taylor series around them cover [-12, -4], where the asymptotic form
# is short of float64's precision (6e-7 off at -4, 3e-12 at -9) and the Maclaurin series loses it to cancellation
_AIRY_CENTRES = [
    (-4.5, 0.29215278105595946688, -0.52336253231574770071),
    (-5.5, 0.017781541276574975603, 0.86419721777139839077),
    (-6.5, -0.23802030199711580359, -0.674952492513202173),
    (-7.5, 0.32177571638064787527, 0.31880950669855459621),
    (-8.5, -0.33029023763020887902, -0.032313348284639135873),
    (-9.5, 0.31910324771912820138, -0.108095318811871239),
    (-10.5, -0.31192603505105060085, 0.090957487390681672879),
    (-11.5, 0.3054229700435926564, 0.087724154321784443054),
]
_AIRY_TAYLOR_TERMS = 24


def _airy_taylor(x):
    """Ai(x) for x in [-12, -4]: the Taylor series around the nearest centre, whose coefficients follow from
    Airy's equation Ai'' = x Ai: (n + 2)(n + 1) a_{n+2} = c a_n + a_{n-1}."""
    index = jnp.clip(jnp.floor(-x - 4), 0, len(_AIRY_CENTRES) - 1).astype(jnp.int32)
    c, value, slope = (jnp.asarray([row[i] for row in _AIRY_CENTRES], x.dtype)[index] for i in range(3))
    h = x - c
    previous, current, following = jnp.zeros_like(x), value, slope  # a_{n-1}, a_n, a_{n+1} from n = 0
    total, power = value + slope * h, h
    for n in range(_AIRY_TAYLOR_TERMS):
        previous, current, following = current, following, (c * current + previous) / ((n + 2) * (n + 1))
        power = power * h
        total = total + following * power
    return total


def _airy_oscillating(z):
    """Ai(-z) for large z > 0 (DLMF 9.7.9)."""
    zeta = 2 / 3 * z**1.5
    p = q = 0
    for k in range(_AIRY_ASYMPTOTIC_TERMS):
        u = math.exp(math.lgamma(3 * k + 0.5) - k * math.log(54) - math.lgamma(k + 1) - math.lgamma(k + 0.5))
        term = (-1) ** (k // 2) * u / zeta**k
        if k % 2 == 0:
            p = p + term
        else:
            q = q + term
    phase = zeta + math.pi / 4
    return (jnp.sin(phase) * p - jnp.cos(phase) * q) / (math.sqrt(math.pi) * z**0.25)


def _airy_decaying(x):
    """Ai(x) for x > 0 away from the origin, from K_1/3 (DLMF 9.6.1)."""
    zeta = 2 / 3 * x**1.5
    return jnp.sqrt(x / 3) / math.pi * jnp.exp(-zeta) * _scaled_k_integral(zeta, 1 / 3)


@_float_op(aten.special_airy_ai)
def airy_ai(x):
    low, high = _AIRY_SERIES_RANGE
    middle = (x >= low) & (x <= high)
    far = x < _AIRY_CENTRES[-1][0] - 0.5
    taylor = (x < low) & ~far
    value = jnp.where(
        middle,
        _airy_maclaurin(jnp.where(middle, x, 0)),
        jnp.where(far, _airy_oscillating(jnp.where(far, -x, 100)), _airy_decaying(jnp.where(x > high, x, high))),
    )
    value = jnp.where(taylor, _airy_taylor(jnp.where(taylor, x, _AIRY_CENTRES[0][0])), value)
    # the CPU kernel's cut-off, beyond which its (and our) decaying form underflows
    value = jnp.where(x > 103.892, 0, value)
    return jnp.where(jnp.isfinite(x), value, jnp.nan)


# --- orthogonal polynomials -------------------------------------------------------------


def _degree(n):
    """PyTorch casts the degree to int64, where x86 turns non-finite and out-of-range degrees into
    INT64_MIN: negative, whose value is 0 (XLA's conversion would saturate to a degree the loop
    below cannot finish)."""
    representable = jnp.isfinite(n) & (jnp.abs(n) < 2.0**63)
    return jnp.where(representable, jnp.trunc(n), -1).astype(jnp.int64)


def _recurrence(x, n, first, step, needed):
    """p_n of p_0 = 1, p_1 = first, p_k = step(k, p_(k-1), p_(k-2)), for n >= 0 where `needed`;
    the loop runs to the largest needed degree, and stops early once every needed value is nan
    (values not needed may stay finite for ever, as |x| < 1 does)."""
    shape = jnp.broadcast_shapes(x.shape, n.shape)
    n = jnp.broadcast_to(n, shape)
    needed = jnp.broadcast_to(needed, shape)
    top = jnp.max(jnp.where(needed, n, 0), initial=0)

    def cond(state):
        k, _, q = state
        return (k <= top) & jnp.any(needed & (k <= n) & ~jnp.isnan(q))

    def body(state):
        k, p, q = state
        active = k <= n
        r = step(k.astype(x.dtype), q, p)
        return k + 1, jnp.where(active, q, p), jnp.where(active, r, q)

    start = (jnp.asarray(2, n.dtype), jnp.ones(shape, x.dtype), jnp.broadcast_to(first, shape).astype(x.dtype))
    _, _, q = lax.while_loop(cond, body, start)
    return jnp.where(n == 0, 1, q).astype(x.dtype)


def _polynomial(fn):
    """Lift fn(x, n) (x float, n an int64 degree) to a lowering: promoted inputs, 0 for n < 0."""

    def lowering(x, n):
        (x, n), result = promote(x, n, kind=INT_TO_FLOAT)
        degree = _degree(n)
        return jnp.where(degree < 0, 0, fn(x, degree)).astype(result)

    return lowering


def _chebyshev_recurrence(x, n, first, needed):
    """|x| = 1 takes the closed form at the ends, which the recurrence would reach only after n steps."""
    return _recurrence(x, n, first, lambda k, q, p: (x + x) * q - p, needed & (jnp.abs(x) != 1))


def _chebyshev_t(x, n, trig_from):
    trig = (n > trig_from) & (jnp.abs(x) < 1)
    ends = jnp.where((x > 0) | (n % 2 == 0), 1, -1)
    value = jnp.where(trig, jnp.cos(n * jnp.arccos(jnp.clip(x, -1, 1))), _chebyshev_recurrence(x, n, x, ~trig))
    return jnp.where(jnp.abs(x) == 1, ends, value)


def _chebyshev_u(x, n, trig_from):
    trig = (n > trig_from) & (jnp.abs(x) < 1)
    theta = jnp.arccos(jnp.clip(x, -1, 1))
    sin_theta = jnp.sin(theta)
    safe_sin = jnp.where(sin_theta == 0, 1, sin_theta)
    closed = jnp.where(
        sin_theta != 0, jnp.sin((n + 1) * theta) / safe_sin, (n + 1) * jnp.cos((n + 1) * theta) / jnp.where(x == 0, 1, x)
    )
    ends = jnp.where((x > 0) | (n % 2 == 0), n + 1, -(n + 1))
    value = jnp.where(trig, closed, _chebyshev_recurrence(x, n, x + x, ~trig))
    return jnp.where(jnp.abs(x) == 1, ends, value)


def _chebyshev_v(x, n, trig_from):
    trig = (n > trig_from) & (jnp.abs(x) < 1)
    theta = jnp.arccos(jnp.clip(x, -1, 1))
    closed = jnp.cos((n + 0.5) * theta) / jnp.cos(theta / 2)
    odd_end = jnp.where(n % 2 == 0, n + n + 1, -(n + n + 1))
    ends = jnp.where(x > 0, 1, odd_end)
    value = jnp.where(trig, closed, _chebyshev_recurrence(x, n, x + x - 1, ~trig))
    return jnp.where(jnp.abs(x) == 1, ends, value)


def _chebyshev_w(x, n, trig_from):
    trig = (n > trig_from) & (jnp.abs(x) < 1)
    theta = jnp.arccos(jnp.clip(x, -1, 1))
    half_sin = jnp.sin(theta / 2)
    closed = jnp.where(half_sin != 0, jnp.sin((n + 0.5) * theta) / jnp.where(half_sin == 0, 1, half_sin), n + n + 1)
    ends = jnp.where(x > 0, n + n + 1, jnp.where(n % 2 == 0, 1, -1))
    value = jnp.where(trig, closed, _chebyshev_recurrence(x, n, x + x + 1, ~trig))
    return jnp.where(jnp.abs(x) == 1, ends, value)


# (function, degree above which |x| < 1 uses the trigonometric form, and the same for the
# shifted polynomial of x, which is the polynomial of 2x - 1)
for _fn, _trig_from, _shifted_trig_from, _op, _shifted_op in [
    (_chebyshev_t, 6, 6, aten.special_chebyshev_polynomial_t, aten.special_shifted_chebyshev_polynomial_t),
    (_chebyshev_u, 8, 6, aten.special_chebyshev_polynomial_u, aten.special_shifted_chebyshev_polynomial_u),
    (_chebyshev_v, 8, 6, aten.special_chebyshev_polynomial_v, aten.special_shifted_chebyshev_polynomial_v),
    (_chebyshev_w, 8, 4, aten.special_chebyshev_polynomial_w, aten.special_shifted_chebyshev_polynomial_w),
]:
    lower(_op)(_polynomial(lambda x, n, fn=_fn, t=_trig_from: fn(x, n, t)))
    lower(_shifted_op)(_polynomial(lambda x, n, fn=_fn, t=_shifted_trig_from: fn(x + x - 1, n, t)))


def _hermite_limit(x):
    return 128 if x.dtype == jnp.float32 else 512


@lower(aten.special_hermite_polynomial_h)
@_polynomial
def hermite_polynomial_h(x, n):
    limit = n <= _hermite_limit(x)
    value = _recurrence(x, n, x + x, lambda k, q, p: (x + x) * q - 2 * (k - 1) * p, limit)
    return jnp.where(limit, value, jnp.nan)


@lower(aten.special_hermite_polynomial_he)
@_polynomial
def hermite_polynomial_he(x, n):
    limit = n <= _hermite_limit(x)
    value = _recurrence(x, n, x, lambda k, q, p: x * q - (k - 1) * p, limit)
    return jnp.where(limit, value, jnp.nan)


@lower(aten.special_laguerre_polynomial_l)
@_polynomial
def laguerre_polynomial_l(x, n):
    value = _recurrence(x, n, 1 - x, lambda k, q, p: ((2 * k - 1 - x) * q - (k - 1) * p) / k, x != 0)
    return jnp.where(x == 0, 1, value)


@lower(aten.special_legendre_polynomial_p)
@_polynomial
def legendre_polynomial_p(x, n):
    value = _recurrence(x, n, x, lambda k, q, p: ((2 * k - 1) * x * q - (k - 1) * p) / k, jnp.abs(x) != 1)
    ends = jnp.where((x > 0) | (n % 2 == 0), 1, -1)
    return jnp.where(jnp.abs(x) == 1, ends, value)


def _check_mvlgamma_order(x, p, **out):
    """The CPU kernel's refusal, which PyTorch's decomposition (and meta kernel) leaves out."""
    if p < 1:
        raise RuntimeError("p has to be greater than or equal to 1")


for _overload in (aten.mvlgamma.default, aten.mvlgamma.out, aten.mvlgamma_.default):
    META[_overload] = checked_meta(_check_mvlgamma_order, _overload)
