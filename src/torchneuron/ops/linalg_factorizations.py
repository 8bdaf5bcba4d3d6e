"""Matrix factorizations and the solvers built on them, in the LAPACK conventions PyTorch returns.

PyTorch's pivots are LAPACK's: 1-based int32 row interchanges; info tensors are int32, 0 on
success and LAPACK's positive code otherwise (read by `_linalg_check_errors`). Gradients come
from PyTorch's own formulas, which call these same ops.
"""
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import torch
from jax import lax

from ..runtime.dtypes import scalar_type_name, to_torch
from . import registry
from .checks import require
from .registry import lower

aten = torch.ops.aten


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return _mT(x).conj()


def _empty(dtype):
    """PyTorch's placeholder for an output a mode does not compute."""
    return jnp.zeros((0,), dtype)


def _real_dtype(x):
    return jnp.finfo(x.dtype).dtype


def _broadcast_batch(a, b):
    """Both matrices (or stacks) expanded to their common batch shape."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


def _first_index(mask):
    """LAPACK's info: the 1-based position of the first True along the last axis, 0 where there is none."""
    n = mask.shape[-1]
    first = jnp.min(jnp.where(mask, jnp.arange(1, n + 1, dtype=jnp.int32), n + 1), axis=-1, initial=n + 1)
    return jnp.where(first > n, 0, first)


# ---------------------------------------------------------------- errors

# PyTorch's messages, in the order it matches them against the API's name: `{1}` is LAPACK's info
_NOT_CONVERGED = ("The algorithm failed to converge because the input matrix is ill-conditioned or has too many "
                  "repeated {} (error code: {{1}}).")
_CHECK_MESSAGES = (
    ("inv", "The diagonal element {1} is zero, the inversion could not be completed because the input matrix is "
            "singular."),
    ("solve", "The solver failed because the input matrix is singular."),
    ("cholesky", "The factorization could not be completed because the input is not positive-definite (the "
                 "leading minor of order {1} is not positive-definite)."),
    ("svd", _NOT_CONVERGED.format("singular values")),
    ("eig", _NOT_CONVERGED.format("eigenvalues")),
    ("syevd", _NOT_CONVERGED.format("eigenvalues")),
    ("lstsq", "The least squares solution could not be computed because the input matrix does not have full rank "
              "(error code: {1})."),
    ("lu_factor", "U[{1},{1}] is zero and using it on lu_solve would result in a division by zero. If you still "
                  "want to perform the factorization, consider calling linalg.lu(A, pivot) or "
                  "linalg.lu_factor_ex(A, pivot)"),
)


@lower(aten._linalg_check_errors)
def linalg_check_errors(info, api_name, *, is_matrix):
    key, message = next(((k, m) for k, m in _CHECK_MESSAGES if k in api_name), (None, "Unknown error code: {1}."))
    # lu_factor's check and the internal assert for other codes (ldl_factor's) are RuntimeErrors
    error = torch.linalg.LinAlgError if key not in (None, "lu_factor") else RuntimeError
    batch = "" if is_matrix else ": (Batch element {0})"
    # the first failing matrix's place in the (flattened) batch, and its code
    require(info == 0, error, f"{api_name}{batch}: {message}",
            culprit=(jnp.arange(info.size).reshape(info.shape), info))


def _checked(info, check_errors, api_name, a):
    """`info`, raising at the next synchronisation when check_errors asks for it (the *_ex ops' flag)."""
    if check_errors:
        linalg_check_errors(info, api_name, is_matrix=a.ndim == 2)
    return info


# ---------------------------------------------------------------- LU and its solvers


def _lu(a):
    """LU with partial pivoting: the packed factors, 1-based pivots, getrf's info."""
    lu, pivots, _ = lax.linalg.lu(a)
    return lu, pivots + 1, _first_index(jnp.diagonal(lu, axis1=-2, axis2=-1) == 0)


def _permutation(pivots, m):
    """The row order LAPACK's interchanges produce: A[perm] = L @ U."""
    return lax.linalg.lu_pivots_to_permutation(pivots - 1, m)


