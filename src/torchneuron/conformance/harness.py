"""Run PyTorch's OpInfo samples on neuron and on the CPU and compare.

One `Result` per (op, check, dtype): `forward` for every tested dtype the op
supports on the CPU, `grad` (float32 backward), `inplace` and `out` (the
variants the OpInfo declares), `errors` (its error inputs) and `compiled` and
`compiled_grad` (the float32 forward and grad samples through torch.compile). CPU fallback
is made an error while each check runs, so a result measures our lowerings.
"""
import contextlib
import dataclasses
import functools
import math
import os
import signal
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

import torchneuron  # noqa: F401
from torchneuron.eager import fallback, host_bookkeeping

DTYPES = (
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.complex64,
    torch.int64,
    torch.int32,
    torch.bool,
)
CHECKS = ("forward", "grad", "inplace", "out", "errors", "refused", "compiled", "compiled_grad")
# dtypes an op's kernels may not take: where neither the CPU's nor CUDA's does, neuron must refuse it too
REFUSABLE_DTYPES = (torch.complex64, torch.bool, torch.int64)
PASS, FAIL, FALLBACK = "pass", "fail", "fallback"

# their values are uninitialised memory: only shapes and dtypes can be compared
UNINITIALISED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"}
SECONDS_PER_OP = 300


@dataclasses.dataclass
class Result:
    op: str
    check: str
    dtype: str
    status: str
    message: str = ""

    @property
    def key(self) -> str:
        return f"{self.op} {self.check}:{self.dtype}"

    @property
    def dtype_object(self):
        return None if self.dtype == "-" else getattr(torch, self.dtype)


def op_id(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def all_ops() -> list:
    from torch.testing._internal.common_methods_invocations import op_db

    return sorted(op_db, key=op_id)


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tested_dtypes(op) -> list:
    supported = op.supported_dtypes("cpu")
    return [d for d in DTYPES if d in supported]


def grad_dtype(op):
    if op.supports_autograd and torch.float32 in op.supported_backward_dtypes("cpu"):
        return torch.float32
    return None


def max_samples(check, dtype):
    """Samples per check: float32 forward and grad are the headline numbers and get more;
    other dtypes and variants a few each, which keeps the full sweep to about 40 minutes."""
    return 12 if check in ("forward", "grad") and dtype == torch.float32 else 4


def planned(op, checks=CHECKS, dtypes=DTYPES) -> list:
    """The (check, dtype) pairs that apply to an op: its CPU dtypes among `dtypes`, float32 grad,
    the variants it declares (in float32) and its error inputs."""
    supported = [d for d in tested_dtypes(op) if d in dtypes]
    float32 = torch.float32 in supported
    plan = [("forward", d) for d in supported]
    plan += [("grad", torch.float32)] if grad_dtype(op) is not None and float32 else []
    plan += [("inplace", torch.float32)] if op.inplace_variant is not None and float32 else []
    plan += [("out", torch.float32)] if op.supports_out and float32 else []
    plan += [("errors", None)] if op.error_inputs_func is not None else []
    plan += [("compiled", torch.float32)] if float32 else []
    plan += [("compiled_grad", torch.float32)] if grad_dtype(op) is not None and float32 else []
    cpu_dtypes = op.supported_dtypes("cpu")  # none: a CUDA-only op, which has nothing to refuse like the CPU
    plan += [("refused", d) for d in REFUSABLE_DTYPES if cpu_dtypes and d not in cpu_dtypes
             and d not in op.supported_dtypes("cuda")]
    return [(check, dtype) for check, dtype in plan if check in checks]


_CHECK_FUNCTIONS = {}


def check_op(op, checks=CHECKS, dtypes=DTYPES, skip=()) -> list:
    return list(iter_checks(op, checks, dtypes, skip))


def iter_checks(op, checks=CHECKS, dtypes=DTYPES, skip=()):
    """Every applicable check of one OpInfo (but the keys in `skip`), each stopping at its first failing sample."""
    with _time_limit(SECONDS_PER_OP):
        try:
            for check, dtype in planned(op, checks, dtypes):
                if key(op_id(op), check, dtype) not in skip:
                    yield _run(op, check, dtype, _CHECK_FUNCTIONS[check], max_samples(check, dtype))
        except _Timeout:
            yield Result(op_id(op), "timeout", "-", FAIL, f"over {SECONDS_PER_OP}s")


def key(op: str, check: str, dtype) -> str:
    return f"{op} {check}:{dtype_name(dtype) if dtype is not None else '-'}"


class _Timeout(Exception):
    pass


class _time_limit:
    def __init__(self, seconds):
        self.seconds = seconds

    def __enter__(self):
        self.previous = signal.signal(signal.SIGALRM, self._expire)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)

    @staticmethod
    def _expire(signum, frame):
        raise _Timeout()


