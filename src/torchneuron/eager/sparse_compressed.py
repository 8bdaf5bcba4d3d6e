"""Sparse compressed tensors (CSR, CSC, BSR, BSC) on neuron: PyTorch's SparseCsrTensorImpl of neuron parts.

PyTorch reports a compressed layout only for its own SparseCsrTensorImpl, so a neuron one is that impl, made
below the Python key from neuron compressed indices, plain indices and values, and seen from Python as a
`CompressedTensor` so that its ops, and ops mixing it with dense neuron tensors, come to `__torch_dispatch__`
(eager/sparse.py's `NeuronSparse`: its table, else PyTorch's decomposition, else the counted CPU fallback).
Its parts are read by PyTorch's CPU kernels for them, which only read the impl's members (other CPU kernels
would read its data as host memory, so none else is called). The ops below compute on the parts with dense
neuron ops, most through the COO coordinates of the entries (a searchsorted of the compressed indices), as
PyTorch's own kernels convert them: conversions from and to dense and COO tensors, products with dense
matrices (`torch.sparse.mm` with its reductions and their gradients, `torch.sparse.sampled_addmm`),
`sparse_mask`, elementwise ops that keep zeros zero, sums, the transpose between CSR and CSC.
"""
import math

import torch
from torch._C import DispatchKey, DispatchKeySet
from torch.utils._pytree import tree_map

from ..runtime.layout import contiguous_strides
from . import handlers, sparse
from .sparse import NeuronSparse, SparseTensor

aten = torch.ops.aten
_OPS = {}
_implements = handlers.registrar(_OPS)

# where the kernels reading an impl's members are (they are registered for the CPU, CUDA and meta keys only)
_MEMBER_KERNELS = DispatchKeySet(DispatchKey.SparseCsrCPU)
_ROW_MAJOR = (torch.sparse_csr, torch.sparse_bsr)
_BLOCKED = (torch.sparse_bsr, torch.sparse_bsc)
_TRANSPOSED = {torch.sparse_csr: torch.sparse_csc, torch.sparse_csc: torch.sparse_csr,
               torch.sparse_bsr: torch.sparse_bsc, torch.sparse_bsc: torch.sparse_bsr}
LAYOUTS = tuple(_TRANSPOSED)


class CompressedTensor(NeuronSparse):
    """A sparse CSR, CSC, BSR or BSC tensor on a neuron device."""

    _ops = _OPS


def compressed(compressed_indices, plain_indices, values, size, layout) -> CompressedTensor:
    """The `layout` tensor of these neuron parts (trusted: PyTorch's checks are the callers')."""
    with torch._C._ExcludeDispatchKeyGuard(DispatchKeySet(DispatchKey.Python)):
        impl = aten._sparse_compressed_tensor_unsafe.default(
            compressed_indices, plain_indices, values, size, dtype=values.dtype, layout=layout, device=values.device)
    return CompressedTensor._make_subclass(CompressedTensor, impl)


def _is_ours(value) -> bool:
    """A compressed neuron tensor: a CompressedTensor, or an impl a CPU kernel made for neuron below the Python
    key (`torch.empty_like(cpu_csr, device="neuron")`), whose parts are read alike."""
    return isinstance(value, torch.Tensor) and value.layout in LAYOUTS and value.device.type == "neuron"


def adopted(func, args, kwargs):
    """`func` with each compressed neuron tensor that is not a CompressedTensor (see `_is_ours`) seen as one: the
    kernel device/registration.py gives PyTorch for neuron's compressed layouts, which such tensors reach."""
    adopted_any = False

    def adopt(value):
        nonlocal adopted_any
        if _is_ours(value) and type(value) is not CompressedTensor:
            adopted_any = True
            return CompressedTensor._make_subclass(CompressedTensor, value, value.requires_grad)
        return value

    args, kwargs = tree_map(adopt, (args, kwargs))
    if not adopted_any:
        raise NotImplementedError(f"torchneuron: {func} has no kernel for compressed sparse layouts on neuron. "
                                  "Please report it at the project's issue tracker.")
    return func(*args, **kwargs)