def _lu_solve_left(lu, pivots, b, adjoint):
    """Solves A X = B (A^H X = B when `adjoint`) for A = P L U given as getrf returns it."""
    lu, b = _broadcast_batch(lu, b)
    perm = jnp.broadcast_to(_permutation(pivots, lu.shape[-1]), b.shape[:-1])
    solve = dict(left_side=True, transpose_a=adjoint, conjugate_a=adjoint)
    if not adjoint:  # L U X = P^T B
        y = jnp.take_along_axis(b, perm[..., None], axis=-2)
        y = lax.linalg.triangular_solve(lu, y, lower=True, unit_diagonal=True, **solve)
        return lax.linalg.triangular_solve(lu, y, lower=False, **solve)
    y = lax.linalg.triangular_solve(lu, b, lower=False, **solve)  # U^H L^H (P^T X) = B
    y = lax.linalg.triangular_solve(lu, y, lower=True, unit_diagonal=True, **solve)
    return jnp.take_along_axis(y, jnp.argsort(perm, axis=-1)[..., None], axis=-2)  # X[perm] = P^T X


def _lu_solve(lu, pivots, b, left=True, adjoint=False):
    if left:
        return _lu_solve_left(lu, pivots, b, adjoint)
    # X A = B  <=>  A^H X^H = B^H
    return _mH(_lu_solve_left(lu, pivots, _mH(b), not adjoint))


@lower(aten.linalg_lu_factor_ex)
def lu_factor_ex(a, *, pivot=True, check_errors=False):
    lu, pivots, info = _lu(a)
    return lu, pivots, _checked(info, check_errors, "torch.linalg.lu_factor_ex", a)


@lower(aten.linalg_lu_solve)
def lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    return _lu_solve(lu, pivots, b, left, adjoint)


@lower(aten.lu_unpack)
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    m, n = lu.shape[-2:]
    k = min(m, n)
    if unpack_pivots:
        perm = _permutation(pivots, m)
        # A = P L U with A[perm] = L U: column i of P is the unit vector e_perm[i]
        p = (perm[..., None, :] == jnp.arange(m)[:, None]).astype(lu.dtype)
    else:
        p = _empty(lu.dtype)
    if not unpack_data:
        return p, _empty(lu.dtype), _empty(lu.dtype)
    lower_part = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    return p, lower_part, jnp.triu(lu[..., :k, :])


@lower(aten.linalg_lu)
def linalg_lu(a, *, pivot=True):
    lu, pivots, _ = _lu(a)
    return lu_unpack(lu, pivots)


def _solve_is_vector(a, b):
    return b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])


def _solve_ex_out_meta(a, b, *, left=True, check_errors=False, result, LU, pivots, info):
    """PyTorch's meta kernel resizes the out tensors but returns new ones."""
    outs = dict(result=result, LU=LU, pivots=pivots, info=info)
    aten._linalg_solve_ex.result(a, b, left=left, check_errors=check_errors, **outs)
    return tuple(outs.values())


registry.META[aten._linalg_solve_ex.result] = _solve_ex_out_meta


@lower(aten._linalg_solve_ex)
def solve_ex(a, b, *, left=True, check_errors=False):
    vector = _solve_is_vector(a, b)
    b = b[..., None] if vector else b
    lu, pivots, info = _lu(a)
    x = _lu_solve(lu, pivots, b, left)
    return (x[..., 0] if vector else x), lu, pivots, _checked(info, check_errors, "torch.linalg.solve_ex", a)


@lower(aten.linalg_inv_ex)
def inv_ex(a, *, check_errors=False):
    lu, pivots, info = _lu(a)
    identity = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    return _lu_solve(lu, pivots, identity), _checked(info, check_errors, "linalg.inv_ex", a)


def _permutation_sign(pivots, dtype):
    swaps = jnp.sum(pivots != jnp.arange(1, pivots.shape[-1] + 1, dtype=pivots.dtype), axis=-1)
    return jnp.where(swaps % 2 == 0, 1, -1).astype(dtype)


def _determinant_lu(a):
    """The LU the CPU's det and slogdet return: of A^T for real A (det(A^T) = det(A)).

    Their backward formulas solve with it as an LU of A^T when A is contiguous and real, of A
    otherwise; a lowering does not see strides, so this assumes contiguous A, as tensors usually are.
    """
    lu, pivots, _ = _lu(a if jnp.iscomplexobj(a) else _mT(a))
    return lu, pivots, jnp.diagonal(lu, axis1=-2, axis2=-1)


