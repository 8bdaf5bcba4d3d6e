"""The kernel language: simulator and JAX lowering agree with NumPy and each other; every rule the checker
enforces is triggered and reported at the kernel's own line."""
import inspect

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import torchneuron.kernels as nk


def line_of(fn, marker):
    """The file line of `fn`'s source holding `marker` (a comment on the offending statement)."""
    lines, first = inspect.getsourcelines(inspect.unwrap(fn.fn if isinstance(fn, nk.Kernel) else fn))
    return first + next(i for i, text in enumerate(lines) if marker in text)


def both(launch, *args):
    """Simulator and lowering results of one launch, the lowering jitted."""
    simulated = launch.simulate(*args)
    lowered = jax.jit(lambda *a: launch.lower(*a))(*(jnp.asarray(a) for a in args))
    return simulated, np.asarray(lowered)


@nk.kernel
def softmax_rows(x):
    out = nk.ndarray(x.shape, x.dtype, buffer=nk.hbm)
    n, d = x.shape
    i = nk.program_id(0)
    rows = nk.iota((128, 1), 0) + i * 128
    t = nk.load(x[nk.ds(i * 128, 128), :], mask=rows < n, other=0.0, dtype=nk.float32)
    e = nk.exp(t - nk.max(t))
    nk.store(out[nk.ds(i * 128, 128), :], e / nk.sum(e), mask=rows < n)
    return out


def _softmax(x):
    x = x.astype(np.float32)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_masked_softmax_agrees_in_simulator_lowering_and_numpy(dtype):
    x = np.random.default_rng(0).standard_normal((300, 40)).astype(dtype)
    simulated, lowered = both(softmax_rows[3], x)
    assert simulated.dtype == lowered.dtype == np.dtype(dtype)
    tol = 1e-6 if dtype == np.float32 else 1e-2
    np.testing.assert_allclose(simulated.astype(np.float32), _softmax(x), atol=tol)
    np.testing.assert_allclose(lowered.astype(np.float32), simulated.astype(np.float32), atol=tol)