def _member(op):
    def read(t):
        return op.redispatch(_MEMBER_KERNELS, t)
    return read


for _op in (aten.crow_indices, aten.col_indices, aten.ccol_indices, aten.row_indices, aten.values, aten._nnz,
            aten.sparse_dim, aten.dense_dim):
    _OPS[_op.default] = _member(_op.default)


def _parts(t):
    """`t`'s compressed indices, plain indices and values (aliases)."""
    if t.layout in _ROW_MAJOR:
        return _OPS[aten.crow_indices.default](t), _OPS[aten.col_indices.default](t), _OPS[aten.values.default](t)
    return _OPS[aten.ccol_indices.default](t), _OPS[aten.row_indices.default](t), _OPS[aten.values.default](t)


def _like(t, values, shape=None, layout=None):
    """A tensor with `t`'s indices and these values."""
    compressed_indices, plain_indices, _ = _parts(t)
    return compressed(compressed_indices, plain_indices, values, t.shape if shape is None else shape,
                      layout or t.layout)


def _coordinates(t):
    """COO indices of `t`'s entries in its own order (batch dimensions, then rows and columns, of blocks for
    BSR and BSC), and their values (nnz first, then the blocks' and dense dimensions)."""
    compressed_indices, plain_indices, values = _parts(t)
    batch = compressed_indices.shape[:-1]
    n, nnz = math.prod(batch), plain_indices.shape[-1]
    entries = torch.arange(nnz, device=values.device).repeat(n, 1)
    outer = torch.searchsorted(compressed_indices.reshape(n, -1), entries, right=True).flatten() - 1
    inner = plain_indices.reshape(-1)
    rows, columns = (outer, inner) if t.layout in _ROW_MAJOR else (inner, outer)
    position = torch.arange(n, device=values.device).repeat_interleave(nnz)
    batch_indices = [position // stride % size for stride, size in zip(contiguous_strides(batch), batch)]
    return torch.stack([*batch_indices, rows, columns]), values.reshape(n * nnz, *values.shape[len(batch) + 1:])


def _matrix_coordinates(t):
    """`_coordinates` of a 2-D CSR or CSC tensor: (rows, columns), values; None for any other."""
    return _coordinates(t) if _is_ours(t) and t.layout not in _BLOCKED and t.dim() == 2 else None


def _as_coo(t):
    """A 2-D CSR or CSC tensor as a COO tensor of the same entries, in its order (None for any other)."""
    coordinates = _matrix_coordinates(t)
    if coordinates is None:
        return None
    return SparseTensor(*coordinates, t.shape, t.layout is torch.sparse_csr)


# --- construction ----------------------------------------------------------------------------------------------

@handlers.handles(aten._sparse_compressed_tensor_unsafe.default)
def _from_parts(func, args, kwargs):
    compressed_indices, plain_indices, values, size = args
    device = torch.device(kwargs["device"]) if kwargs.get("device") is not None else values.device
    values = values.to(device=device, dtype=kwargs.get("dtype") or values.dtype)
    compressed_indices, plain_indices = compressed_indices.to(device), plain_indices.to(device)
    if device.type != "neuron":
        return aten._sparse_compressed_tensor_unsafe(compressed_indices, plain_indices, values, size,
                                                     dtype=values.dtype, layout=kwargs["layout"])
    return compressed(compressed_indices, plain_indices, values, size, kwargs["layout"])


@handlers.handles(aten.sparse_compressed_tensor.comp_plain_value_size, aten.sparse_compressed_tensor.comp_plain_value)
def _checked_from_parts(func, args, kwargs):
    """`torch.sparse_csr_tensor(...)` and its like: PyTorch's checks (and, without a size, the size it infers from
    the indices) on host copies of the indices, then the tensor of the parts."""
    compressed_indices, plain_indices, values, *size = args
    stand_in = torch.empty((), dtype=values.dtype).expand(values.shape)  # no values are read
    on_host = func(compressed_indices.cpu(), plain_indices.cpu(), stand_in, *size, **{**kwargs, "device": "cpu"})
    device = torch.device(kwargs["device"]) if kwargs.get("device") is not None else values.device
    return _from_parts(func, (compressed_indices, plain_indices, values.to(on_host.dtype), on_host.shape),
                       {"layout": on_host.layout, "device": device})


def _from_dense(layout, dense, blocksize=None, dense_dim=None):
    n_dense = dense_dim or 0
    n_batch = dense.dim() - 2 - n_dense
    block = tuple(blocksize) if layout in _BLOCKED else (1, 1)
    if n_batch < 0 or len(block) != 2 or any(b <= 0 or size % b for b, size in zip(block, dense.shape[n_batch:])):
        return NotImplemented  # the CPU's error
    batch, dense_shape = dense.shape[:n_batch], dense.shape[n_batch + 2:]
    # (*batch, block rows, block columns, *block, *dense), with the outer (compressed) dimension first
    blocks = dense.unflatten(n_batch + 1, (-1, block[1])).unflatten(n_batch, (-1, block[0]))
    blocks = blocks.movedim(n_batch + 1, n_batch + 2)
    if layout not in _ROW_MAJOR:
        blocks = blocks.transpose(n_batch, n_batch + 1)
    nonzero = (blocks != 0).flatten(n_batch + 2).any(-1)
    entries = nonzero.nonzero()
    n = math.prod(batch)
    counts = nonzero.reshape(n, -1).sum(-1)
    if n > 1 and bool((counts != counts[0]).any()):
        return NotImplemented  # the CPU's error: every batch needs as many entries
    nnz = entries.shape[0] // n
    outer = entries[:, n_batch].reshape(n, nnz).contiguous()
    boundaries = torch.arange(blocks.shape[n_batch] + 1, device=dense.device).repeat(n, 1)
    compressed_indices = torch.searchsorted(outer, boundaries).reshape(*batch, -1)
    plain_indices = entries[:, n_batch + 1].reshape(*batch, nnz)
    values = blocks[tuple(entries.t())]
    values = values.reshape(*batch, nnz, *(block if layout in _BLOCKED else ()), *dense_shape)
    return compressed(compressed_indices, plain_indices, values, dense.shape, layout)


def _to_compressed(layout):
    """The handler of `dense.to_sparse_csr()` and its like."""
    def handler(func, args, kwargs):
        named = dict(zip((a.name for a in func._schema.arguments), args)) | kwargs
        result = _from_dense(layout, named["self"], named.get("blocksize"), named.get("dense_dim"))
        return sparse._the_cpus_answer(func, args, kwargs) if result is NotImplemented else result
    return handler


for _layout, _op in sparse.TO_COMPRESSED.items():
    handlers.handles(_op.default)(_to_compressed(_layout))


def _coo_to_compressed(layout):
    """A 2-D COO tensor without dense dimensions as CSR or CSC (PyTorch keeps its entries, explicit zeros too)."""
    def convert(s, dense_dim=None):
        if not (s.dim() == sparse._sparse_dim(s) == 2 and not dense_dim):
            return NotImplemented
        s = s if s.coalesced else sparse._coalesce(s)
        outer, inner = s.indices_ if layout is torch.sparse_csr else s.indices_.flip(0)
        order = torch.argsort(outer * s.shape[0 if layout is torch.sparse_csc else 1] + inner)
        boundaries = torch.arange(s.shape[0 if layout is torch.sparse_csr else 1] + 1, device=s.device)
        return compressed(torch.searchsorted(outer[order], boundaries), inner[order], s.values_[order], s.shape,
                          layout)
    return convert


def _recompressed(layout):
    """A CSR matrix as CSC or the other way round: through its COO form."""
    to_layout = _coo_to_compressed(layout)

    def convert(t, dense_dim=None):
        coo = _as_coo(t)
        return NotImplemented if coo is None else to_layout(coo, dense_dim)
    return convert


for _layout in (torch.sparse_csr, torch.sparse_csc):
    sparse._OPS[sparse.TO_COMPRESSED[_layout].default] = _coo_to_compressed(_layout)
    _OPS[sparse.TO_COMPRESSED[_layout].default] = _recompressed(_layout)


# --- what it is, copies and conversions ------------------------------------------------------------------------

@_implements(aten.detach.default, aten.alias.default)
def _detach(t):
    return _like(t, _parts(t)[2])


@_implements(aten.clone.default)
def _clone(t, memory_format=None):
    compressed_indices, plain_indices, values = _parts(t)
    return compressed(compressed_indices.clone(), plain_indices.clone(), values.clone(), t.shape, t.layout)


@_implements(aten.empty_like.default)
def _empty_like(t, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    if not sparse.keeps_layout_and_device(t, layout, device):
        return NotImplemented
    compressed_indices, plain_indices, values = _parts(t)
    return compressed(compressed_indices.clone(), plain_indices.clone(), torch.empty_like(values, dtype=dtype),
                      t.shape, t.layout)


@_implements(aten.zeros_like.default)
def _zeros_like(t, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """No entries (as the CPU's)."""
    if not sparse.keeps_layout_and_device(t, layout, device):
        return NotImplemented
    compressed_indices, plain_indices, values = _parts(t)
    batch = compressed_indices.shape[:-1]
    return compressed(torch.zeros_like(compressed_indices), plain_indices.new_empty((*batch, 0)),
                      values.new_empty((*batch, 0, *values.shape[len(batch) + 1:]), dtype=dtype), t.shape, t.layout)


@_implements(aten._to_copy.default)
def _to_copy(t, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    if layout not in (None, t.layout) or memory_format not in (None, torch.preserve_format):
        return NotImplemented
    compressed_indices, plain_indices, values = _parts(t)
    values = values.to(device=device, dtype=dtype, copy=True)
    compressed_indices = compressed_indices.to(values.device, copy=True)
    plain_indices = plain_indices.to(values.device, copy=True)
    if values.device.type == "neuron":
        return compressed(compressed_indices, plain_indices, values, t.shape, t.layout)
    return aten._sparse_compressed_tensor_unsafe(compressed_indices, plain_indices, values, t.shape,
                                                 dtype=values.dtype, layout=t.layout)


@_implements(aten.copy_.default)
def _copy(t, src, non_blocking=False):
    if not (src.layout == t.layout and src.shape == t.shape and src._nnz() == t._nnz()):
        return NotImplemented
    for mine, theirs in zip(_parts(t), _parts(src)):  # a host source's parts are read alike
        mine.copy_(theirs)
    return t


@_implements(aten._to_dense.default)
def _to_dense(t, dtype=None, masked_grad=None):
    indices, values = _coordinates(t)
    if dtype is not None:
        values = values.to(dtype)
    n_batch = indices.shape[0] - 2
    if t.layout not in _BLOCKED:
        return sparse._add_into_dense(values.new_zeros(t.shape), indices, values)
    block = values.shape[1:3]
    grid = (*t.shape[:n_batch], *(size // b for size, b in zip(t.shape[n_batch:n_batch + 2], block)), *values.shape[1:])
    blocks = sparse._add_into_dense(values.new_zeros(grid), indices, values)
    return blocks.movedim(n_batch + 2, n_batch + 1).reshape(t.shape)


@_implements(aten._to_sparse.default, aten._to_sparse.sparse_dim)
def _to_coo(t, sparse_dim=None, layout=None, blocksize=None, dense_dim=None):
    """COO: the CPU gives a CSR tensor's entries coalesced, a CSC tensor's in its column order, uncoalesced."""
    n_dense = t.dense_dim()
    if (t.layout in _BLOCKED or layout not in (None, torch.sparse_coo) or blocksize is not None
            or sparse_dim not in (None, t.dim() - n_dense) or dense_dim not in (None, n_dense)):
        return NotImplemented
    indices, values = _coordinates(t)
    return SparseTensor(indices, values, t.shape, t.layout is torch.sparse_csr)


@_implements(aten.t.default, aten.transpose.int)
def _transpose(t, dim0=0, dim1=1):
    """CSR <-> CSC (BSR <-> BSC, its blocks transposed) of a matrix: the same parts read the other way."""
    if t.dim() != 2 or {dim0 % 2, dim1 % 2} != {0, 1}:
        return NotImplemented
    values = _parts(t)[2]
    if t.layout in _BLOCKED:
        values = values.transpose(1, 2)
    return _like(t, values, t.shape[::-1], _TRANSPOSED[t.layout])


# --- values ----------------------------------------------------------------------------------------------------

def _on_values(compute):
    """An op of each entry (and numbers) that keeps zeros zero: computed on the values."""
    def op(t, *numbers):
        if not (_is_ours(t) and all(map(sparse._is_number, numbers))):
            return NotImplemented
        return _like(t, compute(_parts(t)[2], *numbers))
    return op


def _on_values_in_place(compute, layouts=LAYOUTS):
    def op(t, *numbers):
        if not (_is_ours(t) and t.layout in layouts and all(map(sparse._is_number, numbers))):
            return NotImplemented
        compute(_parts(t)[2], *numbers)  # its values are the tensor's own: PyTorch's dtype checks
        return t
    return op


_KEEP_ZEROS = ("abs", "neg", "sgn", "sign", "sqrt", "sin", "sinh", "tan", "tanh", "asin", "asinh", "atan",
               "atanh", "erf", "erfinv", "expm1", "log1p", "trunc", "floor", "ceil", "round", "frac",
               "deg2rad", "rad2deg", "relu", "conj_physical")
for _name in _KEEP_ZEROS:
    _OPS[getattr(aten, _name).default] = _on_values(getattr(torch, _name))
    if hasattr(aten, _name + "_"):
        # the CPU rounds CSR tensors' values in place, not the other layouts'
        _OPS[getattr(aten, _name + "_").default] = _on_values_in_place(
            getattr(torch.Tensor, _name + "_"), (torch.sparse_csr,) if _name == "round" else LAYOUTS)
# (the CPU divides no compressed tensor)
_OPS[aten.mul.Tensor] = _OPS[aten.mul.Scalar] = _on_values(torch.mul)
_OPS[aten.mul_.Tensor] = _OPS[aten.mul_.Scalar] = _on_values_in_place(torch.Tensor.mul_)


@_implements(aten.sum.default)
def _sum(t, dtype=None):
    return _parts(t)[2].sum(dtype=dtype)


def _dense_and_compressed(a, b):
    """(dense, compressed) of a dense neuron tensor and a 2-D CSR or CSC one of its shape, either order; or None."""
    dense, other = (b, a) if _is_ours(a) else (a, b)
    if sparse._is_dense_neuron(dense) and _matrix_coordinates(other) is not None and dense.shape == other.shape:
        return dense, other
    return None


def _take_entries(t, source):
    """`t` takes `source`'s entries, in place (its parts resized: PyTorch's own kernel, dispatching to ours)."""
    aten.resize_as_sparse_.default.redispatch(_MEMBER_KERNELS, t, source)
    return _copy(t, source)


@_implements(aten.zero_.default)
def _zero(t):
    """No entries, as the CPU's."""
    return _take_entries(t, _zeros_like(t))


@_implements(aten.add.Tensor)
def _add(a, b, alpha=1):
    """A dense and a CSR or CSC tensor: dense. Two CSR tensors: CSR, both one's entries and the
    other's (coalesced, as the CPU's)."""
    mixed = _dense_and_compressed(a, b)
    if mixed is not None:
        # dense + alpha * sparse in either order, as the CPU computes it
        dense, other = mixed
        indices, values = _matrix_coordinates(other)
        dense = dense.to(torch.promote_types(dense.dtype, other.dtype), copy=True)
        return sparse._add_into_dense(dense, indices, sparse._scaled(values, alpha))
    if not (_is_ours(a) and _is_ours(b) and a.layout is b.layout is torch.sparse_csr and a.dtype == b.dtype
            and a.shape == b.shape):
        return NotImplemented
    summed = sparse._OPS[aten.add.Tensor](_as_coo(a), _as_coo(b), alpha)
    return NotImplemented if summed is NotImplemented else _coo_to_compressed(torch.sparse_csr)(summed)


@_implements(aten.add_.Tensor)
def _add_in_place(a, b, alpha=1):
    """A CSR or CSC tensor added into a dense one; a CSR one into a CSR one (which takes the sum's entries, as
    gradients accumulate)."""
    if sparse._is_dense_neuron(a):
        mixed = _dense_and_compressed(a, b)
        if mixed is None or not torch.can_cast(b.dtype, a.dtype):
            return NotImplemented
        indices, values = _matrix_coordinates(b)
        return sparse._add_into_dense(a, indices, sparse._scaled(values, alpha))
    summed = _add(a, b, alpha)
    if summed is NotImplemented or not _is_ours(summed):
        return NotImplemented
    return _take_entries(a, summed)


@_implements(aten.sparse_mask.default)
def _sparse_mask(source, mask):
    """`source`'s values where `mask` has entries, with `mask`'s indices."""
    if not (sparse._is_dense_neuron(source) and _is_ours(mask) and mask.layout not in _BLOCKED
            and source.shape == mask.shape):
        return NotImplemented
    indices, _ = _coordinates(mask)
    return _like(mask, source[tuple(indices)].reshape(_parts(mask)[2].shape))


# --- products --------------------------------------------------------------------------------------------------

def _with_coo(op):
    """A product of dense matrices and a CSR or CSC one, computed as with a COO one (eager/sparse.py)."""
    def product(*args, **kwargs):
        if not any(map(_is_ours, args)):
            return NotImplemented
        coo = [_as_coo(a) if _is_ours(a) else a for a in args]
        return NotImplemented if any(a is None for a in coo) else op(*coo, **kwargs)
    return product


_OPS[aten.mm.default] = _with_coo(sparse._mm)
_OPS[aten.addmm.default] = _with_coo(sparse._addmm)


def _matrix_product_check(t, other) -> bool:
    """Arguments of torch.sparse.mm's reductions that the CPU takes (else its error)."""
    return (t.layout is torch.sparse_csr and t.dtype.is_floating_point and t.dim() == 2 and sparse._is_dense_neuron(other) and other.dim() == 2
            and t.shape[1] == other.shape[0] and t.dtype == other.dtype)


def _row_counts(t):
    """The number of entries in each row of a CSR matrix, at least 1 (a mean's divisor)."""
    crow = _parts(t)[0]
    return (crow[1:] - crow[:-1]).clamp(min=1).unsqueeze(1)


@_implements(aten._sparse_mm_reduce_impl.default)
def _mm_reduce(t, other, reduce):
    """`torch.sparse.mm(csr, dense, reduce)`: each row's products summed, averaged or their extremes (zero for a
    row without entries), and, when training with amax/amin, the entry chosen for each output (as the CPU: the
    first of equals; the number of entries where none is)."""
    if not (_matrix_product_check(t, other) and reduce in ("sum", "mean", "amax", "amin")):
        return NotImplemented
    (rows, columns), values = _matrix_coordinates(t)
    products = values.unsqueeze(1) * other[columns]
    out = other.new_zeros((t.shape[0], other.shape[1]))
    nnz = values.shape[0]
    arg_out = rows.new_empty(0)
    if nnz == 0:
        return out, arg_out
    if reduce in ("sum", "mean"):
        out.index_add_(0, rows, products)
        return (out if reduce == "sum" else out / _row_counts(t)), arg_out
    rows_of = rows.unsqueeze(1).expand_as(products)
    out.scatter_reduce_(0, rows_of, products, reduce, include_self=False)
    if torch.is_grad_enabled() and (t.requires_grad or other.requires_grad):
        entry = torch.arange(nnz, device=rows.device).unsqueeze(1).expand_as(products)
        candidates = torch.where(products == out[rows], entry, nnz)
        arg_out = torch.full(out.shape, nnz, dtype=rows.dtype, device=rows.device)
        arg_out.scatter_reduce_(0, rows_of, candidates, "amin")
    return out, arg_out


@_implements(aten._sparse_mm_reduce_impl_backward.default)
def _mm_reduce_backward(t, grad_out, other, reduce, arg_out, output_mask):
    if not _matrix_product_check(t, other) or reduce not in ("sum", "mean", "amax", "amin"):
        return NotImplemented
    (rows, columns), values = _matrix_coordinates(t)
    grad_self = grad_other = None
    if reduce in ("sum", "mean"):
        grad = grad_out if reduce == "sum" else grad_out / _row_counts(t)
        if output_mask[0]:
            grad_self = _like(t, (grad[rows] * other[columns]).sum(1))
        if output_mask[1]:
            grad_other = torch.zeros_like(other).index_add_(0, columns, values.unsqueeze(1) * grad[rows])
        return grad_self, grad_other
    nnz = values.shape[0]
    chosen = arg_out < nnz
    entry = arg_out.clamp(max=max(nnz - 1, 0))
    column = columns[entry]
    if output_mask[0]:
        contribution = torch.where(chosen, grad_out * other.gather(0, column), 0)
        grad_self = _like(t, values.new_zeros(nnz).index_add_(0, entry.flatten(), contribution.flatten()))
    if output_mask[1]:
        contribution = torch.where(chosen, values[entry] * grad_out, 0)
        grad_other = torch.zeros_like(other).scatter_add_(0, column, contribution)
    return grad_self, grad_other


@_implements(aten.sparse_sampled_addmm.default)
def _sampled_addmm(t, mat1, mat2, beta=1, alpha=1):
    """beta * t + alpha * (mat1 @ mat2) at t's entries, with t's indices."""
    if not (t.layout is torch.sparse_csr and t.dim() == 2 and (t.dtype.is_floating_point or t.dtype.is_complex)
            and all(map(sparse._is_dense_neuron, (mat1, mat2)))
            and mat1.dim() == mat2.dim() == 2 and mat1.shape[1] == mat2.shape[0]
            and (mat1.shape[0], mat2.shape[1]) == tuple(t.shape) and t.dtype == mat1.dtype == mat2.dtype):
        return NotImplemented
    (rows, columns), values = _matrix_coordinates(t)
    products = sparse._scaled((mat1[rows] * mat2[:, columns].t()).sum(1), alpha)
    # as addmm: beta 0 ignores the input (its NaNs included)
    return _like(t, products if beta == 0 else products + sparse._scaled(values, beta))


@_implements(aten.sparse_sampled_addmm.out)
def _sampled_addmm_out(t, mat1, mat2, beta=1, alpha=1, out=None):
    result = _sampled_addmm(t, mat1, mat2, beta=beta, alpha=alpha)
    if result is NotImplemented or not _is_ours(out):
        return NotImplemented
    copied = _copy(out, result)
    return NotImplemented if copied is NotImplemented else out
