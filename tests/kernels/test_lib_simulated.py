"""The library's kernels obey every rule: each runs in the simulator on small inputs (races, masks and
bounds checked) and agrees with its JAX lowering."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from torchneuron.kernels.lib import attention, cross_entropy, mlp, moe, norms, paged_attention

rng = np.random.default_rng(0)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def agree(launch, *args):
    arrays = [a for a in args if isinstance(a, np.ndarray)]
    simulated = launch.simulate(*args)

    def lowered(*xs):
        it = iter(xs)
        return launch.lower(*(next(it) if isinstance(a, np.ndarray) else a for a in args))
    result = jax.jit(lowered)(*(jnp.asarray(a) for a in arrays))
    simulated = simulated if isinstance(simulated, tuple) else (simulated,)
    result = result if isinstance(result, tuple) else (result,)
    for s, r in zip(simulated, result):
        np.testing.assert_allclose(np.asarray(r, np.float32), np.asarray(s, np.float32), rtol=2e-4, atol=2e-5)
    return simulated


CASES = {
    "norm": lambda: (norms.norm_forward[2], randn(130, 40), randn(40), randn(40), randn(130, 40), 1e-5, True),
    "swiglu": lambda: (mlp.swiglu_forward[1], randn(60, 130), randn(130, 70) / 10, randn(130, 70) / 10,
                       randn(70, 130) / 10),
    "attention": lambda: (attention.attention_forward[1, 2, 2], randn(1, 2, 130, 16), randn(1, 1, 140, 16),
                          randn(1, 1, 140, 16), np.array([5], np.int32), None, None, 0.25, True, 50, -1, True, 0.2),
    "attention_dkdv": lambda: (attention.attention_backward_dkdv[1, 2, 2], randn(1, 2, 130, 16), randn(1, 1, 140, 16),
                               randn(1, 1, 140, 16), np.array([5], np.int32), np.zeros((1, 130), np.int32),
                               np.zeros((1, 140), np.int32), randn(1, 2, 130, 16), randn(1, 2, 130, 16),
                               randn(1, 2, 130, 1), 0.25, True, -1, -1, False, 0.0),
    "cross_entropy": lambda: (cross_entropy.linear_cross_entropy_forward[2], randn(130, 40), randn(600, 40),
                              rng.integers(-1, 600, 130).astype(np.int32)),
    "cross_entropy_backward": lambda: (cross_entropy.linear_cross_entropy_backward_weight[5], randn(130, 40),
                                       randn(600, 40) / 5, rng.integers(-1, 600, 130).astype(np.int32),
                                       randn(130, 1) + 6, randn(130, 1)),
    "router": lambda: (moe.router_kernel[()], randn(200, 6), 2, 50),
    "gather_rows": lambda: (moe.gather_rows_kernel[2], randn(50, 24), rng.integers(-1, 50, 140).astype(np.int32),
                            randn(140)),
    "combine": lambda: (moe.combine_kernel[2], randn(60, 24), rng.integers(-1, 60, (130, 2)).astype(np.int32),
                        randn(130, 2)),
    "grouped_matmul": lambda: (moe.grouped_matmul_kernel[2, 2, 2], randn(2, 130, 140), randn(2, 140, 520)),
    "paged_decode": lambda: (paged_attention.paged_decode_kernel[2, 2], randn(2, 4, 16), randn(64, 2, 16),
                             randn(64, 2, 16), np.array([[1, 3], [2, -1]], np.int32), np.array([30, 9], np.int32),
                             16, 0.25),
}


FAST = {"attention", "norm", "router", "paged_decode", "combine"}


@pytest.mark.parametrize("case", [c if c in FAST else pytest.param(c, marks=pytest.mark.slow) for c in sorted(CASES)])
def test_library_kernel_in_the_simulator_agrees_with_its_lowering(case):
    agree(*CASES[case]())