def _run(op, check, dtype, fn, limit) -> Result:
    name = dtype_name(dtype) if dtype is not None else "-"
    try:
        # each sample's lowering tested, where a small integer op of a new shape would run on the CPU
        with fallback.as_error(), host_bookkeeping.enabled_within(False):
            note = fn(op, dtype, limit)
    except _Timeout:
        raise
    except Exception as error:  # noqa: BLE001 - every failure is a result
        return Result(op_id(op), check, name, _status(error), _describe(error))
    return Result(op_id(op), check, name, PASS, note or "")


def _status(error) -> str:
    from ..eager.fallback import FallbackError

    while error is not None:
        if isinstance(error, FallbackError) or "CPU fallback is disabled" in str(error):
            return FALLBACK
        error = error.__cause__ or error.__context__
    return FAIL


def _describe(error) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    # assert_close's first line says only that values differ; the largest difference follows
    first = " ".join(lines[:1] + [line for line in lines if line.startswith("Greatest absolute")])
    frame = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    where = f" [{os.path.basename(frame.filename)}:{frame.lineno}]" if frame else ""
    return f"{type(error).__name__}: {first[:300]}{where}"


# --- samples ---------------------------------------------------------------------


def _samples(op, dtype, requires_grad, limit):
    torch.manual_seed(0)
    samples = op.sample_inputs("cpu", dtype, requires_grad=requires_grad)
    for count, sample in enumerate(samples):
        if limit is not None and count >= limit:
            return
        yield sample


# arguments PyTorch requires on the CPU whatever the op's device (CUDA raises alike), by op and position
_HOST_ARGUMENTS = {"tensor_split": {0}}


def _to_neuron(value):
    if isinstance(value, torch.Tensor):
        return _copy(value, "neuron")
    if isinstance(value, torch.device) or value == "cpu":
        return torch.device("neuron")
    return value


def _copy(value, device):
    copy = _same_layout_copy(value.detach(), device)
    return copy.requires_grad_(value.requires_grad) if copy.is_floating_point() or copy.is_complex() else copy


def _same_layout_copy(value, device):
    """A copy on `device` with the same sizes, strides and offset over a copy of the whole storage,
    so that ops reading the layout (as_strided, views of views) see what they see on the original."""
    if value.layout != torch.strided or value.is_conj() or value.is_neg():
        return value.resolve_conj().resolve_neg().to(device, copy=True)
    storage = torch.empty(0, dtype=value.dtype).set_(value.untyped_storage())
    return storage.to(device, copy=True).as_strided(value.shape, value.stride(), value.storage_offset())


def _on_neuron(op, sample):
    convert = lambda v: tree_map(_to_neuron, v)  # noqa: E731
    kwargs = {k: (_to_neuron(v) if k == "device" else convert(v)) for k, v in sample.kwargs.items()}
    host = _HOST_ARGUMENTS.get(op.name, ())
    args = [a if i in host else convert(a) for i, a in enumerate(sample.args)]
    return convert(sample.input), args, kwargs


def _cloned(sample):
    clone = lambda v: _copy(v, v.device) if isinstance(v, torch.Tensor) else v  # noqa: E731
    return tree_map(clone, sample.input), tree_map(clone, sample.args), dict(tree_map(clone, sample.kwargs))


def _to_cpu(value):
    if isinstance(value, torch.Tensor) and value.device.type == "neuron":
        return value.detach().cpu()
    return value


def _call(fn, inputs):
    x, args, kwargs = inputs
    return fn(x, *args, **kwargs)


class _SeesRandomness(TorchDispatchMode):
    """Notes whether any ATen op that ran draws random numbers."""

    random = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.random = True
        return func(*args, **(kwargs or {}))


def _reference(fn, sample):
    """The CPU result, and whether it is random. The result is taken from a run outside the dispatch mode
    that sees randomness: under a Python dispatch mode the CPU's complex pinv and lstsq are wrong
    (x @ pinv(x) @ x is not x), with PyTorch 2.13."""
    expected = _call(fn, _cloned(sample))
    with _SeesRandomness() as mode:
        _call(fn, _cloned(sample))
    return expected, mode.random


