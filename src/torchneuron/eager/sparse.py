"""Sparse COO tensors on neuron: their indices and values are neuron tensors, and each op runs as dense ops on them.

A sparse tensor is what `nn.Embedding(sparse=True)` gives its weight as a gradient, what SGD, Adagrad and
SparseAdam step with, and what `torch.sparse.mm` multiplies. `SparseTensor` keeps the indices (sparse_dim x
nnz, int64) and values (nnz x dense sizes) of one, as PyTorch's SparseTensorImpl does; the ops below compute
on them with the dense ops every neuron tensor runs (index_put_, index_add_, unique), as PyTorch's CPU and
CUDA kernels compose theirs. Any other op on a sparse tensor, or one with arguments these do not take, runs on
the CPU and comes back (eager/fallback.py: counted and reported, as every fallback); arguments the CPU refuses
get its error, and are no fallback.
"""

import functools

import torch
from torch.utils._pytree import tree_map_only

from ..ops import rules
from ..runtime.layout import contiguous_strides
from ..runtime.tensor import host_copy_reduction
from . import fallback, handlers
from .executable import Compute

aten = torch.ops.aten
_OPS = {}


class NeuronSparse(torch.Tensor):
    """What neuron's sparse tensors share: their ops go to the class's table (`_ops`), else to PyTorch's
    decomposition or the counted CPU fallback; they print as CUDA's do and pickle as a host copy."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = cls._ops.get(func)
        if op is None and torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            op = func.decompose  # below autograd (an op called by these) they arrive undecomposed
        elif op is None and func._schema.name.startswith("aten::_foreach_"):
            # PyTorch's loop over the lists (an optimizer's step over sparse gradients), each op coming back here
            return handlers.run_device_generic_kernel(func, args, kwargs)
        result = NotImplemented if op is None else op(*args, **kwargs)
        if result is not NotImplemented:
            return result
        if op is not None:
            return _the_cpus_answer(func, args, kwargs)  # bad input to an op handled here is no fallback
        return fallback.run_on_cpu(func, args, kwargs)

    def __repr__(self, *, tensor_contents=None):
        # PyTorch names subclasses in the prefix and indents by it; users of a device expect plain `tensor(`
        text = torch._tensor_str._str(self, tensor_contents=tensor_contents)
        ours = len(type(self).__name__) + 1
        return "tensor(" + text[ours:].replace("\n" + " " * ours, "\n" + " " * len("tensor("))

    def __reduce_ex__(self, protocol):
        return host_copy_reduction(self)


class SparseTensor(NeuronSparse):
    """A sparse COO tensor on a neuron device (`layout` torch.sparse_coo, `is_sparse` True)."""

    _ops = _OPS

    @staticmethod
    def __new__(cls, indices, values, size, coalesced=None):
        tensor = torch.Tensor._make_wrapper_subclass(cls, size, dtype=values.dtype, device=values.device,
                                                     layout=torch.sparse_coo)
        # unless told, as PyTorch's: coalesced if it has fewer than two entries
        tensor.indices_, tensor.values_ = indices, values
        tensor.coalesced = indices.shape[1] < 2 if coalesced is None else coalesced
        return tensor


_implements = handlers.registrar(_OPS)


def _the_cpus_answer(func, args, kwargs):
    """What the CPU raises for these arguments (asked on host copies; no fallback), else its result (a counted
    fallback)."""
    on_host = tree_map_only(torch.Tensor, lambda t: t.cpu() if t.device.type == "neuron" else t, (args, kwargs))
    try:
        func(*on_host[0], **on_host[1])
    except Exception as error:
        raise error from None
    return fallback.run_on_cpu(func, args, kwargs)


def keeps_layout_and_device(t, layout, device) -> bool:
    """Whether a `*_like` op asked for `layout` and `device` makes a tensor of `t`'s own (the ones handled here)."""
    return layout in (None, t.layout) and (device is None or torch.device(device) == t.device)


def _sparse_dim(s) -> int:
    return s.indices_.shape[0]


def _dense_shape(s) -> tuple:
    return tuple(s.shape[_sparse_dim(s):])


def _is_ours(value) -> bool:
    return type(value) is SparseTensor


def _is_dense_neuron(value) -> bool:
    return isinstance(value, torch.Tensor) and value.layout == torch.strided and value.device.type == "neuron"


# --- construction ----------------------------------------------------------------------------------------------

