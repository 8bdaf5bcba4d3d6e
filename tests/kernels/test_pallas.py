"""The Pallas lowering (run by Pallas' interpreter here, as no GPU is at hand) agrees with the simulator and
the JAX lowering on the library kernels it lowers, names the construct it does not lower, and is chosen
as docs/kernels.md says; affine_range loops lower to a program that does not grow with their trip count."""
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torchneuron.kernels as nk
from torchneuron.kernels.context import LOWERING_ENV
from torchneuron.kernels.lib import adamw, attention, cross_entropy, mlp, moe, norms, rotary
from torchneuron.runtime import platform

tiled = sys.modules["torchneuron.kernels.lib.matmul"]  # the package's `matmul` is the function
rng = np.random.default_rng(0)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def lowered(launch, args, choice):
    """`launch` on `args` jitted, under the lowering `choice` (NumPy arrays become the traced arguments)."""
    arrays = [a for a in args if isinstance(a, np.ndarray)]

    def call(*xs):
        it = iter(xs)
        with nk.use_lowering(choice):
            return launch.lower(*(next(it) if isinstance(a, np.ndarray) else a for a in args))
    return jax.jit(call)(*(jnp.asarray(a) for a in arrays))


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


# each case: a launch and its arguments, all tiles of power-of-two sizes (Triton's rule); ragged row counts
# make the windows of the last program leave the tensors (padded for Pallas, masked)
CASES = {
    "norm (layer norm + residual)": lambda: (norms.norm_forward[2], randn(130, 64), randn(64), randn(64),
                                             randn(130, 64), 1e-5, True),
    "norm (rms norm)": lambda: (norms.norm_forward[2], randn(130, 64), randn(64), None, None, 1e-6, False),
    "attention (causal, window, GQA, dropout)": lambda: (
        attention.attention_forward[1, 2, 2], randn(1, 2, 130, 16), randn(1, 1, 140, 16), randn(1, 1, 140, 16),
        np.array([5], np.int32), None, None, 0.25, True, 50, -1, True, 0.2),
    "attention backward dq": lambda: (
        attention.attention_backward_dq[1, 2, 2], randn(1, 2, 130, 16), randn(1, 1, 140, 16),
        randn(1, 1, 140, 16), np.array([5], np.int32), None, None, randn(1, 2, 130, 16), randn(1, 2, 130, 16),
        randn(1, 2, 130, 1) + 3, 0.25, True, -1, -1, False, 0.0),
    "attention backward dk dv": lambda: (
        attention.attention_backward_dkdv[1, 2, 2], randn(1, 2, 130, 16), randn(1, 1, 140, 16),
        randn(1, 1, 140, 16), np.array([5], np.int32), None, None, randn(1, 2, 130, 16), randn(1, 2, 130, 16),
        randn(1, 2, 130, 1) + 3, 0.25, True, -1, -1, False, 0.0),
    "attention dropout mask": lambda: (attention.dropout_keep_kernel[1, 2, 2], np.array([5], np.int32),
                                       randn(1, 2, 130, 16), randn(1, 1, 300, 16), 0.3),
    "rope": lambda: (rotary.rope_kernel[2, 2, 2], randn(2, 2, 130, 64), randn(1, 130, 64), randn(1, 130, 64), False),
    "rope backward": lambda: (rotary.rope_kernel[2, 2, 2], randn(2, 2, 130, 64), randn(2, 130, 64),
                              randn(2, 130, 64), True),
    "adamw": lambda: (adamw.adamw_kernel[2], randn(200, 512), randn(200, 512), randn(200, 512),
                      np.abs(randn(200, 512)), 1e-3, 0.9, 0.999, 1e-8, 0.01, 0.1, 0.03),
    "swiglu forward": lambda: (mlp.swiglu_forward[1], randn(100, 128), randn(128, 256) / 10, randn(128, 256) / 10,
                               randn(256, 128) / 10),
    "swiglu gate backward": lambda: (mlp.swiglu_gate_backward[2, 1], randn(130, 512), randn(130, 512),
                                     randn(130, 512)),
    "matmul": lambda: (tiled.matmul_kernel[2, 2], randn(130, 200), randn(200, 600)),
    "grouped matmul": lambda: (moe.grouped_matmul_kernel[2, 2, 2], randn(2, 130, 140), randn(2, 140, 520)),
}
FAST = {"norm (layer norm + residual)", "attention (causal, window, GQA, dropout)"}