def _compare(actual, expected, random=False, uninitialised=False):
    actual = tree_map(_to_cpu, actual)
    if random or uninitialised:
        _compare_metadata(actual, expected)
        if random:
            _compare_statistics(actual, expected)
        return
    assert_close(actual, expected)


def assert_close(actual, expected):
    """assert_close with tolerances no tighter than PyTorch's own device-vs-CPU comparison
    (test_ops.py test_compare_cpu: 1e-3), and its usual bfloat16 atol for accumulating ops."""
    flat = [t for t in tree_flatten(expected)[0] if isinstance(t, torch.Tensor)]
    atol = max((_ATOL.get(t.dtype, 0) for t in flat), default=0)
    rtol = max((_RTOL.get(t.dtype, 0) for t in flat), default=0)
    torch.testing.assert_close(actual, expected, equal_nan=True, atol=atol, rtol=rtol)


# complex128 results come from float64 samples (fft, eig): as tolerant as float64, not exact
_ATOL = {torch.float32: 1e-3, torch.float64: 1e-3, torch.complex64: 1e-3, torch.complex128: 1e-3,
         torch.float16: 1e-3, torch.bfloat16: 1e-2}
_RTOL = {torch.float32: 1e-3, torch.float64: 1e-3, torch.complex64: 1e-3, torch.complex128: 1e-3,
         torch.float16: 1e-3, torch.bfloat16: 1.6e-2}


def _compare_metadata(actual, expected):
    flat_a, spec_a = tree_flatten(actual)
    flat_e, spec_e = tree_flatten(expected)
    assert spec_a == spec_e, f"output structure {spec_a} != {spec_e}"
    for a, e in zip(flat_a, flat_e):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor) and a.shape == e.shape and a.dtype == e.dtype, (
                f"got {_meta(a)}, expected {_meta(e)}"
            )


def _meta(t):
    return (tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__


def _compare_statistics(actual, expected):
    """Random outputs: the same non-finite values, and finite values like the CPU's by either of two tests.
    Mean and range tolerate correlated values (channel dropout zeroes whole channels) but not heavy
    tails (Cauchy has no mean, and its extremes are wild); a two-sample Kolmogorov-Smirnov test is the
    reverse."""
    for a, e in zip(tree_flatten(actual)[0], tree_flatten(expected)[0]):
        if not isinstance(e, torch.Tensor) or e.numel() < 16:
            continue
        if e.is_complex():  # each part its own distribution
            _compare_statistics(tuple(torch.view_as_real(a).unbind(-1)), tuple(torch.view_as_real(e).unbind(-1)))
            continue
        a, e = a.double().flatten(), e.double().flatten()
        finite = torch.isfinite(e)
        assert torch.equal(torch.isfinite(a), finite) or finite.all() == torch.isfinite(a).all(), "non-finite values differ"
        a, e = a[torch.isfinite(a)], e[finite]
        if e.numel() < 16 or a.numel() < 16:
            continue
        moments = _mean_and_range_differ(a, e)
        distance, bound = _kolmogorov_smirnov(a, e)
        assert moments is None or distance <= bound, (
            f"{moments}, and the distribution differs from the CPU's (KS distance {distance:.3g} > {bound:.3g})"
        )


def _mean_and_range_differ(a, e):
    """Why a's mean or range is unlike e's, or None: the mean within a few standard errors, values within
    a few standard deviations of e's extremes."""
    spread = float(e.std()) + 1e-6
    bound = 6 * spread / math.sqrt(e.numel()) * math.sqrt(2)
    if abs(float(a.mean()) - float(e.mean())) > bound + 1e-6:
        return f"mean {float(a.mean()):.4g} vs CPU {float(e.mean()):.4g} (bound {bound:.3g})"
    if float(a.min()) < float(e.min()) - 3 * spread or float(a.max()) > float(e.max()) + 3 * spread:
        return "values outside the CPU's range"
    return None


def _kolmogorov_smirnov(a, e, alpha=1e-6):
    """The largest gap between the two empirical CDFs, and its critical value at significance alpha."""
    points = torch.cat([a, e])
    gap = (_ecdf(a, points) - _ecdf(e, points)).abs().max()
    n, m = a.numel(), e.numel()
    return float(gap), math.sqrt(-math.log(alpha / 2) / 2) * math.sqrt((n + m) / (n * m))


def _ecdf(values, points):
    return torch.searchsorted(values.sort().values, points, right=True).double() / values.numel()


# --- checks ----------------------------------------------------------------------


FLOAT32_REFERENCE = "matches the CPU computed in float32"


def _forward(op, dtype, limit, compiled=False):
    """Each sample against the CPU; returns FLOAT32_REFERENCE when a low-precision sample matched only that.
    `compiled`: run by torch.compile with the neuron backend (samples the CPU rejects are the errors check's)."""
    uninitialised = op.name in UNINITIALISED
    note = None
    for sample in _samples(op, dtype, False, limit):
        try:
            expected, random = _reference(op, sample)
        except Exception as error:  # noqa: BLE001 - the CPU rejects it: neuron must reject it alike
            if not compiled:
                _expect_error(error, lambda: _call(op, _on_neuron(op, sample)))
            continue
        actual = _call(_compiled_op(op) if compiled else op, _on_neuron(op, sample))
        if random or uninitialised:
            _compare(actual, expected, random, uninitialised)
            continue
        actual, expected = _canonical(op, sample, tree_map(_to_cpu, actual), expected)
        try:
            assert_close(actual, expected)
        except AssertionError:
            if not _low_precision(expected):
                raise
            _assert_close_to_float32_reference(op, sample, actual, expected)
            note = FLOAT32_REFERENCE
    return note


def _compiled_op(op):
    """The op through torch.compile, compiled afresh for each sample (Dynamo's recompile limit would otherwise
    leave later samples to eager): graphs lower the views, in-place ops and layouts that eager's own handlers
    take, and keep a program's aliasing and checks, so this is where a lowering eager never reaches is
    tested."""
    torch._dynamo.reset()
    return torch.compile(_CALLING(op), backend="neuron")


# Dynamo skips torchneuron's files (patches.dynamo_skips_torchneuron_frames), so a wrapper defined here would
# run every sample eagerly; this one's code is compiled from a string, a file Dynamo traces like the user's
# (dont_skip_tracing would trace it too, but then fails on every graph break at a builtin)
_CALLING = eval(compile("lambda op: lambda *args, **kwargs: op(*args, **kwargs)", "<conformance compiled op>",
                        "eval"))


def _low_precision(outputs):
    return any(isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16)
               for t in tree_flatten(outputs)[0])