@lower(aten._linalg_det)
def det(a):
    lu, pivots, diagonal = _determinant_lu(a)
    return _permutation_sign(pivots, a.dtype) * jnp.prod(diagonal, axis=-1), lu, pivots


@lower(aten._linalg_slogdet)
def slogdet(a):
    lu, pivots, diagonal = _determinant_lu(a)
    sign = _permutation_sign(pivots, a.dtype) * jnp.prod(jnp.sign(diagonal), axis=-1)
    return sign, jnp.sum(jnp.log(jnp.abs(diagonal)), axis=-1), lu, pivots


# ---------------------------------------------------------------- triangular solvers


def _triangular(a, b, upper, left=True, unitriangular=False, transpose=False):
    a, b = _broadcast_batch(a, b)
    x = lax.linalg.triangular_solve(
        a, b, left_side=left, lower=not upper, transpose_a=transpose, unit_diagonal=unitriangular
    )
    return x, a


@lower(aten.linalg_solve_triangular)
def solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    return _triangular(a, b, upper, left, unitriangular)[0]


@lower(aten.triangular_solve)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    return _triangular(a, b, upper, unitriangular=unitriangular, transpose=transpose)


# ---------------------------------------------------------------- Cholesky


def _potf2(a):
    """LAPACK's unblocked Cholesky (potf2, the CPU's) as it leaves a matrix that is not positive-definite:
    the factor's columns before the first pivot that is not positive computed, that pivot's value in its
    place, the rest of `a`'s lower triangle untouched; and info, that pivot's 1-based order (0: none).
    XLA's Cholesky fills a failed matrix with NaNs instead, telling neither."""
    n = a.shape[-1]
    rows = jnp.arange(n)

    def column(j, carry):
        factor, info = carry
        done = rows < j
        row = jnp.where(done, factor[..., j, :], 0)
        pivot = a[..., j, j].real - jnp.sum(jnp.abs(row) ** 2, axis=-1)
        running = info == 0
        fails = running & ~(pivot > 0)  # NaN fails too
        root = jnp.sqrt(jnp.where(fails, 1, pivot)).astype(a.dtype)
        products = jnp.einsum("...ik,...k->...i", jnp.where(done, factor, 0), row.conj())
        below = (a[..., :, j] - products) / root[..., None]
        factored = jnp.where(rows > j, below, jnp.where(rows == j, root[..., None], 0))
        failed = jnp.where(rows == j, pivot.astype(a.dtype)[..., None], factor[..., :, j])
        new = jnp.where((running & ~fails)[..., None], factored, jnp.where(fails[..., None], failed, factor[..., :, j]))
        return factor.at[..., :, j].set(new), jnp.where(fails, j + 1, info).astype(jnp.int32)

    factor, info = lax.fori_loop(0, n, column, (a, jnp.zeros(a.shape[:-2], jnp.int32)))
    return jnp.tril(factor), info


def _cholesky(a):
    """The lower factor and potrf's info (the order of the first leading minor that is not
    positive-definite, 0 on success), failed matrices left as the CPU leaves them (`_potf2`, run only
    when a matrix failed)."""
    factor = lax.linalg.cholesky(a, symmetrize_input=False)
    none_failed = jnp.zeros(a.shape[:-2], jnp.int32)
    if not a.size:
        return factor, none_failed
    failed = ~(jnp.diagonal(factor, axis1=-2, axis2=-1).real > 0).all(axis=-1)  # NaN, or a zero last pivot

    def redo():
        partial, info = _potf2(a)
        return jnp.where(failed[..., None, None], partial, factor), info

    return lax.cond(failed.any(), redo, lambda: (factor, none_failed))


@lower(aten.linalg_cholesky_ex)
def cholesky_ex(a, *, upper=False, check_errors=False):
    lower_factor, info = _cholesky(a)
    info = _checked(info, check_errors, "linalg.cholesky_ex", a)
    return (_mH(lower_factor) if upper else lower_factor), info


@lower(aten.cholesky)
def cholesky(a, upper=False):
    return cholesky_ex(a, upper=upper)[0]


def _cholesky_factor(factor, upper):
    return (_mH(factor) if upper else factor), True


@lower(aten.cholesky_solve)
def cholesky_solve(b, factor, upper=False):
    b, factor = _broadcast_batch(b, factor)
    return jsl.cho_solve(_cholesky_factor(factor, upper), b)