@pytest.mark.parametrize("case", [c if c in FAST else pytest.param(c, marks=pytest.mark.slow) for c in CASES])
def test_simulator_jax_and_pallas_lowerings_agree(case):
    launch, *args = CASES[case]()
    simulated = _tuple(launch.simulate(*args))
    by_jax, by_pallas = (_tuple(lowered(launch, args, choice)) for choice in ("jax", "pallas"))
    for s, j, p in zip(simulated, by_jax, by_pallas):
        scale = float(np.abs(np.asarray(s, np.float32)).max(initial=1.0))
        np.testing.assert_allclose(np.asarray(p, np.float32), np.asarray(s, np.float32), rtol=2e-4, atol=2e-5 * scale)
        np.testing.assert_allclose(np.asarray(p, np.float32), np.asarray(j, np.float32), rtol=2e-4, atol=2e-5 * scale)


def _jaxpr(launch, args, choice):
    arrays = [jnp.asarray(a) for a in args if isinstance(a, np.ndarray)]

    def call(*xs):
        it = iter(xs)
        with nk.use_lowering(choice):
            return launch.lower(*(next(it) if isinstance(a, np.ndarray) else a for a in args))
    return str(jax.make_jaxpr(call)(*arrays))


@nk.kernel
def ragged_tile(x):
    out = nk.ndarray((128, 40), x.dtype, buffer=nk.hbm)
    nk.store(out[...], nk.load(x[:, 0:40]))
    return out


@pytest.mark.parametrize("launch, args, construct", [
    (cross_entropy.linear_cross_entropy_forward[1], (randn(128, 64), randn(512, 64), np.zeros(128, np.int32)),
     "a write to part of a tile"),
    (moe.gather_rows_kernel[1], (randn(50, 32), np.arange(128, dtype=np.int32) % 50, randn(128)), "an indirect load"),
    (norms.norm_backward[1], (randn(128, 64), randn(64), randn(128, 1), randn(128, 1), randn(128, 64), True),
     "a matmul of (1, 128)"),
    (ragged_tile[()], (randn(128, 64),), "a tile of shape (128, 40)"),
])
def test_what_pallas_does_not_lower_is_named(launch, args, construct):
    with pytest.raises(NotImplementedError, match=f"kernel {launch.kernel.name}: the Pallas lowering does not "
                                                  f"lower {construct.replace('(', '.').replace(')', '.')}"):
        _jaxpr(launch, args, "pallas")