def _assert_close_to_float32_reference(op, sample, actual, expected):
    """Inductor's rule for low-precision results (`reference_in_float`): a result that misses the CPU's may
    match the CPU computed on float32 copies of the inputs, rounded to the result's dtype. XLA accumulates
    half-precision sums, products and convolutions in float32, where the CPU's loops round at each step;
    either answer is PyTorch's. The miss against the CPU's own dtype is what is raised otherwise."""
    upcast = lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16) else t  # noqa: E731
    x, args, kwargs = _cloned(sample)
    try:
        reference = _call(op, tree_map(upcast, (x, args, kwargs)))
        reference = tree_map(lambda r, e: r.to(e.dtype) if isinstance(e, torch.Tensor) else r, reference, expected)
        reference = _canonical(op, sample, actual, reference)[1]
        assert_close(actual, reference)
    except Exception:  # noqa: BLE001 - no float32 form of the sample, or a miss there too
        assert_close(actual, expected)


def _canonical(op, sample, actual, expected):
    """Both results with what PyTorch leaves to the implementation made the same on each side."""
    canonical = _CANONICAL.get(op.name)
    return canonical(sample, actual, expected) if canonical else (actual, expected)


def _tie_order_free(dim_position):
    """sort, argsort and topk may put equal elements in any order (unless stable=True, which is compared
    as it is): indices are right when they pick the CPU's values from the input."""
    def canonical(sample, actual, expected):
        if sample.kwargs.get("stable") or sample.input.ndim == 0:
            return actual, expected
        args = sample.args
        dim = sample.kwargs.get("dim", args[dim_position] if len(args) > dim_position else -1)
        picked = functools.partial(_picked, sample.input, dim)
        if isinstance(expected, torch.Tensor):  # argsort
            return picked(actual), picked(expected)
        return (actual[0], picked(actual[1])), (expected[0], picked(expected[1]))
    return canonical


def _picked(x, dim, indices):
    """x's values at indices along dim (the indices of a reduction without keepdim lack that dim)."""
    if indices.ndim == x.ndim:
        return x.take_along_dim(indices, dim)
    return x.take_along_dim(indices.unsqueeze(dim), dim).squeeze(dim)