@lower(aten.cholesky_inverse)
def cholesky_inverse(factor, upper=False):
    identity = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return jsl.cho_solve(_cholesky_factor(factor, upper), identity)


# ---------------------------------------------------------------- LDL (Bunch-Kaufman)
#
# sytrf/hetrf with uplo='L', step for step as the unblocked sytf2/hetf2 (the blocked versions make the
# same choices): a column k pivots alone (1x1) or with one other (2x2), its interchange applied to the
# trailing block only, so the columns of L already computed keep their rows and sytrs replays the
# interchanges in the same order. The steps' sizes depend on the data: a while loop over k, each step
# a masked update of the whole matrix, the batch vmapped.

_BUNCH_KAUFMAN_ALPHA = (1 + 17**0.5) / 8  # the threshold that minimises the bound on element growth


def _conj_if(x, hermitian):
    return x.conj() if hermitian else x


def _cabs1(x):
    """|re| + |im|: the magnitude LAPACK's pivot choices compare (i?amax's)."""
    return jnp.abs(x.real) + jnp.abs(x.imag) if jnp.iscomplexobj(x) else jnp.abs(x)


def _block_product(x, y):
    """x @ y as a sum of products: in full precision, where a matmul may round float32 to TF32."""
    return jnp.sum(x[..., :, :, None] * y[..., None, :, :], axis=-2)


def _symmetric_from_lower(a, hermitian):
    """The matrix LAPACK's lower storage stands for: the upper triangle mirrors the lower one, and a
    Hermitian diagonal is real (hetrf ignores its imaginary parts)."""
    i, j = jnp.indices(a.shape)
    full = jnp.where(i >= j, a, _conj_if(a.T, hermitian))
    return jnp.where(i == j, full.real, full) if hermitian else full


def _pivot_block(a, s, step, hermitian):
    """The diagonal block D at s as a 2x2 matrix, a 1x1 block padded with 1 (so one inverse serves both)."""
    two = step == 2
    below = a[s + 1, s]  # clamped to the last row when s is
    first, last = a[s, s], a[s + 1, s + 1]
    if hermitian:
        first, last = first.real.astype(a.dtype), last.real.astype(a.dtype)
    zero = jnp.zeros((), a.dtype)
    return jnp.stack([
        jnp.stack([first, jnp.where(two, _conj_if(below, hermitian), zero)]),
        jnp.stack([jnp.where(two, below, zero), jnp.where(two, last, 1)]),
    ])


def _inverse_2x2(d):
    adjugate = jnp.stack([jnp.stack([d[1, 1], -d[0, 1]]), jnp.stack([-d[1, 0], d[0, 0]])])
    return adjugate / (d[0, 0] * d[1, 1] - d[0, 1] * d[1, 0])


def _block_columns(a, s, step):
    """Columns s and s+1 (the second only in a 2x2 block) below the block at s; zero elsewhere."""
    rows = jnp.arange(a.shape[0])[:, None]
    columns = jnp.take(a, jnp.stack([s, s + 1]), axis=1, mode="clip")
    return jnp.where((rows >= s + step) & (jnp.arange(2) < step), columns, 0)


def _interchange(n, kk, kp):
    """The row order that exchanges kk and kp."""
    index = jnp.arange(n)
    return jnp.where(index == kk, kp, jnp.where(index == kp, kk, index))


def _bunch_kaufman_choice(a, k):
    """sytf2's pivot for column k of the trailing block (stored whole): (kp, step, whether the column
    is zero or its diagonal nan, which LAPACK reports in info and leaves unfactored)."""
    index = jnp.arange(a.shape[0])
    alpha = jnp.asarray(_BUNCH_KAUFMAN_ALPHA, _real_dtype(a))
    absakk = _cabs1(a[k, k])
    column = jnp.where(index > k, _cabs1(a[:, k]), 0)
    imax = jnp.argmax(column)
    colmax = column[imax]
    rowmax = jnp.max(jnp.where((index >= k) & (index != imax), _cabs1(a[imax]), 0))
    singular = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
    alone = (absakk >= alpha * colmax) | (absakk >= alpha * colmax * (colmax / rowmax))
    keep = singular | alone
    kp = jnp.where(keep, k, imax)
    step = jnp.where(keep | (_cabs1(a[imax, imax]) >= alpha * rowmax), 1, 2)
    return kp, step, singular


