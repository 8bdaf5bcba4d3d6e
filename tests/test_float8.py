"""FP8 on neuron: conversions, torch._scaled_mm against the CPU kernel, and dtypes neuron cannot hold."""
import warnings

import pytest
import torch

from torchneuron import compile as neuron_compile
from torchneuron.eager import fallback

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
M, K, N = 16, 32, 24


@pytest.fixture(autouse=True)
def _reference_cpu_kernel():
    """On CPUs with AMX, PyTorch's CPU _scaled_mm takes oneDNN's kernel, which gives NaN where its
    reference kernel saturates float8 results and skips that kernel's argument checks. Neuron follows the
    reference kernel (and CUDA's saturation), which oneDNN disabled gives on every CPU."""
    with torch.backends.mkldnn.flags(enabled=False):
        yield


def _operands(a_dtype=E4M3, b_dtype=E4M3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    a = (torch.randn(M, K, generator=generator) * 4).to(a_dtype)
    b = (torch.randn(N, K, generator=generator) * 4).to(b_dtype).t()  # column-major, as CUDA wants it
    return a, b


def _scales(scaling, seed=1):
    generator = torch.Generator().manual_seed(seed)
    if scaling == "tensorwise":
        return torch.tensor(0.75), torch.tensor(1.5)
    return torch.rand(M, 1, generator=generator) + 0.5, torch.rand(1, N, generator=generator) + 0.5


def _to(device, *tensors):
    return [None if t is None else t.to(device) for t in tensors]


def _close(got, expected):
    """One rounding step of the output dtype apart at most: the CPU and XLA sum the products in another order."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    step = {E4M3: 2.0**-3, E5M2: 2.0**-2, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}.get(got.dtype, 1e-5)
    torch.testing.assert_close(got.cpu().float(), expected.float(), rtol=step, atol=1e-4)


CASES = [
    # (scaling, a dtype, b dtype, out_dtype, bias dtype, scale_result)
    ("tensorwise", E4M3, E4M3, torch.bfloat16, None, None),
    ("tensorwise", E4M3, E4M3, torch.float32, torch.float32, None),
    ("tensorwise", E4M3, E4M3, torch.bfloat16, torch.bfloat16, None),
    ("tensorwise", E4M3, E4M3, torch.float16, None, None),
    ("tensorwise", E5M2, E4M3, torch.float32, None, None),
    ("tensorwise", E4M3, E4M3, None, None, None),
    ("tensorwise", E4M3, E4M3, E4M3, None, 4.0),
    ("tensorwise", E4M3, E4M3, None, None, 0.5),
    ("tensorwise", E5M2, E5M2, E5M2, None, 0.25),
    ("rowwise", E4M3, E4M3, torch.bfloat16, None, None),
    ("rowwise", E4M3, E4M3, torch.float32, torch.float32, None),
    ("rowwise", E4M3, E4M3, torch.bfloat16, torch.bfloat16, None),
]


@pytest.mark.parametrize("scaling, a_dtype, b_dtype, out_dtype, bias_dtype, scale_result", CASES,
                         ids=["-".join(str(v).removeprefix("torch.") for v in case) for case in CASES])
def test_scaled_mm_matches_the_cpu_kernel(scaling, a_dtype, b_dtype, out_dtype, bias_dtype, scale_result):
    a, b = _operands(a_dtype, b_dtype)
    scale_a, scale_b = _scales(scaling)
    bias = None if bias_dtype is None else torch.randn(N).to(bias_dtype)
    result = None if scale_result is None else torch.tensor(scale_result)

    def run(device):
        args = _to(device, a, b, scale_a, scale_b, bias, result)
        return torch._scaled_mm(*args[:4], bias=args[4], scale_result=args[5], out_dtype=out_dtype)

    with fallback.as_error():
        _close(run("neuron"), run("cpu"))


def test_scaled_mm_with_fast_accumulation_and_a_row_major_mat2_computes_the_same():
    """use_fast_accum is a CUDA speed hint; the CPU accepts any layout of mat2, and so does neuron."""
    a, b = _operands()
    scale_a, scale_b = _scales("tensorwise")
    expected = torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    a, b_row_major, scale_a, scale_b = _to("neuron", a, b.contiguous(), scale_a, scale_b)
    with fallback.as_error():
        _close(torch._scaled_mm(a, b_row_major, scale_a, scale_b, out_dtype=torch.float32, use_fast_accum=True),
               expected)


@pytest.mark.parametrize("out", ["empty", "wrong-shape", "wrong-dtype"])
def test_scaled_mm_out_behaves_as_on_the_cpu(out):
    a, b = _operands()
    scale_a, scale_b = _scales("tensorwise")
    make = {"empty": lambda d: torch.empty(0, dtype=torch.bfloat16, device=d),
            "wrong-shape": lambda d: torch.empty(3, 3, dtype=torch.bfloat16, device=d),
            "wrong-dtype": lambda d: torch.empty(M, N, dtype=torch.float32, device=d)}[out]
    results = []
    for device in ("cpu", "neuron"):
        target = make(device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                returned = torch._scaled_mm(*_to(device, a, b, scale_a, scale_b), out_dtype=torch.bfloat16, out=target)
                assert returned is target
                results.append((target.cpu(), [str(w.message)[:40] for w in caught]))
            except ValueError as error:
                results.append(str(error))
    (on_cpu, on_neuron) = results
    if isinstance(on_cpu, str):
        assert on_neuron == on_cpu
    else:
        _close(on_neuron[0], on_cpu[0])
        assert on_neuron[1] == on_cpu[1]  # the resize warning


def test_scaled_mm_saturates_float8_results_as_the_cpu_does():
    big = torch.full((M, K), 448.0).to(E4M3)
    b = torch.full((N, K), 448.0).to(E4M3).t()
    one = torch.tensor(1.0)
    for out_dtype in (E4M3, E5M2):  # e4m3fn saturates at 448, e5m2 overflows to inf
        expected = torch._scaled_mm(big, b, one, one, out_dtype=out_dtype)
        got = torch._scaled_mm(*_to("neuron", big, b, one, one), out_dtype=out_dtype)
        assert torch.equal(got.cpu().float(), expected.float())


@pytest.mark.parametrize("mode", ["compiled", "adaptive"])
def test_scaled_mm_in_compiled_and_adaptive_modes(mode):
    a, b = _operands()
    scale_a, scale_b = _scales("rowwise")
    bias = torch.randn(N).bfloat16()

    def f(a, b, scale_a, scale_b, bias):
        return torch._scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=torch.bfloat16).relu()

    expected = f(a, b, scale_a, scale_b, bias)
    neuron_compile.reset()
    with fallback.as_error():
        if mode == "compiled":
            got = torch.compile(f, backend="neuron", fullgraph=True)(*_to("neuron", a, b, scale_a, scale_b, bias))
            assert neuron_compile.report()["eager_ops"] == {}
        else:
            with torch.neuron.adaptive_eager():
                got = f(*_to("neuron", a, b, scale_a, scale_b, bias))
    _close(got, expected)


def _bad_calls():
    """Each case's arguments on a device (strided views are made there: a transfer makes them contiguous)."""
    a, b = _operands()
    one = torch.tensor(1.0)
    rows, cols = _scales("rowwise")
    return {
        "float-operand": lambda d: _to(d, a.float(), b, one, one),
        "half-scales": lambda d: _to(d, a, b, one.half(), one.half()),
        "scale-of-two": lambda d: _to(d, a, b, torch.ones(2), one),
        "scales-swapped": lambda d: _to(d, a, b, cols, rows),
        "row-scale-not-contiguous-in-dim-1": lambda d: [*_to(d, a, b), torch.rand(1, M, device=d).t(), cols.to(d)],
        "col-scale-not-contiguous": lambda d: [*_to(d, a, b, rows), torch.rand(N, 2, device=d)[:, :1].t()],
        "vector": lambda d: _to(d, a[0], b, one, one),
        "inner-sizes": lambda d: _to(d, a[:, :16], b, one, one),
        "bias-size": lambda d: _to(d, a, b, one, one, torch.randn(5).bfloat16()),
        "float8-bias": lambda d: _to(d, a, b, one, one, torch.randn(N).to(E4M3)),
    }


# under torch.compile PyTorch's fake-tensor meta kernel sees the call first and reports the other cases its
# own way (a float32 operand, a vector) or not at all (strides of the scales, which traced arrays lack)
COMPILED_BAD_CALLS = ["half-scales", "scale-of-two", "scales-swapped", "inner-sizes", "bias-size", "float8-bias"]


def _scaled_mm_bf16(*args):
    return torch._scaled_mm(*args, out_dtype=torch.bfloat16)


@pytest.mark.parametrize(
    "case, mode", [(c, "eager") for c in _bad_calls()] + [(c, "compiled") for c in COMPILED_BAD_CALLS])
def test_bad_scaled_mm_calls_raise_the_cpu_error(case, mode):
    arguments = _bad_calls()[case]
    run = torch.compile(_scaled_mm_bf16, backend="neuron", dynamic=False) if mode == "compiled" else _scaled_mm_bf16
    with pytest.raises(Exception) as on_cpu:
        _scaled_mm_bf16(*arguments("cpu"))
    with pytest.raises(Exception) as on_neuron:
        run(*arguments("neuron"))
    assert on_neuron.type is on_cpu.type
    assert str(on_neuron.value) == str(on_cpu.value)


@pytest.mark.parametrize("mode", ["compiled", "adaptive"])
@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16, E5M2], ids=str)
def test_float8_conversions_saturate_as_on_the_cpu_in_every_mode(mode, source):
    """e4m3fn has no infinities: the CPU saturates beyond 448 (inf included); e5m2 overflows to inf."""
    x = torch.tensor([464.0, 500.0, 1e30, float("inf"), -float("inf"), float("nan"), -500.0, 2.0**-10, 57344.0])
    x = x.to(source)

    def f(x):
        return x.to(E4M3).float(), x.to(E5M2).float(), x.to(E4M3).to(E5M2).float()

    expected = [r.nan_to_num(7.0) for r in f(x)]
    if mode == "compiled":
        got = torch.compile(f, backend="neuron")(x.to("neuron"))
    else:
        with torch.neuron.adaptive_eager():
            got = f(x.to("neuron"))
    for g, e in zip(got, expected):
        assert torch.equal(g.cpu().nan_to_num(7.0), e)