@handlers.handles(aten._sparse_coo_tensor_with_dims_and_tensors.default)
def _from_indices_and_values(func, args, kwargs):
    sparse_dim, dense_dim, size, indices, values = args
    # the meta kernel gives PyTorch's errors for inconsistent sizes, before anything is made
    on_meta = [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in (indices, values)]
    meta = func(sparse_dim, dense_dim, size, *on_meta, **{**kwargs, "device": "meta"})
    device = torch.device(kwargs["device"]) if kwargs.get("device") is not None else values.device
    if indices.device != device or values.device != device:
        indices, values = indices.to(device), values.to(device)
    return SparseTensor(indices, values.to(meta.dtype), meta.shape, kwargs.get("is_coalesced"))


# the op converting a dense tensor to each compressed layout (eager/sparse_compressed.py handles them)
TO_COMPRESSED = {torch.sparse_csr: aten._to_sparse_csr, torch.sparse_csc: aten._to_sparse_csc,
                  torch.sparse_bsr: aten._to_sparse_bsr, torch.sparse_bsc: aten._to_sparse_bsc}


@handlers.handles(aten._to_sparse.default, aten._to_sparse.sparse_dim)
def _from_dense(func, args, kwargs):
    dense = args[0]
    layout = kwargs.get("layout")
    if func is aten._to_sparse.sparse_dim:
        sparse_dim = args[1]
    elif layout in TO_COMPRESSED:
        blocksize = kwargs.get("blocksize")
        if (blocksize is None) == (layout in (torch.sparse_bsr, torch.sparse_bsc)):
            return _the_cpus_answer(func, args, kwargs)  # its error
        # eager/sparse_compressed.py's, as `to_sparse_csr()` and its like
        return TO_COMPRESSED[layout](dense, *([] if blocksize is None else [blocksize]), kwargs.get("dense_dim"))
    else:
        sparse_dim = dense.dim() - (kwargs.get("dense_dim") or 0)
    if not 0 < sparse_dim <= dense.dim():
        return _the_cpus_answer(func, args, kwargs)  # its error
    nonzero = dense != 0
    if sparse_dim < dense.dim():
        nonzero = nonzero.flatten(sparse_dim).any(-1)
    indices = nonzero.nonzero().t().contiguous()
    return SparseTensor(indices, dense[tuple(indices)], dense.shape, True)


@handlers.handles(aten._embedding_bag_backward.default)
def _embedding_bag_backward(func, args, kwargs):
    """EmbeddingBag's weight gradient: sparse (sparse=True) made by PyTorch's composite of dense ops; dense, by
    its lowering."""
    named = {argument.name: value for argument, value in zip(func._schema.arguments, args)} | kwargs
    if not named["sparse"]:
        return Compute(rules.rule(func))(func, args, kwargs)
    del named["maximum_indices"], named["sparse"]
    return aten._embedding_bag_sparse_backward(**named)


def _empty_like(s):
    return SparseTensor(s.indices_.new_empty((_sparse_dim(s), 0)), s.values_.new_empty((0, *_dense_shape(s))),
                        s.shape, True)


def _with_dims(sparse_dim, dense_dim, size, dtype=None, layout=None, device=None, pin_memory=None):
    """A sparse tensor with no entries: `torch.sparse_coo_tensor(size=...)`, `torch.zeros(..., layout=...)`."""
    meta = aten._sparse_coo_tensor_with_dims(sparse_dim, dense_dim, size, dtype=dtype, layout=torch.sparse_coo,
                                             device="meta")  # PyTorch's errors
    indices = torch.empty((sparse_dim, 0), dtype=torch.int64, device=device)
    return SparseTensor(indices, torch.empty((0, *size[sparse_dim:]), dtype=meta.dtype, device=device), size, True)


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _with_dims(len(size), 0, size, dtype, layout, device, pin_memory)


# factories below the Python key (no tensor argument), which device/registration.py gives PyTorch for neuron's
# sparse dispatch key
FACTORIES = {"empty.memory_format": _empty, "_sparse_coo_tensor_with_dims": _with_dims}


# --- what a sparse tensor is -----------------------------------------------------------------------------------

@_implements(aten._indices.default)
def _indices(s):
    return s.indices_.view(s.indices_.shape)  # an alias, as PyTorch's


@_implements(aten._values.default)
def _values(s):
    return s.values_.view(s.values_.shape)


def _coalesced_only(read):
    def of_coalesced(s):
        return read(s) if s.coalesced else NotImplemented
    return of_coalesced