def _sytf2_step(hermitian, state):
    """Column k (and k+1 for a 2x2 block): interchange, store L and D, update the trailing block."""
    k, a, pivots, info = state
    n = a.shape[0]
    kp, step, singular = _bunch_kaufman_choice(a, k)
    i, j = jnp.indices(a.shape)
    order = _interchange(n, k + step - 1, kp)
    a = jnp.where((i >= k) & (j >= k), a[order][:, order], a)

    # W = the columns below D; L = W D^-1, and the trailing block loses L D L^H = L W^H
    w = jnp.where(singular, 0, _block_columns(a, k, step))
    d = jnp.where(singular, jnp.eye(2, dtype=a.dtype), _pivot_block(a, k, step, hermitian))
    lower_factor = _block_product(w, _inverse_2x2(d))
    a = a - _block_product(lower_factor, _conj_if(w, hermitian).T)
    in_block = (j == k) | ((j == k + 1) & (step == 2))
    placed = jnp.where(j == k, lower_factor[:, :1], lower_factor[:, 1:])
    a = jnp.where(in_block & (i >= k + step) & ~singular, placed, a)

    pivot = jnp.where(step == 2, -(kp + 1), kp + 1).astype(jnp.int32)
    index = jnp.arange(n)
    pivots = jnp.where((index == k) | ((index == k + 1) & (step == 2)), pivot, pivots)
    info = jnp.where((info == 0) & singular, k + 1, info).astype(jnp.int32)
    return k + step, _symmetric_from_lower(a, hermitian), pivots, info


def _sytrf(a, hermitian):
    n = a.shape[0]
    state = (0, _symmetric_from_lower(a, hermitian), jnp.zeros(n, jnp.int32), jnp.zeros((), jnp.int32))
    _, a, pivots, info = lax.while_loop(lambda s: s[0] < n, lambda s: _sytf2_step(hermitian, s), state)
    return jnp.tril(a), pivots, info


@lower(aten.linalg_ldl_factor_ex)
def ldl_factor_ex(a, *, hermitian=False, check_errors=False):
    n = a.shape[-1]
    if n == 0:
        return a, jnp.zeros(a.shape[:-1], jnp.int32), jnp.zeros(a.shape[:-2], jnp.int32)
    ld, pivots, info = jnp.vectorize(lambda m: _sytrf(m, hermitian), signature="(n,n)->(n,n),(n),()")(a)
    return ld, pivots, _checked(info, check_errors, "torch.linalg.ldl_factor_ex", a)


def _block_size(pivots, k):
    """1 or 2: sytrf marks both rows of a 2x2 block with the negated pivot."""
    return jnp.where(pivots[k] < 0, 2, 1)


def _block_rows(b, s, step):
    rows = jnp.take(b, jnp.stack([s, s + 1]), axis=0, mode="clip")
    return jnp.where((jnp.arange(2) < step)[:, None], rows, 0)


def _set_block_rows(b, s, step, rows):
    index = jnp.arange(b.shape[0])[:, None]
    b = jnp.where(index == s, rows[:1], b)
    return jnp.where((index == s + 1) & (step == 2), rows[1:], b)


def _sytrs_forward(hermitian, ld, pivots, state):
    """One block of P L D y = b, first to last: interchange, eliminate below, divide by D."""
    s, b = state
    step = _block_size(pivots, s)
    b = b[_interchange(b.shape[0], s + step - 1, jnp.abs(pivots[s]) - 1)]
    rows = _block_rows(b, s, step)
    b = b - _block_product(_block_columns(ld, s, step), rows)
    d_inverse = _inverse_2x2(_pivot_block(ld, s, step, hermitian))
    return s + step, _set_block_rows(b, s, step, _block_product(d_inverse, rows))


def _sytrs_backward(hermitian, ld, pivots, state):
    """One block of L^H P^T x = y, last to first: subtract the rows below, undo the interchange."""
    kk, b = state
    step = _block_size(pivots, kk)
    s = kk - step + 1
    below = _conj_if(_block_columns(ld, s, step), hermitian).T
    b = _set_block_rows(b, s, step, _block_rows(b, s, step) - _block_product(below, b))
    return s - 1, b[_interchange(b.shape[0], kk, jnp.abs(pivots[kk]) - 1)]


