"""Accuracy where XLA's approximation of a function fell far behind the CPU's (found by a sweep measuring every
unary and binary ufunc's error in ulps against float64 on the CPU): each test fails on the lowering it replaced."""
import torch


def test_exp2_is_exact_for_integers_and_within_an_ulp():
    """XLA's exp2 computes exp(x * ln 2): 2^100 was 1.2676533e30 (the CPU 1.2676506e30, exact) and 85% of float32
    values differed, up to 33 ulps."""
    x = torch.cat([torch.arange(-126.0, 128.0), torch.randn(10000).clamp(-4, 4) * 30])
    got, expected = torch.exp2(x.to("neuron")).cpu(), torch.exp2(x)
    assert torch.equal(got[:254], expected[:254])
    torch.testing.assert_close(got, expected, atol=0, rtol=2.0**-23)


def test_erfcx_where_erfc_is_subnormal():
    """JAX's exp(x^2) * erfc(x) was 0 where erfc is subnormal (XLA:CPU flushes those to zero): x in [9.19, 9.42] in
    float32, [26.54, 26.64] in float64."""
    for dtype, low, high in ((torch.float32, 8.5, 10.5), (torch.float64, 25.5, 28.5)):
        x = torch.linspace(low, high, 2001, dtype=dtype)
        torch.testing.assert_close(torch.special.erfcx(x.to("neuron")).cpu(), torch.special.erfcx(x))


def test_log_ndtr_of_large_arguments():
    """log(ndtr(x)) rounds ndtr(x) to 1 - 2^-22 at x = 5 in float32: log_ndtr(5) was -2.98e-7, the CPU -2.87e-7;
    the CPU's formula, log1p(-erfc(x / sqrt 2) / 2), keeps it."""
    x = torch.linspace(-30, 12, 4001)
    torch.testing.assert_close(torch.special.log_ndtr(x.to("neuron")).cpu(), torch.special.log_ndtr(x),
                               atol=0, rtol=1e-5)


def test_lgamma_near_its_zeros():
    """XLA's float32 lgamma is accurate to about 1e-6 absolutely, which near its zeros at 1 and 2 is no relative
    accuracy: lgamma(1) was 4.8e-7, lgamma(1.999) 0.3% off."""
    x = torch.cat([torch.linspace(0.8, 1.2, 4001), torch.linspace(1.8, 2.2, 4001), torch.tensor([1.0, 2.0])])
    got, expected = torch.lgamma(x.to("neuron")).cpu(), torch.lgamma(x)
    torch.testing.assert_close(got, expected, atol=0, rtol=1e-6)
    assert not got[-2:].signbit().any()


def test_incomplete_gamma_of_large_a():
    """lax.igamma falls behind for large a in float32 (P(1e5, 1e5) was 0.458, the CPU 0.5004; P(1e7, 1e7) 1.0):
    Temme's uniform expansion takes over, as the CPU's kernel does near the transition."""
    a = torch.tensor([30.0, 50.0, 1e3, 1e5, 1e7, 1e9]).repeat_interleave(7)
    x = a + torch.tensor([-5.0, -2.0, -0.5, 0.0, 0.5, 2.0, 5.0]).repeat(6) * a.sqrt()
    for f in (torch.special.gammainc, torch.special.gammaincc):
        expected = f(a.double(), x.double()).float()
        torch.testing.assert_close(f(a.to("neuron"), x.to("neuron")).cpu(), expected, atol=3e-6, rtol=0)


# (a, x, P, Q) from mpmath at 40 digits
_SMALL_A = [
    (1.1754943508222875e-38, 0.35, 1.0, 9.3359575673266035e-39),
    (1e-20, 0.35, 1.0, 7.942154346208358e-21),
    (1e-06, 0.35, 0.99999920578434203, 7.9421565797037305e-7),
    (0.001, 0.745, 0.99965621467427274, 0.00034378532572726035),
    (0.05, 0.0001, 0.64812693926266901, 0.35187306073733099),
    (0.5, 0.5, 0.6826894921370859, 0.3173105078629141),
    (1.0, 1.05, 0.65006225088884466, 0.34993774911115534),
]


def test_incomplete_gamma_of_small_a():
    """lax computes Q as 1 - P for x <= 1.1, which is 0 for a below about 1e-6 in float32 (Q(1e-6, 0.35) is 7.9e-7),
    and its factor x^a e^-x / Gamma(a) of P flushes to zero for a near the smallest normal float32 (P was 0, not 1).
    The series the CPU takes there (DLMF 8.7.3) serves both, with lgamma(1 + a) by its Taylor series: the CPU's own
    float32 and float64 Q are 73% off for a = 1e-20, as 1 + a rounds to 1 in its lgamma."""
    a, x, p, q = (torch.tensor(column, dtype=torch.float64) for column in zip(*_SMALL_A))
    for dtype, rtol in ((torch.float64, 1e-14), (torch.float32, 2e-6)):
        for f, expected in ((torch.special.gammainc, p), (torch.special.gammaincc, q)):
            got = f(a.to("neuron", dtype), x.to("neuron", dtype)).cpu()
            # Q(1.2e-38, 0.35) is subnormal in float32, which XLA:CPU flushes to zero
            torch.testing.assert_close(got, expected.to(dtype), rtol=rtol, atol=torch.finfo(dtype).tiny)


# (x, Ai(x)) from mpmath at 30 digits
_AIRY_POINTS = [
    (-4.0007, -0.069712024263109708),
    (-4.25, 0.12778292722826728),
    (-5.0, 0.35076100902411432),
    (-6.2, -0.35642107366896142),
    (-7.9, 0.041701883617386709),
    (-9.0, -0.022133721547341404),
    (-10.3, -0.23210801885482975),
    (-11.7, 0.22123780856502757),
]


def test_airy_ai_where_it_starts_to_oscillate():
    """The asymptotic form took over at x = -4, where it is 6e-7 off (3e-12 at -9, float64): Taylor series around
    centres from -4.5 to -11.5 cover [-12, -4]."""
    x, expected = (torch.tensor(column, dtype=torch.float64) for column in zip(*_AIRY_POINTS))
    torch.testing.assert_close(torch.special.airy_ai(x.to("neuron")).cpu(), expected, rtol=1e-13, atol=0)
    torch.testing.assert_close(torch.special.airy_ai(x.float().to("neuron")).cpu(),
                               torch.special.airy_ai(x.float().double()).float(), rtol=1e-6, atol=1e-7)