_OPS[aten.indices.default] = _coalesced_only(_indices)
_OPS[aten.values.default] = _coalesced_only(_values)
_OPS[aten._nnz.default] = lambda s: s.indices_.shape[1]
_OPS[aten.sparse_dim.default] = _sparse_dim
_OPS[aten.dense_dim.default] = lambda s: s.values_.dim() - 1
_OPS[aten.is_coalesced.default] = lambda s: s.coalesced


@_implements(aten._coalesced_.default)
def _set_coalesced(s, coalesced):
    s.coalesced = coalesced
    return s


@_implements(aten.detach.default, aten.alias.default)
def _detach(s):
    return SparseTensor(s.indices_, s.values_, s.shape, s.coalesced)


@_implements(aten.clone.default)
def _clone(s, memory_format=None):
    return SparseTensor(s.indices_.clone(), s.values_.clone(), s.shape, s.coalesced)


# --- coalescing and conversions --------------------------------------------------------------------------------

def _linear_index(indices, sizes):
    strides = torch.tensor(contiguous_strides(sizes), dtype=torch.int64, device=indices.device)
    return (indices * strides.unsqueeze(1)).sum(0)


@_implements(aten._coalesce.default)
def _coalesce(s):
    sizes = s.shape[:_sparse_dim(s)]
    unique, inverse = torch.unique(_linear_index(s.indices_, sizes), sorted=True, return_inverse=True)
    values = s.values_.new_zeros((unique.numel(), *_dense_shape(s))).index_add_(0, inverse, s.values_)
    indices = [unique // stride % size for stride, size in zip(contiguous_strides(sizes), sizes)]
    indices = torch.stack(indices) if indices else s.indices_.new_empty((0, unique.numel()))
    return SparseTensor(indices, values, s.shape, True)


def _coalesced(s):
    return s if s.coalesced else _coalesce(s)


@_implements(aten._to_dense.default)
def _to_dense(s, dtype=None, masked_grad=None):
    values = s.values_ if dtype is None else s.values_.to(dtype)
    return _add_into_dense(values.new_zeros(s.shape), s.indices_, values)


@_implements(aten._to_copy.default)
def _to_copy(s, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    if layout not in (None, torch.sparse_coo) or memory_format is not None:
        return NotImplemented
    values = s.values_.to(device=device, dtype=dtype, copy=True)
    indices = s.indices_.to(device=values.device, copy=True)
    if values.device.type == "neuron":
        return SparseTensor(indices, values, s.shape, s.coalesced)
    return torch.sparse_coo_tensor(indices, values, s.shape, is_coalesced=s.coalesced, check_invariants=False)


@_implements(aten.copy_.default)
def _copy(s, src, non_blocking=False):
    if not src.is_sparse or src.shape != s.shape or src.dtype != s.dtype:
        return NotImplemented
    s.indices_, s.values_ = src._indices().to(s.device, copy=True), src._values().to(s.device, copy=True)
    s.coalesced = src.is_coalesced()
    return s


@_implements(aten.resize_as_.default, aten.sparse_resize_.default, aten.sparse_resize_and_clear_.default)
def _resize(s, size_or_source, *dims):
    size = size_or_source.shape if isinstance(size_or_source, torch.Tensor) else torch.Size(size_or_source)
    if size != s.shape or dims and tuple(dims) != (_sparse_dim(s), s.values_.dim() - 1):
        raise NotImplementedError(
            f"torchneuron: a sparse neuron tensor keeps its shape and dimensions ({list(s.shape)}, asked "
            f"{list(size)}); make a new one (torch.sparse_coo_tensor). Please report it at the project's issue "
            "tracker if you need this.")
    return s


@_implements(aten.zero_.default)
def _zero(s):
    empty = _empty_like(s)
    s.indices_, s.values_, s.coalesced = empty.indices_, empty.values_, True
    return s


@_implements(aten.zeros_like.default, aten.empty_like.default)
def _nothing_like(s, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    if not keeps_layout_and_device(s, layout, device):
        return NotImplemented
    empty = _empty_like(s)
    return empty if dtype is None else _to_copy(empty, dtype=dtype)


def _values_at(s, indices):
    """A coalesced `s`'s values at `indices` (zeros where it has no entry)."""
    sizes = s.shape[:_sparse_dim(s)]
    wanted = _linear_index(indices, sizes)
    if not s.values_.shape[0]:
        return s.values_.new_zeros((wanted.numel(), *_dense_shape(s)))
    entries = _linear_index(s.indices_, sizes)  # sorted: coalesced
    at = torch.searchsorted(entries, wanted).clamp(max=entries.numel() - 1)
    found = (entries[at] == wanted).view(-1, *[1] * len(_dense_shape(s)))
    return torch.where(found, s.values_[at], 0)


@_implements(aten.sparse_mask.default)
def _sparse_mask(source, mask):
    """`source`'s values where `mask` has entries (zero where a sparse `source` has none), with `mask`'s indices."""
    if not (_is_ours(mask) and _sparse_dim(mask) and source.device == mask.device and source.shape == mask.shape):
        return NotImplemented
    if _is_dense_neuron(source):
        values = source[tuple(mask.indices_)]
    elif _is_ours(source) and _sparse_dim(source) == _sparse_dim(mask):
        values = _values_at(_coalesced(source), mask.indices_)
    else:
        return NotImplemented
    return SparseTensor(mask.indices_, values, mask.shape, mask.coalesced)


# --- arithmetic ------------------------------------------------------------------------------------------------

def _scaled(values, alpha):
    return values if alpha == 1 else values * alpha


def _sum_of(sign):
    """add (sign 1) or sub (-1) of a dense and a sparse tensor (dense), or of two sparse tensors (sparse)."""
    def add(a, b, alpha=1):
        if _is_dense_neuron(a) and _is_ours(b) and a.shape == b.shape:
            dense = a.to(torch.promote_types(a.dtype, b.dtype), copy=True)
            return _add_into_dense(dense, b.indices_, _scaled(b.values_, sign * alpha))
        if _is_ours(a) and _is_ours(b) and a.shape == b.shape and _sparse_dim(a) == _sparse_dim(b):
            dtype = torch.promote_types(a.dtype, b.dtype)
            summed = SparseTensor(torch.cat([a.indices_, b.indices_], 1),
                                  torch.cat([a.values_.to(dtype), _scaled(b.values_, sign * alpha).to(dtype)]),
                                  a.shape)
            # as the CPU merges two coalesced tensors into a coalesced one
            return _coalesce(summed) if a.coalesced and b.coalesced else summed
        return NotImplemented
    return add


def _sum_in_place_of(sign):
    add = _sum_of(sign)

    def add_(a, b, alpha=1):
        if _is_dense_neuron(a) and _is_ours(b) and a.shape == b.shape and torch.can_cast(b.dtype, a.dtype):
            return _add_into_dense(a, b.indices_, _scaled(b.values_, sign * alpha))
        if not _is_ours(a):
            return NotImplemented
        summed = add(a, b, alpha)
        if summed is NotImplemented or summed.dtype != a.dtype:
            return NotImplemented
        a.indices_, a.values_, a.coalesced = summed.indices_, summed.values_, summed.coalesced
        return a
    return add_


def _add_into_dense(dense, indices, values):
    """`dense` += the sparse tensor of `indices` and `values`, in place."""
    values = values.to(dense.dtype)
    if not indices.shape[0]:  # no sparse dimension: every entry is at the one position
        return dense.add_(values.sum(0, dtype=dense.dtype))
    return dense.index_put_(tuple(indices), values, accumulate=True)


_OPS[aten.add.Tensor], _OPS[aten.sub.Tensor] = _sum_of(1), _sum_of(-1)
_OPS[aten.add_.Tensor], _OPS[aten.sub_.Tensor] = _sum_in_place_of(1), _sum_in_place_of(-1)


def _is_number(value) -> bool:
    return isinstance(value, (int, float, bool)) or (isinstance(value, torch.Tensor) and value.dim() == 0
                                                     and value.layout == torch.strided)


def _on_values(compute):
    """An op of a sparse tensor and a number that is the op of its values (zeros stay zeros)."""
    def op(s, *numbers):
        if not (_is_ours(s) and all(map(_is_number, numbers))):
            return NotImplemented
        return SparseTensor(s.indices_, compute(s.values_, *numbers), s.shape, s.coalesced)
    return op


def _on_values_in_place(compute, keeps_coalesced=True):
    out_of_place = _on_values(compute)

    def op(s, *numbers):
        result = out_of_place(s, *numbers)
        if result is NotImplemented or result.dtype != s.dtype:
            return NotImplemented
        s.values_ = result.values_
        s.coalesced = s.coalesced and keeps_coalesced
        return s
    return op


_OPS[aten.mul.Tensor] = _OPS[aten.mul.Scalar] = _on_values(torch.mul)
_OPS[aten.div.Tensor] = _OPS[aten.div.Scalar] = _on_values(torch.div)
_OPS[aten.neg.default] = _on_values(torch.neg)
# PyTorch's in-place mul of a sparse tensor marks it uncoalesced (its div_ does not)
_OPS[aten.mul_.Tensor] = _OPS[aten.mul_.Scalar] = _on_values_in_place(torch.mul, keeps_coalesced=False)
_OPS[aten.div_.Tensor] = _OPS[aten.div_.Scalar] = _on_values_in_place(torch.div)


def _on_coalesced_values(compute):
    """An op of each entry that keeps zeros zero but is not linear: on the values once duplicates are summed."""
    def op(s, *numbers):
        if not (_is_ours(s) and all(map(_is_number, numbers))):
            return NotImplemented
        coalesced = _coalesced(s)
        return SparseTensor(coalesced.indices_, compute(coalesced.values_, *numbers), s.shape, True)
    return op


_OPS[aten.abs.default] = _on_coalesced_values(torch.abs)
_OPS[aten.sqrt.default] = _on_coalesced_values(torch.sqrt)
_OPS[aten.sgn.default] = _on_coalesced_values(torch.sgn)


_positive_pow = _on_coalesced_values(torch.pow)


@_implements(aten.pow.Tensor_Scalar)
def _pow(s, exponent):
    return _positive_pow(s, exponent) if exponent > 0 else NotImplemented  # 0 ** 0 is 1


@_implements(aten.sum.default, aten._sparse_sum.default)
def _sum(s, dtype=None):
    return s.values_.sum(dtype=dtype)


@_implements(aten._sparse_sum.dim)
def _sum_over(s, dim):
    """torch.sparse.sum over `dim`: dense once every sparse dimension is summed, else sparse (coalesced)."""
    sparse_dim, dims = _sparse_dim(s), {d % s.dim() for d in dim}
    dense_dims = [d - sparse_dim + 1 for d in dims if d >= sparse_dim]  # of the values (rows first)
    values = s.values_.sum(dense_dims) if dense_dims else s.values_
    kept = [d for d in range(sparse_dim) if d not in dims]
    if not kept:
        return values.sum(0)
    shape = [size for d, size in enumerate(s.shape) if d not in dims]
    return _coalesce(SparseTensor(s.indices_[kept], values, shape))


@_implements(aten.index_select.default)
def _index_select(s, dim, index):
    """The entries at `index` along `dim`, as many times as it names them (in no particular order: uncoalesced
    unless it has fewer than two)."""
    dim = dim % s.dim()
    shape = list(s.shape)
    shape[dim] = index.numel()
    # the CPU counts negative indices from the end along a sparse dimension, not along a dense one
    lowest = -s.shape[dim] if dim < _sparse_dim(s) else 0
    if index.numel() and not lowest <= int(index.min()) <= int(index.max()) < s.shape[dim]:
        return NotImplemented  # the CPU's error
    if dim >= _sparse_dim(s):
        return SparseTensor(s.indices_, s.values_.index_select(dim - _sparse_dim(s) + 1, index), shape)
    position, entries = _matches(torch.where(index < 0, index + s.shape[dim], index), s.indices_[dim])
    indices = s.indices_[:, entries]
    indices[dim] = position
    return SparseTensor(indices, s.values_[entries], shape)


def _matches(wanted, keys):
    """Every pair (i, j) with wanted[i] == keys[j], as two index tensors (a data-dependent number of pairs)."""
    keys, order = torch.sort(keys)
    low, high = torch.searchsorted(keys, wanted), torch.searchsorted(keys, wanted, right=True)
    counts = high - low
    position = torch.repeat_interleave(torch.arange(wanted.numel(), device=wanted.device), counts)
    within = torch.arange(position.numel(), device=wanted.device) - (counts.cumsum(0) - counts)[position]
    return position, order[low[position] + within]


# --- products --------------------------------------------------------------------------------------------------

def _is_matrix(s) -> bool:
    return _is_ours(s) and s.dim() == 2 and _sparse_dim(s) == 2


@_implements(aten.mm.default, aten._sparse_mm.default)
def _mm(a, b):
    if not (a.dim() == b.dim() == 2 and a.shape[1] == b.shape[0] and a.dtype == b.dtype):
        return NotImplemented
    if _is_matrix(a) and _is_matrix(b):
        return _sparse_sparse_matmul(a, b)
    if _is_matrix(a) and _is_dense_neuron(b):
        rows, columns = a.indices_
        return b.new_zeros((a.shape[0], b.shape[1])).index_add_(0, rows, a.values_.unsqueeze(1) * b[columns])
    if _is_dense_neuron(a) and _is_matrix(b):
        rows, columns = b.indices_
        return a.new_zeros((a.shape[0], b.shape[1])).index_add_(1, columns, a[:, rows] * b.values_)
    return NotImplemented


@_implements(aten._sparse_sparse_matmul.default)
def _sparse_sparse_matmul(a, b):
    """Sparse @ sparse: a product for each pair of entries meeting at an inner index, summed (coalesced)."""
    if not (_is_matrix(a) and _is_matrix(b) and a.shape[1] == b.shape[0] and a.dtype == b.dtype):
        return NotImplemented
    left, right = _matches(a.indices_[1], b.indices_[0])
    indices = torch.stack([a.indices_[0][left], b.indices_[1][right]])
    return _coalesce(SparseTensor(indices, a.values_[left] * b.values_[right], (a.shape[0], b.shape[1])))


@_implements(aten._sparse_mask_projection.default)
def _mask_projection(t, mask, accumulate_matches=False):
    """`t`'s entries, zero where `mask` has none at their index (if accumulating, times the number it has there):
    a sparse product's gradient, kept where the product's entries are."""
    if not (_is_ours(t) and _is_ours(mask) and t.shape == mask.shape and _sparse_dim(t) == _sparse_dim(mask)):
        return NotImplemented
    sizes = t.shape[:_sparse_dim(t)]
    entries = torch.sort(_linear_index(mask.indices_, sizes)).values
    wanted = _linear_index(t.indices_, sizes)
    matches = torch.searchsorted(entries, wanted, right=True) - torch.searchsorted(entries, wanted)
    factor = (matches if accumulate_matches else matches > 0).to(t.dtype).view(-1, *[1] * len(_dense_shape(t)))
    return SparseTensor(t.indices_, t.values_ * factor, t.shape, t.coalesced)


@_implements(aten.addmm.default, aten._sparse_addmm.default)
def _addmm(input, a, b, beta=1, alpha=1):
    product = _mm(a, b)
    if product is NotImplemented or not _is_dense_neuron(input) or input.dtype != product.dtype:
        return NotImplemented
    product = _scaled(product, alpha)
    # as PyTorch's addmm: beta 0 ignores the input (its NaNs included)
    return product if beta == 0 else product + _scaled(input, beta)


@_implements(aten.t.default, aten.transpose.int)
def _transpose(s, dim0=0, dim1=1):
    sparse_dim = _sparse_dim(s)
    dim0, dim1 = (d % max(s.dim(), 1) for d in (dim0, dim1))
    if not (dim0 < sparse_dim and dim1 < sparse_dim):
        return NotImplemented
    order = list(range(sparse_dim))
    order[dim0], order[dim1] = order[dim1], order[dim0]
    shape = list(s.shape)
    shape[dim0], shape[dim1] = shape[dim1], shape[dim0]
    return SparseTensor(s.indices_[order], s.values_, shape, s.coalesced and dim0 == dim1)


# --- joining ---------------------------------------------------------------------------------------------------

@_implements(aten.unsqueeze.default)
def _unsqueeze(s, dim):
    """A new dimension of size 1: sparse if it comes before the dense ones (as the CPU's; uncoalesced)."""
    dim = dim % (s.dim() + 1)
    shape = [*s.shape[:dim], 1, *s.shape[dim:]]
    if dim <= _sparse_dim(s):
        zeros = s.indices_.new_zeros((1, s.indices_.shape[1]))
        return SparseTensor(torch.cat([s.indices_[:dim], zeros, s.indices_[dim:]]), s.values_, shape, False)
    return SparseTensor(s.indices_, s.values_.unsqueeze(dim - _sparse_dim(s) + 1), shape, False)


@_implements(aten.cat.default)
def _cat(tensors, dim=0):
    """Along a sparse dimension, each tensor's entries moved past the ones before; along a dense one, each
    tensor's values padded with zeros where the others' go (uncoalesced, as the CPU's)."""
    first = tensors[0] if tensors else None
    if not (tensors and all(map(_is_ours, tensors)) and first.dim()):
        return NotImplemented
    dim = dim % first.dim()
    sparse_dim = _sparse_dim(first)
    if any(_sparse_dim(t) != sparse_dim or _resized(t.shape, dim, 0) != _resized(first.shape, dim, 0)
           for t in tensors):
        return NotImplemented  # the CPU's error
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    sizes = [t.shape[dim] for t in tensors]
    starts = [sum(sizes[:k]) for k in range(len(tensors))]
    indices, values = [], []
    for t, start, size in zip(tensors, starts, sizes):
        if dim < sparse_dim:
            shifted = t.indices_.clone()
            shifted[dim] += start
            indices.append(shifted)
            values.append(t.values_.to(dtype))
        else:
            axis = dim - sparse_dim + 1  # of the values
            padded = t.values_.new_zeros(_resized(t.values_.shape, axis, sum(sizes)), dtype=dtype)
            padded.narrow(axis, start, size).copy_(t.values_)
            indices.append(t.indices_)
            values.append(padded)
    return SparseTensor(torch.cat(indices, 1), torch.cat(values), _resized(first.shape, dim, sum(sizes)), False)


def _resized(shape, dim, size) -> list:
    return [*shape[:dim], size, *shape[dim + 1:]]


@_implements(aten.stack.default)
def _stack(tensors, dim=0):
    if not (tensors and all(map(_is_ours, tensors))):
        return NotImplemented
    return _cat([_unsqueeze(t, dim) for t in tensors], dim % (tensors[0].dim() + 1))


# --- softmax ---------------------------------------------------------------------------------------------------

def _groups(s, dim):
    """For a coalesced `s` and one of its sparse dimensions: each entry's group, the entries sharing its other
    sparse indices (numbered below nnz)."""
    others = [d for d in range(_sparse_dim(s)) if d != dim]
    key = _linear_index(s.indices_[others], [s.shape[d] for d in others])
    return torch.unique(key, return_inverse=True)[1]


def _group_sum(values, groups):
    return values.new_zeros(values.shape).index_add_(0, groups, values)[groups]


def _softmax_of(log: bool):
    """torch.sparse.softmax / log_softmax: over the entries along `dim` (an entry missing counts as minus
    infinity), each group of entries sharing the other sparse indices; along a dense dimension, of the values."""
    def softmax(s, dim, half_to_float):
        if half_to_float:
            return NotImplemented
        s = _coalesced(s)
        dim = dim % s.dim()
        if dim >= _sparse_dim(s):
            values = (torch.log_softmax if log else torch.softmax)(s.values_, dim - _sparse_dim(s) + 1)
            return SparseTensor(s.indices_, values, s.shape, True)
        groups = _groups(s, dim)
        index = groups.view(-1, *[1] * (s.values_.dim() - 1)).expand_as(s.values_)
        top = torch.full_like(s.values_, -torch.inf).scatter_reduce(0, index, s.values_, "amax")
        shifted = s.values_ - top[groups]
        total = _group_sum(shifted.exp(), groups)
        return SparseTensor(s.indices_, shifted - total.log() if log else shifted.exp() / total, s.shape, True)
    return softmax


def _softmax_backward_of(log: bool):
    def backward(grad, output, dim, input):
        if not (_is_ours(output) and output.coalesced and (_is_ours(grad) or _is_dense_neuron(grad))):
            return NotImplemented
        dim = dim % output.dim()
        g = _values_at(_coalesced(grad), output.indices_) if _is_ours(grad) else grad[tuple(output.indices_)]
        y = output.values_
        if dim >= _sparse_dim(output):
            axis = dim - _sparse_dim(output) + 1

            def total(v):
                return v.sum(axis, keepdim=True)
        else:
            groups = _groups(output, dim)

            def total(v):
                return _group_sum(v, groups)
        values = g - y.exp() * total(g) if log else y * (g - total(g * y))
        return SparseTensor(output.indices_, values, output.shape, False)  # the CPU's does not mark it coalesced
    return backward


_OPS[aten._sparse_softmax.default] = _softmax_of(log=False)
_OPS[aten._sparse_log_softmax.default] = _softmax_of(log=True)
_OPS[aten._sparse_softmax_backward_data.default] = _softmax_backward_of(log=False)
_OPS[aten._sparse_log_softmax_backward_data.default] = _softmax_backward_of(log=True)