def _sytrs(ld, pivots, b, hermitian):
    n = ld.shape[0]
    _, b = lax.while_loop(lambda s: s[0] < n, lambda s: _sytrs_forward(hermitian, ld, pivots, s), (0, b))
    _, b = lax.while_loop(lambda s: s[0] >= 0, lambda s: _sytrs_backward(hermitian, ld, pivots, s), (n - 1, b))
    return b


@lower(aten.linalg_ldl_solve)
def ldl_solve(ld, pivots, b, *, hermitian=False):
    if ld.shape[-1] == 0:
        return jnp.broadcast_to(b, jnp.broadcast_shapes(ld.shape[:-2], b.shape[:-2]) + b.shape[-2:])
    solve = jnp.vectorize(lambda *m: _sytrs(*m, hermitian), signature="(n,n),(n),(n,k)->(n,k)")
    return solve(ld, pivots, b)


# ---------------------------------------------------------------- QR and Householder reflectors


@lower(aten.linalg_qr)
def qr(a, mode="reduced"):
    if mode == "r":
        return _empty(a.dtype), jnp.linalg.qr(a, mode="r")
    return jnp.linalg.qr(a, mode=mode)


def _geqrf_meta(a):
    """PyTorch registers no meta kernel for geqrf: the packed factors column-major, as LAPACK writes them."""
    from torch._prims_common import make_contiguous_strides_for

    torch._check(a.ndim >= 2, lambda: "torch.geqrf: input must have at least 2 dimensions.")
    packed = torch.empty_strided(a.shape, make_contiguous_strides_for(a.shape, row_major=False), dtype=a.dtype, device=a.device)
    return packed, a.new_empty((*a.shape[:-2], min(a.shape[-2:])))


def _geqrf_out_meta(input, *, a, tau):
    from torch._prims_common.wrappers import _maybe_resize_out

    for out, result in zip((a, tau), _geqrf_meta(input)):
        _maybe_resize_out(out, result.shape)
    return a, tau


registry.META[aten.geqrf.a] = _geqrf_out_meta


@lower(aten.geqrf, meta=_geqrf_meta)
def geqrf(a):
    from jax._src.lax.linalg import geqrf as lapack_geqrf  # not exported by jax.lax.linalg

    return lapack_geqrf(a)


@lower(aten.linalg_householder_product)
def householder_product(a, tau):
    return lax.linalg.householder_product(a, tau)


@lower(aten.ormqr)
def ormqr(a, tau, other, left=True, transpose=False):
    return lax.linalg.ormqr(a, tau, other, left=left, transpose=transpose)


# ---------------------------------------------------------------- spectral


@lower(aten._linalg_svd)
def svd(a, full_matrices=False, compute_uv=True, driver=None):
    if not compute_uv:
        return _empty(a.dtype), lax.linalg.svd(a, compute_uv=False), _empty(a.dtype)
    return tuple(lax.linalg.svd(a, full_matrices=full_matrices))


@lower(aten._linalg_eigh)
def eigh(a, UPLO="L", compute_v=True):
    vectors, values = lax.linalg.eigh(a, lower=UPLO == "L", symmetrize_input=False)
    return values, (vectors if compute_v else _empty(a.dtype))


@lower(aten.linalg_eig)
def eig(a):
    return tuple(lax.linalg.eig(a, compute_left_eigenvectors=False))


@lower(aten.linalg_matrix_exp)
def matrix_exp(a):
    if a.dtype in (jnp.bfloat16, jnp.float16):  # expm takes no half precision; PyTorch's CPU kernel does
        return jsl.expm(a.astype(jnp.float32)).astype(a.dtype)
    return jsl.expm(a)


@lower(aten.linalg_pinv.atol_rtol_tensor)
def pinv(a, *, atol=None, rtol=None, hermitian=False):
    real = _real_dtype(a)
    if rtol is None:
        default = jnp.finfo(real).eps * max(a.shape[-2:])
        rtol = default if atol is None else jnp.where(atol > 0, 0, default)
    atol = 0 if atol is None else atol
    if hermitian:
        values, vectors = eigh(a)
        magnitude = jnp.abs(values)
        largest = magnitude.max(-1, keepdims=True, initial=0)
        tolerance = jnp.maximum(jnp.asarray(atol)[..., None], jnp.asarray(rtol)[..., None] * largest)
        inverse = jnp.where(magnitude > tolerance, 1 / values, 0).astype(a.dtype)
        return jnp.matmul(vectors * inverse[..., None, :], _mH(vectors))
    u, s, vh = svd(a)
    tolerance = jnp.maximum(jnp.asarray(atol)[..., None], jnp.asarray(rtol)[..., None] * s[..., :1])
    inverse = jnp.where(s > tolerance, 1 / s, 0).astype(a.dtype)
    return jnp.matmul(_mH(vh) * inverse[..., None, :], _mH(u))