def _eigenvector_phase_free(sample, actual, expected):
    """Eigenvectors are defined up to a phase (a sign when real): each column of both is turned so that
    its component largest on the CPU is real and positive."""
    def turned(vectors, rows):
        pivot = vectors.gather(-2, rows)
        return vectors * (pivot.abs() / torch.where(pivot == 0, 1, pivot)).conj()
    if expected[1].numel() == 0:
        return actual, expected
    rows = expected[1].abs().argmax(-2, keepdim=True)
    return (actual[0], turned(actual[1], rows)), (expected[0], turned(expected[1], rows))


def _statistics_in_float32(sample, actual, expected):
    """Half-precision batch and layer norm save their statistics in float32 by PyTorch's meta kernels (and
    on CUDA), in the input dtype on the CPU: they are compared rounded to the CPU's dtype."""
    return tree_map(lambda a, e: a.to(e.dtype), actual, expected), expected


_CANONICAL = {
    "sort": _tie_order_free(0), "argsort": _tie_order_free(0), "topk": _tie_order_free(1),
    "kthvalue": _tie_order_free(1),
    "linalg.eigh": _eigenvector_phase_free, "linalg.eig": _eigenvector_phase_free,
    "native_layer_norm": _statistics_in_float32, "native_batch_norm": _statistics_in_float32,
    "_native_batch_norm_legit": _statistics_in_float32, "_batch_norm_with_update": _statistics_in_float32,
}


def _expect_error(cpu_error, on_neuron):
    try:
        on_neuron()
        # device-side checks (index ranges) report at synchronisation, as CUDA's device asserts do
        torch.neuron.synchronize()
    except Exception as error:  # noqa: BLE001
        if isinstance(error, type(cpu_error)) and _status(error) != FALLBACK:
            return
        raise
    raise AssertionError(f"CPU raised {type(cpu_error).__name__} ({cpu_error}) but neuron did not")


def _grad(op, dtype, limit, compiled=False):
    """`compiled`: forward and backward graphs by torch.compile (random ops' are the eager check's: their
    central difference runs the op eagerly)."""
    for sample in _samples(op, dtype, True, limit):
        mode = _SeesRandomness()
        cpu_grads = _gradients(op, sample, _cloned(sample), watch=mode)
        if cpu_grads is None or (mode.random and compiled):
            continue
        if mode.random:
            _check_random_gradients(op, sample, cpu_grads)
            continue
        neuron_grads = _gradients(_compiled_op(op) if compiled else op, sample, _on_neuron(op, sample))
        assert_close(tree_map(_to_cpu, neuron_grads), cpu_grads)


def _leaves(inputs):
    return [t for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor) and t.requires_grad]


def _weighted_outputs(op, sample, inputs, watch=contextlib.nullcontext()):
    """The differentiable outputs and the fixed random weights that reduce them to one number
    (`watch` is a dispatch mode seeing the op, not the drawing of the weights)."""
    with watch:
        outputs = sample.output_process_fn_grad(_call(op, inputs))
    outputs = [t for t in tree_flatten(outputs)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    generator = torch.Generator().manual_seed(3)
    weights = [torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device) for t in outputs]
    return outputs, weights


def _gradients(op, sample, inputs, watch=contextlib.nullcontext()):
    """d(sum of outputs * fixed weights)/d(inputs), or None when nothing differentiable comes out."""
    leaves = _leaves(inputs)
    outputs, weights = _weighted_outputs(op, sample, inputs, watch)
    if not leaves or not outputs:
        return None
    with watch:
        return torch.autograd.grad(outputs, leaves, weights, allow_unused=True)


_SEED = 7
_STEP = 3e-3


def _check_random_gradients(op, sample, cpu_grads):
    """Gradients of random ops (dropout) depend on masks that neuron and the CPU draw differently.
    Unless they agree anyway, the neuron gradient is checked against its own forward, under the same seed (so the same masks):
    its dot product with a random direction must match the central difference along that direction."""
    inputs = _on_neuron(op, sample)
    torch.manual_seed(_SEED)
    grads = _gradients(op, sample, inputs)
    try:  # some do not depend on the draws (PyTorch gives normal()'s std a zero gradient)
        assert_close(tree_map(_to_cpu, grads), cpu_grads)
        return
    except AssertionError:
        _compare_metadata(tree_map(_to_cpu, grads), cpu_grads)
    generator = torch.Generator().manual_seed(5)
    directions = [torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device) for t in _leaves(inputs)]
    slope = sum(float((g * d).sum()) for g, d in zip(grads, directions) if g is not None)
    ahead, behind = (_value_along(op, sample, directions, step) for step in (_STEP, -_STEP))
    difference = (ahead - behind) / (2 * _STEP)
    assert abs(slope - difference) <= 1e-2 * (1 + abs(difference)), (
        f"gradient along a direction {slope:.6g} but central difference {difference:.6g} (same masks)"
    )