@pytest.mark.parametrize("mode", ["eager", "compiled", "adaptive"])
@pytest.mark.parametrize("float8", [E4M3, E5M2], ids=str)
def test_float8_products_round_and_saturate_as_on_the_cpu(mode, float8):
    """The CPU multiplies float8 in float32 and rounds (saturating) once; XLA's e4m3fn arithmetic gives nan."""
    x = torch.tensor([1.5, -448.0, 300.0, 0.5, 2.0**-6, 57344.0]).to(float8)
    y = torch.tensor([3.0, -448.0, 300.0, 0.25, 2.0**-6, 2.0]).to(float8)

    def f(x, y):
        return x * y

    expected = f(x, y).float()
    args = _to("neuron", x, y)
    if mode == "compiled":
        got = torch.compile(f, backend="neuron")(*args)
    else:
        with torch.neuron.adaptive_eager(mode == "adaptive"):
            got = f(*args)
    assert got.dtype == float8 and torch.equal(got.float().cpu(), expected)


UNSUPPORTED = [torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2]
PATHS = {
    "to-neuron": lambda dtype: torch.empty(4, dtype=dtype).to("neuron"),
    "empty": lambda dtype: torch.empty(4, dtype=dtype, device="neuron"),
    "zeros": lambda dtype: torch.zeros(4, dtype=dtype, device="neuron"),
    "full": lambda dtype: torch.full((4,), 1.0, dtype=dtype, device="neuron"),
    "empty_like": lambda dtype: torch.empty_like(torch.ones(4, device="neuron"), dtype=dtype),
    "conversion": lambda dtype: torch.ones(4, device="neuron").to(dtype),
    "view": lambda dtype: torch.zeros(8, dtype=torch.uint8, device="neuron").view(dtype),
    "compiled-conversion": lambda dtype: torch.compile(lambda x: x.to(dtype), backend="neuron")(
        torch.ones(4, device="neuron")),
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("dtype", UNSUPPORTED, ids=str)
def test_unsupported_dtypes_raise_not_implemented_naming_the_dtype(dtype, path):
    fallback.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="torchneuron")  # no CPU fallback first
        with pytest.raises(NotImplementedError, match=f"dtype {dtype} is not supported on the neuron device") as error:
            PATHS[path](dtype)
    assert "jax" not in str(error.value).lower()
    assert fallback.report() == {}