# ---------------------------------------------------------------- least squares

_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def _check_lstsq(a, b, driver):
    """PyTorch's argument checks (linalg_lstsq has no meta kernel)."""
    name = "torch.linalg.lstsq"
    torch._check(a.ndim >= 2, lambda: f"{name}: input must have at least 2 dimensions.")
    torch._check(b.ndim >= 1, lambda: f"{name}: other must have at least 1 dimension.")
    torch._check(
        a.dtype == b.dtype,
        lambda: f"{name}: Expected input and other to have the same dtype, but got input's dtype "
        f"{scalar_type_name(to_torch(a.dtype))} and other's dtype {scalar_type_name(to_torch(b.dtype))}",
    )
    torch._check(jnp.issubdtype(a.dtype, jnp.inexact), lambda: "This function doesn't handle types other than float and double")
    torch._check(
        0 <= a.ndim - b.ndim <= 1,
        lambda: f"{name}: input.dim() must be greater or equal to other.dim() and (input.dim() - other.dim()) <= 1",
    )
    vector = _lstsq_vector_case(a, b)
    torch._check(
        a.shape[-2] == b.shape[-1 if vector else -2],
        lambda: f"{name}: input.size(-2) should match other.size({-1 if vector else -2})",
    )
    torch._check(driver in _LSTSQ_DRIVERS, lambda: f"{name}: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)")


def _lstsq_vector_case(a, b) -> bool:
    """PyTorch's rule (linalg_solve_is_vector_rhs): `other` is a vector, or a batch of vectors shaped as
    `input` less its last dimension; any other `other` of one dimension less is one matrix."""
    return b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])


def _lstsq_right_hand_sides(a, b):
    """`other` (matrices) expanded to the batch the CPU solves for: `input`'s batch dimensions broadcast
    against as many leading dimensions of `other`, so a matrix `other` of one dimension less is solved once
    for each of its rows (PyTorch's own quirk), and a mismatch raises the CPU's error. `input` keeps its own
    batch, which the rank and singular values have on the CPU."""
    batch = tuple(torch._C._infer_size(torch.Size(a.shape[:-2]), torch.Size(b.shape[:a.ndim - 2])))
    return jnp.broadcast_to(b, batch + b.shape[-2:])


# whether the residuals exist depends on the rank found: eager runs this on concrete arrays
@lower(aten.linalg_lstsq, dynamic_shape=True)
def lstsq(a, b, rcond=None, *, driver=None):
    """The minimum-norm solution through the SVD, with the outputs each LAPACK driver reports."""
    driver = driver or "gelsy"
    _check_lstsq(a, b, driver)
    vector = _lstsq_vector_case(a, b)
    b = _lstsq_right_hand_sides(a, b[..., None] if vector else b)
    m, n = a.shape[-2:]
    real = _real_dtype(a)
    if rcond is None:
        rcond = jnp.finfo(real).eps * max(m, n)
    u, s, vh = lax.linalg.svd(a, full_matrices=False)
    kept = s > rcond * s[..., :1]
    inverse = jnp.where(kept, 1 / s, 0).astype(a.dtype)
    x = jnp.matmul(_mH(vh), inverse[..., None] * jnp.matmul(_mH(u), b))
    rank = kept.sum(-1, dtype=jnp.int64)
    full_rank = driver == "gels" or bool(jnp.all(rank == n))
    if m > n and driver != "gelsy" and full_rank:
        residuals = jnp.sum(jnp.abs(jnp.matmul(a, x) - b) ** 2, axis=-2).astype(real)
    else:
        residuals = _empty(real)
    return (
        x[..., 0] if vector else x,
        residuals,
        _empty(jnp.int64) if driver == "gels" else rank,
        s if driver in ("gelsd", "gelss") else _empty(real),
    )