@nk.kernel
def tiled_matmul(a, b):
    """a [M, K] @ b [K, N] in 128 x 512 output tiles, K accumulated in psum over an affine_range."""
    m, k = a.shape
    n = b.shape[1]
    out = nk.ndarray((m, n), nk.float32, buffer=nk.hbm)
    i, j = nk.program_id(0), nk.program_id(1)
    acc = nk.zeros((128, 512), nk.float32, buffer=nk.psum)
    for kk in nk.affine_range(k // 128):
        at = nk.load(a[nk.ds(i * 128, 128), kk * 128:(kk + 1) * 128])
        bt = nk.load(b[kk * 128:(kk + 1) * 128, nk.ds(j * 512, 512)])
        acc += nk.matmul(at, bt)
    nk.store(out[nk.ds(i * 128, 128), nk.ds(j * 512, 512)], nk.copy(acc))
    return out


def test_tiled_matmul_accumulates_in_psum_over_an_affine_range():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((256, 384), np.float32), rng.standard_normal((384, 1024), np.float32)
    simulated, lowered = both(tiled_matmul[2, 2], a, b)
    np.testing.assert_allclose(simulated, a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(lowered, simulated, rtol=1e-4, atol=1e-4)


@nk.kernel
def constructs(x, scale):
    """transpose, where, iota, sequential_range (a running sum), tile views and in-place writes."""
    out = nk.ndarray((x.shape[1], x.shape[0]), x.dtype, buffer=nk.hbm)
    t = nk.load(x[:, :])
    running = nk.zeros((x.shape[0], 1), nk.float32)
    for c in nk.sequential_range(x.shape[1]):
        running[...] = running + t[:, c:c + 1]
        t[:, c:c + 1] = running
    cols = nk.iota(t.shape, 1)
    t = nk.where(cols % 2 == 0, t * scale, -t)
    nk.store(out[...], nk.transpose(t))
    return out


def test_constructs_agree_with_numpy():
    x = np.random.default_rng(2).standard_normal((64, 12)).astype(np.float32)
    expected = np.cumsum(x, axis=1)
    expected = np.where(np.arange(12) % 2 == 0, expected * 0.5, -expected).T
    simulated = constructs.simulate(x, 0.5)
    lowered = np.asarray(jax.jit(lambda a: constructs[()].lower(a, 0.5))(jnp.asarray(x)))
    np.testing.assert_allclose(simulated, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lowered, simulated, rtol=1e-5, atol=1e-5)


def test_kernels_take_cpu_tensors_and_return_them():
    import torch
    x = torch.randn(130, 16)
    y = softmax_rows[2](x)
    assert isinstance(y, torch.Tensor)
    torch.testing.assert_close(y, torch.softmax(x, -1))


# ------------------------------------------------------------------------------------------------ checks

def raises_at(rule, kernel, marker, launch, *args):
    with pytest.raises(nk.KernelError) as info:
        launch(*args)
    assert info.value.rule == rule, str(info.value)
    assert info.value.lineno == line_of(kernel, marker), str(info.value)
    assert info.value.filename == __file__
    return info.value


@nk.kernel
def too_many_partitions(x):
    out = nk.ndarray(x.shape, x.dtype, buffer=nk.hbm)
    nk.store(out[...], nk.load(x[...]))  # CHECK
    return out


def test_partition_over_128_is_reported_by_simulator_and_lowering():
    x = np.zeros((256, 4), np.float32)
    error = raises_at("partition", too_many_partitions, "# CHECK", too_many_partitions.simulate, x)
    assert "256 partitions" in str(error) and "argument 'x'" in str(error)
    raises_at("partition", too_many_partitions, "# CHECK", too_many_partitions, jnp.asarray(x))


@nk.kernel
def wide_matmul(a, b):
    out = nk.ndarray((128, 1024), nk.float32, buffer=nk.hbm)
    p = nk.matmul(nk.load(a[...]), nk.load(b[...]))  # CHECK
    nk.store(out[...], p)
    return out


@nk.kernel
def many_banks(x):
    out = nk.ndarray((128, 512), nk.float32, buffer=nk.hbm)
    tiles = [nk.zeros((128, 512), nk.float32, buffer=nk.psum) for _ in range(9)]  # CHECK
    nk.store(out[...], tiles[0])
    return out


def test_psum_overflow_a_bank_and_the_banks():
    a, b = np.zeros((128, 128), np.float32), np.zeros((128, 1024), np.float32)
    assert "free size 1024 > 512" in str(raises_at("psum", wide_matmul, "# CHECK", wide_matmul.simulate, a, b))
    raises_at("psum", wide_matmul, "# CHECK", wide_matmul, jnp.asarray(a), jnp.asarray(b))
    assert "8 banks" not in str(raises_at("psum", many_banks, "# CHECK", many_banks.simulate, np.zeros(1)))


@nk.kernel
def hoarder(x, n):
    out = nk.ndarray((128, 8192), nk.float32, buffer=nk.hbm)
    kept = []
    for _ in nk.sequential_range(n):
        kept.append(nk.zeros((128, 8192), nk.float32))  # CHECK
    nk.store(out[...], kept[0])
    return out


def test_sbuf_capacity_counts_live_tiles_only():
    assert hoarder.simulate(np.zeros(1), 6).shape == (128, 8192)  # 6 x 32 KiB of 192 KiB per partition
    raises_at("sbuf-capacity", hoarder, "# CHECK", hoarder.simulate, np.zeros(1), 7)


@nk.kernel
def reads_past_the_end(x):
    out = nk.ndarray((128, 4), x.dtype, buffer=nk.hbm)
    i = nk.program_id(0)
    nk.store(out[...], nk.load(x[nk.ds(i * 128, 128), :]))  # CHECK
    return out


@nk.kernel
def mask_too_short(x):
    out = nk.ndarray((128, 4), x.dtype, buffer=nk.hbm)
    rows = nk.iota((128, 1), 0)
    nk.store(out[...], nk.load(x[0:128, :], mask=rows < 120))  # CHECK
    return out


@nk.kernel
def stores_past_the_end(x):
    out = nk.ndarray((100, 4), x.dtype, buffer=nk.hbm)
    nk.store(out[0:128, :], nk.load(x[0:128, :]))  # CHECK
    return out


def test_out_of_bounds_without_a_mask_names_the_argument():
    x = np.zeros((200, 4), np.float32)
    error = raises_at("out-of-bounds", reads_past_the_end, "# CHECK", reads_past_the_end[2].simulate, x)
    assert "argument 'x'" in str(error)
    # the lowering sees past the traced program id: its bounds are the grid's
    raises_at("out-of-bounds", reads_past_the_end, "# CHECK", reads_past_the_end[2], jnp.asarray(x))
    assert reads_past_the_end[1].simulate(x).shape == (128, 4)
    raises_at("out-of-bounds", mask_too_short, "# CHECK", mask_too_short.simulate, np.zeros((110, 4), np.float32))
    raises_at("out-of-bounds", stores_past_the_end, "# CHECK", stores_past_the_end.simulate, x)


@nk.kernel
def overlapping_stores(x):
    out = nk.ndarray((128, 64), x.dtype, buffer=nk.hbm)
    for i in nk.affine_range(4):
        nk.store(out[:, i * 16:i * 16 + 32], nk.load(x[:, i * 16:i * 16 + 32]))  # CHECK
    return out


@nk.kernel
def carried_value(x):
    out = nk.ndarray((128, 16), x.dtype, buffer=nk.hbm)
    total = nk.load(x[:, 0:16])
    for i in nk.affine_range(3):
        total = total + nk.load(x[:, i * 16:i * 16 + 16])  # CHECK
    nk.store(out[...], total)
    return out


@nk.kernel
def carried_value_in_order(x):
    out = nk.ndarray((128, 16), x.dtype, buffer=nk.hbm)
    total = nk.load(x[:, 0:16])
    for i in nk.sequential_range(3):
        total = total + nk.load(x[:, i * 16:i * 16 + 16])
    nk.store(out[...], total)
    return out


@nk.kernel
def same_rows_every_program(x):
    out = nk.ndarray((128, 16), x.dtype, buffer=nk.hbm)
    nk.store(out[...], nk.load(x[...]))  # CHECK
    return out


@nk.kernel
def shared_tile_written(x):
    out = nk.ndarray((128, 16), x.dtype, buffer=nk.hbm)
    t = nk.zeros((128, 16), nk.float32)
    for i in nk.affine_range(2):
        t[...] = nk.load(x[:, i * 16:i * 16 + 16])  # CHECK
    nk.store(out[...], t)
    return out


def test_races_in_affine_range_and_across_programs():
    x = np.ones((128, 80), np.float32)
    error = raises_at("race", overlapping_stores, "# CHECK", overlapping_stores.simulate, x)
    assert "iteration 1" in str(error) and "iteration 0" in str(error)
    raises_at("race", carried_value, "# CHECK", carried_value.simulate, x)
    np.testing.assert_allclose(carried_value_in_order.simulate(x), np.full((128, 16), 4.0))
    raises_at("race", same_rows_every_program, "# CHECK", same_rows_every_program[2].simulate, x[:, :16])
    raises_at("race", shared_tile_written, "# CHECK", shared_tile_written.simulate, x)


@nk.kernel
def partition_reduction(x):
    out = nk.ndarray((1, 4), x.dtype, buffer=nk.hbm)
    nk.store(out[...], nk.sum(nk.load(x[...]), axis=0))  # CHECK
    return out


@nk.kernel
def reads_its_output(x):
    out = nk.ndarray(x.shape, x.dtype, buffer=nk.hbm)
    nk.store(out[...], nk.load(out[...]))  # CHECK
    return out


@nk.kernel
def writes_its_argument(x):
    nk.store(x[...], nk.load(x[...]))  # CHECK
    return x


@nk.kernel
def branches_on_a_tile(x):
    out = nk.ndarray(x.shape, x.dtype, buffer=nk.hbm)
    t = nk.load(x[...])
    if nk.max(t) > 0:  # CHECK
        t = -t
    nk.store(out[...], t)
    return out


@nk.kernel
def stores_the_wrong_shape(x):
    out = nk.ndarray(x.shape, x.dtype, buffer=nk.hbm)
    nk.store(out[...], nk.load(x[:, 0:2]))  # CHECK
    return out


@nk.kernel
def strided_tile_view(x):
    out = nk.ndarray(x.shape, x.dtype, buffer=nk.hbm)
    nk.store(out[...], nk.load(x[...])[:, ::2])  # CHECK
    return out


@nk.kernel
def float_mask(x):
    out = nk.ndarray(x.shape, x.dtype, buffer=nk.hbm)
    nk.store(out[...], nk.load(x[...], mask=nk.load(x[...])))  # CHECK
    return out


@nk.kernel
def differently_shaped_matmul(x):
    out = nk.ndarray((8, 8), x.dtype, buffer=nk.hbm)
    nk.store(out[...], nk.matmul(nk.load(x[...]), nk.load(x[...])))  # CHECK
    return out


@pytest.mark.parametrize("kernel, rule", [(partition_reduction, "reduction-axis"), (reads_its_output, "write-only"),
                                          (writes_its_argument, "read-only"),
                                          (branches_on_a_tile, "control-flow"), (stores_the_wrong_shape, "shape"),
                                          (strided_tile_view, "index"), (float_mask, "mask"),
                                          (differently_shaped_matmul, "shape")])
def test_language_rules(kernel, rule):
    x = np.ones((8, 4), np.float32)
    raises_at(rule, kernel, "# CHECK", kernel.simulate, x)
    raises_at(rule, kernel, "# CHECK", kernel, jnp.asarray(x))


def test_bad_launches_raise_pytorch_error_types():
    with pytest.raises(TypeError, match="kernel softmax_rows"):
        softmax_rows(np.zeros((4, 4)), np.zeros(1))
    with pytest.raises(ValueError, match="grid"):
        softmax_rows[0]
    with pytest.raises(RuntimeError, match="only inside a @kernel"):
        nk.load(None)


@nk.kernel
def gather_rows(x, index):
    out = nk.ndarray((index.shape[0], x.shape[1]), x.dtype, buffer=nk.hbm)
    rows = nk.load(index[:, None])
    nk.store(out[...], nk.load(x[rows, :], mask=rows >= 0))  # CHECK
    return out


def test_indirect_load_gathers_rows_and_checks_its_indices():
    x = np.random.default_rng(3).standard_normal((50, 8)).astype(np.float32)
    index = np.array([3, 0, -1, 49, 7], np.int32)
    expected = np.where(index[:, None] >= 0, x[index], 0)
    simulated, lowered = both(gather_rows[()], x, index)
    np.testing.assert_array_equal(simulated, expected)
    np.testing.assert_array_equal(lowered, expected)
    raises_at("out-of-bounds", gather_rows, "# CHECK", gather_rows.simulate, x, np.array([50], np.int32))


@nk.kernel
def checked(x, w):
    nk.expect(x, dtype=(nk.float32, nk.bfloat16), shape=(None, 16))  # CHECK
    out = nk.ndarray(x.shape, x.dtype, buffer=nk.hbm)
    nk.store(out[...], nk.exp(nk.load(x[...])) + nk.sum(nk.exp(nk.load(w[None, :]))))
    return out


def test_expect_names_the_argument_and_math_on_ints_is_float():
    assert checked.simulate(np.zeros((4, 16), np.float32), np.zeros(3, np.int32))[0, 0] == 4.0
    assert "argument 'x'" in str(raises_at("argument", checked, "# CHECK", checked.simulate,
                                           np.zeros((4, 16), np.int32), np.zeros(3, np.int32)))
    assert "(*, 16)" in str(raises_at("argument", checked, "# CHECK", checked, jnp.zeros((4, 8), jnp.float32), jnp.zeros(3)))


@nk.kernel
def first_rows_only(x):
    """Programs tile only the first 256 of 384 rows: the rest keep their zeros."""
    out = nk.ndarray(x.shape, x.dtype, buffer=nk.hbm)
    rows = nk.ds(nk.program_id(0) * 128, 128)
    nk.store(out[rows, :], nk.load(x[rows, :]) * 2.0)
    return out


def test_stores_that_tile_part_of_an_output():
    x = np.random.default_rng(4).standard_normal((384, 8)).astype(np.float32)
    simulated, lowered = both(first_rows_only[2], x)
    expected = np.concatenate([x[:256] * 2, np.zeros((128, 8), np.float32)])
    np.testing.assert_array_equal(simulated, expected)
    np.testing.assert_array_equal(lowered, expected)


@nk.kernel
def blockwise_row_max(x):
    """Per row, the max over 64-wide column blocks, carried through an nk.fori loop."""
    n, d = x.shape
    out = nk.ndarray((n, 1), x.dtype, buffer=nk.hbm)
    rows = nk.ds(nk.program_id(0) * 128, 128)

    def body(j, best, seen):
        cols = nk.iota((1, 64), 1) + j * 64
        block = nk.load(x[rows, nk.ds(j * 64, 64)], mask=cols < d, other=-1e30)
        return nk.maximum(best, nk.max(block)), seen + 1.0

    best, seen = nk.fori((d + 63) // 64, body, (nk.full((128, 1), -1e30, nk.float32), nk.zeros((1, 1), nk.float32)))
    nk.store(out[rows, :], best + 0.0 * seen)
    return out


@nk.kernel
def stores_in_a_loop_body(x):
    out = nk.ndarray(x.shape, x.dtype, buffer=nk.hbm)

    def body(j, t):
        nk.store(out[...], t)  # CHECK
        return t

    nk.fori(2, body, (nk.load(x[...]),))
    return out


@nk.kernel
def writes_outside_its_carry(x):
    out = nk.ndarray(x.shape, x.dtype, buffer=nk.hbm)
    total = nk.zeros(x.shape, nk.float32)

    def body(j, t):
        total[...] = t  # CHECK
        return t

    nk.fori(2, body, (nk.load(x[...]),))
    nk.store(out[...], total)
    return out


def test_fori_loops_once_in_the_lowering_and_checks_its_body():
    x = np.random.default_rng(5).standard_normal((256, 200)).astype(np.float32)
    simulated, lowered = both(blockwise_row_max[2], x)
    np.testing.assert_array_equal(simulated[:, 0], x.max(1))
    np.testing.assert_array_equal(lowered, simulated)
    text = jax.jit(lambda a: blockwise_row_max[2].lower(a)).lower(jnp.asarray(x)).as_text()
    assert "while" in text
    x = np.zeros((8, 4), np.float32)
    raises_at("fori", stores_in_a_loop_body, "# CHECK", stores_in_a_loop_body.simulate, x)
    raises_at("fori", stores_in_a_loop_body, "# CHECK", stores_in_a_loop_body, jnp.asarray(x))
    raises_at("fori", writes_outside_its_carry, "# CHECK", writes_outside_its_carry.simulate, x)
    raises_at("fori", writes_outside_its_carry, "# CHECK", writes_outside_its_carry, jnp.asarray(x))