def _value_along(op, sample, directions, step):
    inputs = _on_neuron(op, sample)
    feed = iter(directions)
    shifted = lambda t: (t.detach() + step * next(feed)).requires_grad_() if isinstance(t, torch.Tensor) and t.requires_grad else t  # noqa: E731
    inputs = tree_map(shifted, inputs)
    torch.manual_seed(_SEED)
    outputs, weights = _weighted_outputs(op, sample, inputs)
    return sum(float((o.detach().double() * w.double()).sum()) for o, w in zip(outputs, weights))


def _inplace(op, dtype, limit):
    variant = op.inplace_variant
    for sample in _samples(op, dtype, False, limit):
        cpu, neuron = _cloned(sample), _on_neuron(op, sample)
        try:
            with _SeesRandomness() as mode:
                _call(variant, cpu)
        except Exception as error:  # noqa: BLE001 - e.g. a result type the input cannot hold
            _expect_error(error, lambda: _call(variant, neuron))
            continue
        _call(variant, neuron)
        _compare(neuron[0], cpu[0], mode.random)


def _out(op, dtype, limit):
    for sample in _samples(op, dtype, False, limit):
        try:
            expected, random = _reference(op, sample)
        except Exception:  # noqa: BLE001 - the forward check covers samples the CPU rejects
            continue
        if not all(isinstance(t, torch.Tensor) for t in tree_flatten(expected)[0]):
            continue
        cpu_out = tree_map(torch.empty_like, expected)
        neuron_out = tree_map(_neuron_out_like, expected)
        x, args, kwargs = _cloned(sample)
        try:
            cpu_result = op(x, *args, **kwargs, out=cpu_out)
        except Exception:  # noqa: BLE001 - the CPU has no out= form of this sample (nonzero as_tuple)
            continue
        x, args, kwargs = _on_neuron(op, sample)
        result = op(x, *args, **kwargs, out=neuron_out)
        # returns what the CPU returns: its out tensors, or None (split_with_sizes_copy, unbind_copy)
        returned = cpu_result is None and result is None or all(
            a is b for a, b in zip(tree_flatten(result)[0], tree_flatten(neuron_out)[0])
        )
        assert returned, "out= did not return its out tensors"
        if random or op.name in UNINITIALISED:
            _compare(neuron_out, cpu_out, random, op.name in UNINITIALISED)
        else:
            assert_close(*_canonical(op, sample, tree_map(_to_cpu, neuron_out), cpu_out))


def _neuron_out_like(t):
    """An out= tensor for a result like `t`: a new strided one, or one of `t`'s sparse layout (as the CPU's
    `empty_like`: a sparse out= tensor keeps its layout)."""
    if t.layout == torch.strided:
        return torch.empty(t.shape, dtype=t.dtype, device="neuron")
    return torch.empty_like(t, device="neuron")


def _errors(op, dtype, limit):
    """Each error input that the CPU rejects must be rejected on neuron with the same type of exception."""
    for error_input in op.error_inputs("cpu"):
        sample = error_input.sample_input
        try:
            _call(op, _cloned(sample))
        except Exception as error:  # noqa: BLE001
            _expect_error(error, lambda: _call(op, _on_neuron(op, sample)))


def _refused(op, dtype, limit):
    """A sample in a dtype neither the CPU's nor CUDA's kernel takes: where the CPU raises, neuron must
    raise the same type of exception, not answer."""
    try:
        samples = list(_samples(op, dtype, False, limit))
    except Exception:  # noqa: BLE001  (OpInfo cannot make samples in a dtype it does not list: none to try)
        return
    for sample in samples:
        try:
            _call(op, _cloned(sample))
        except Exception as error:  # noqa: BLE001
            _expect_error(error, lambda: _call(op, _on_neuron(op, sample)))


_CHECK_FUNCTIONS.update(forward=_forward, grad=_grad, inplace=_inplace, out=_out, errors=_errors, refused=_refused,
                        compiled=functools.partial(_forward, compiled=True),
                        compiled_grad=functools.partial(_grad, compiled=True))