def test_the_choice_follows_platform_context_and_environment(monkeypatch):
    launch, *args = CASES["norm (layer norm + residual)"]()
    monkeypatch.delenv(LOWERING_ENV, raising=False)
    assert "pallas_call" not in _jaxpr(launch, args, "auto")  # XLA:CPU: the JAX lowering
    pallas = _jaxpr(launch, args, "pallas")
    assert "pallas_call" in pallas
    # x and the outputs are blocks of 128 rows picked by the program id (BlockSpecs; whole, x is 256 padded)
    assert "Blocked(block_size=128)" in pallas and "Blocked(block_size=256)" not in pallas
    monkeypatch.setattr(platform, "pallas_pays", lambda: True)  # as on a GPU (traced, not compiled, here)
    assert "pallas_call" in _jaxpr(launch, args, "auto")
    ce_args = (randn(128, 64), randn(512, 64), np.zeros(128, np.int32))
    assert "pallas_call" not in _jaxpr(cross_entropy.linear_cross_entropy_forward[1], ce_args, "auto")  # JAX
    monkeypatch.setattr(platform, "pallas_pays", lambda: False)
    monkeypatch.setenv(LOWERING_ENV, "pallas")
    arrays = [jnp.asarray(a) for a in args if isinstance(a, np.ndarray)]

    def traced():  # a new function each time: make_jaxpr caches traces by function
        return str(jax.make_jaxpr(lambda *xs: launch.lower(*xs, *args[4:]))(*arrays))
    assert "pallas_call" in traced()
    with nk.use_lowering("jax"):  # the context wins over the environment
        assert "pallas_call" not in traced()
    monkeypatch.setenv(LOWERING_ENV, "triton")
    with pytest.raises(ValueError, match="TORCHNEURON_KERNEL_LOWERING"):
        traced()
    with pytest.raises(ValueError, match="one of auto, jax, pallas, got 'xla' .from use_lowering"):
        nk.use_lowering("xla")
    with pytest.raises(ValueError, match="from custom_op.lowering=."):
        nk.custom_op("test_pallas::never", scaled_rows, lowering="triton")


@nk.kernel
def scaled_rows(x: torch.Tensor, scale: float) -> torch.Tensor:
    n, d = x.shape
    out = nk.ndarray((n, d), x.dtype, buffer=nk.hbm)
    rows = nk.ds(nk.program_id(0) * 128, 128)
    valid = nk.iota((128, 1), 0) + nk.program_id(0) * 128 < n
    nk.store(out[rows, :], nk.load(x[rows, :], mask=valid) * scale, mask=valid)
    return out


scaled_rows_op = nk.custom_op("test_pallas::scaled_rows", scaled_rows,
                              grid=lambda x, scale: ((x.shape[0] + 127) // 128,), lowering="pallas")


def test_a_custom_op_fixes_its_lowering_on_cpu_and_neuron_tensors():
    x = torch.randn(200, 32)
    torch.testing.assert_close(scaled_rows_op(x, 3.0), x * 3.0)
    # on neuron the float arrives traced: it becomes a one-element input of the pallas_call
    torch.testing.assert_close(scaled_rows_op(x.to("neuron"), 0.5).cpu(), x * 0.5)


@nk.kernel
def blockwise(x, blocks: int):
    """Row sums of `blocks` column blocks each, accumulated over an affine_range, and each block stored."""
    n = x.shape[0]
    out = nk.ndarray((n, 64 * blocks), x.dtype, buffer=nk.hbm)
    sums = nk.ndarray((n, 1), nk.float32, buffer=nk.hbm)
    total = nk.zeros((128, 1), nk.float32)
    for j in nk.affine_range(blocks):
        t = nk.load(x[:, nk.ds(j * 64, 64)], dtype=nk.float32)
        total += nk.sum(t)
        nk.store(out[:, nk.ds(j * 64, 64)], t * 2.0)
    nk.store(sums[...], total)
    return out, sums


def test_affine_range_lowers_without_growing_with_its_trip_count():
    sizes = {}
    for blocks in (4, 32):
        x = randn(128, 64 * blocks)
        simulated = blockwise(x, blocks)
        program = jax.jit(lambda a: blockwise[()].lower(a, blocks)).lower(jnp.asarray(x)).as_text()
        sizes[blocks] = len(program.splitlines())
        out, sums = jax.jit(lambda a: blockwise[()].lower(a, blocks))(jnp.asarray(x))
        np.testing.assert_allclose(np.asarray(out), simulated[0], rtol=1e-6)
        np.testing.assert_allclose(np.asarray(sums), simulated[1], rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(np.asarray(sums)[:, 0], x.sum(1), rtol=1e-4, atol=1e-3)
    assert sizes[32] == sizes[4], sizes
