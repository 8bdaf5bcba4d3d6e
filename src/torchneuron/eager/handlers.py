"""The handlers of ops that are not plain computations: transfers, host reads, storage changes."""
import math
import warnings

import torch
from jax import lax
from torch._prims_common import suggest_memory_format
from torch.utils._pytree import tree_leaves, tree_map

from ..ops import registry
from ..ops.indexing import masked_rows
from ..ops.rules import rule
from ..runtime import storage, sync, transfer
from ..runtime.dtypes import convert_to, scalar_type_name, to_torch
from ..runtime.layout import contiguous_strides
from ..runtime.tensor import NeuronTensor, wrap_buffer
from . import cpu_dtypes, out_dtypes, transfers, views
from .executable import Compute, devices_differ

aten = torch.ops.aten
HANDLERS = {}


def registrar(table: dict):
    """A decorator `@registered(op, ...)` putting its function in `table` under each op."""
    def registered(*ops):
        def register(fn):
            for op in ops:
                table[op] = fn
            return fn

        return register

    return registered


handles = registrar(HANDLERS)


_PRIVATEUSE1 = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)


def run_device_generic_kernel(func, args, kwargs):
    """`func`'s kernel for neuron or for every device (its CompositeExplicitAutograd one), whose PyTorch code
    calls ops that come back here one by one."""
    return func.redispatch(_PRIVATEUSE1, *args, **kwargs)


@handles(aten.copy_.default)
def copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if not isinstance(dst, NeuronTensor):
        return dst.copy_(transfers.to_host(src))
    if not isinstance(src, NeuronTensor):
        if transfers.is_whole_storage(dst) and src.dtype == dst.dtype and src.shape == dst.shape:
            # `.to("neuron")`: the transferred buffer becomes the destination's storage, no program runs
            dst._storage.buffer = transfer.host_to_device(src, dst.device.index)
            return dst
        src = transfers.from_host(src, dst.device.index)
    elif src.device != dst.device:
        src = transfers.move(src, dst.device.index)
    return _computation(aten.copy_.default)(func, (dst, src), {})


@handles(aten._to_copy.default)
def to_copy(func, args, kwargs):
    tensor = args[0]
    device = torch.device(kwargs["device"]) if kwargs.get("device") is not None else tensor.device
    if device.type != "neuron":
        host = transfers.to_host(tensor).to(device=device, dtype=kwargs.get("dtype") or tensor.dtype)
        memory_format = kwargs.get("memory_format")
        if memory_format is None and host.stride() == tensor.stride():
            return host
        # the copy keeps a dense tensor's strides (preserve_format, the default), as the CPU's and CUDA's do
        preserved = torch.empty_like(views.meta_like(tensor), memory_format=memory_format or torch.preserve_format)
        strides = preserved.stride()
        if strides == host.stride():
            return host
        return torch.empty_strided(host.shape, strides, dtype=host.dtype, device=device).copy_(host)
    index = device.index if device.index is not None else torch.neuron.current_device()
    if index != tensor.device.index:
        tensor = transfers.move(tensor, index)
    same_device = {k: v for k, v in kwargs.items() if k not in ("device", "non_blocking", "pin_memory")}
    return _computation(aten._to_copy.default)(func, (tensor,), same_device)


def _base_name(func) -> str:
    return func._schema.name.split("::")[1]


def _reads_first_tensors_metadata_only(func) -> bool:
    name = _base_name(func)
    return name.endswith("_like") or name.startswith("new_")


def makes_on_requested_device(func) -> bool:
    """A factory-like op of a tensor with a `device` argument of its own (`zeros_like(x, device="cpu")`,
    `x.new_empty(n, device="meta")`, `linspace(t0, t1, n, device=...)`): its result belongs there."""
    return (_reads_first_tensors_metadata_only(func) or _base_name(func).startswith(("linspace", "logspace"))) and any(
        a.name == "device" for a in func._schema.arguments)


def on_requested_device(handler, func):
    """`handler` for results on the device the op is asked for, else the op run there: the `_like` and `new_`
    ops read only their first tensor's metadata, so a meta tensor of its view stands in for it."""
    metadata_only = _reads_first_tensors_metadata_only(func)

    def run(func, args, kwargs):
        device = kwargs.get("device")
        if device is None or torch.device(device).type == "neuron":
            return handler(func, args, kwargs)
        stand_ins = [views.meta_like(args[0])] if metadata_only else []
        rest = [transfers.to_host(a) if isinstance(a, NeuronTensor) else a for a in args[len(stand_ins):]]
        return func(*stand_ins, *rest, **kwargs)

    return run


_COMPUTATIONS = {}


def _computation(func):
    """The generic compute handler for an op this module intercepts: once its device question is settled,
    `copy_` and `_to_copy` within one device are ordinary computations."""
    handler = _COMPUTATIONS.get(func)
    if handler is None:
        handler = _COMPUTATIONS[func] = Compute(rule(func))
    return handler


# C++ names of the dtypes, as the CPU's overflow message gives them
_CPP_NAMES = {
    torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16", torch.float32: "float", torch.float64: "double",
    torch.float8_e4m3fn: "c10::Float8_e4m3fn", torch.float8_e5m2: "c10::Float8_e5m2", torch.int8: "int8_t",
    torch.uint8: "uint8_t", torch.int16: "int16_t", torch.int32: "int", torch.int64: "int64_t",
}


@handles(aten._padded_dense_to_jagged_forward.default)
def padded_to_jagged(func, args, kwargs):
    """Without total_L the packed length is the last offset, read from the device (a synchronisation, as CUDA's
    kernel reads it); with it (nested tensors' own ops pass it), an ordinary computation."""
    dense, offsets, *rest = args
    if (rest[0] if rest else kwargs.get("total_L")) is None:
        args, kwargs = (dense, offsets), {**kwargs, "total_L": int(offsets[0][-1])}
    return _computation(func)(func, args, kwargs)


@handles(aten.as_strided_copy.default)
def as_strided_copy(func, args, kwargs):
    """Strides and offset count in the input's storage, as the view's do (the lowering, for graphs, counts them
    in its values: functionalization gives it a contiguous base)."""
    return aten.as_strided.default(*args, **kwargs).clone(memory_format=torch.contiguous_format)


@handles(aten.lift_fresh.default, aten.lift_fresh_copy.default)
def lift_fresh(func, args, kwargs):
    """A tensor made from data (`torch.tensor([], device="neuron")`) in a function Dynamo traces is made for real,
    as PyTorch makes every such tensor with the Python key excluded, then lifted under the fake mode, which
    takes a plain tensor as a constant but leaves subclasses to themselves: the neuron tensor is taken as a
    plain one would be (before, the real tensor met fake ones in the next op and Dynamo failed)."""
    fake_mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    if fake_mode is not None:
        return fake_mode.from_tensor(args[0], static_shapes=True)
    if func is aten.lift_fresh.default:
        return views.view(func, args, kwargs)
    return _computation(func)(func, args, kwargs)


@handles(aten.fill_.Scalar, aten.fill.Scalar)
def fill(func, args, kwargs):
    """The CPU refuses a fill value its dtype cannot hold (`torch.full(..., 1000.0, dtype=float8_e4m3fn)`);
    the device program, given the value as a traced scalar, would saturate or wrap it."""
    tensor, value = args[0], args[1]
    if not isinstance(value, (bool, complex)) and tensor.dtype in _CPP_NAMES and _overflows(value, tensor.dtype):
        raise RuntimeError(f"value cannot be converted to type {_CPP_NAMES[tensor.dtype]} without overflow")
    return _computation(func)(func, args, kwargs)


def _overflows(value, dtype) -> bool:
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        # unsigned types take negative integers down to -max, wrapping them (two's complement), but no
        # negative float
        low = -info.max if info.min == 0 and isinstance(value, int) else info.min
        return not low <= value <= info.max
    if math.isinf(value):
        return dtype == torch.float8_e4m3fn  # the one float dtype here without infinities
    return math.isfinite(value) and abs(value) > torch.finfo(dtype).max


@handles(aten._local_scalar_dense.default)
def local_scalar_dense(func, args, kwargs):
    return transfers.to_host(args[0]).item()


@handles(aten.equal.default)
def equal(func, args, kwargs):
    a, b = args
    if a.shape != b.shape:
        return False
    return bool(aten.all.default(aten.eq.Tensor(a, b)).item())


@handles(aten.allclose.default)
def allclose(func, args, kwargs):
    return bool(aten.all.default(aten.isclose.default(*args, **kwargs)).item())


@handles(aten._has_same_storage_numel.default)
def has_same_storage_numel(func, args, kwargs):
    """Metadata (forward-mode AD asks it of each dual tensor): the storages' sizes, not a CPU copy of them."""
    base, other = args
    return base.untyped_storage().nbytes() // base.itemsize == other.untyped_storage().nbytes() // other.itemsize


@handles(aten.is_pinned.default)
def is_pinned(func, args, kwargs):
    return False


@handles(aten._pin_memory.default)
def pin_memory(func, args, kwargs):
    """The CPU's refusal, as for a CUDA tensor: only host memory is pinned (it ran on the CPU as a fallback)."""
    raise RuntimeError(f"cannot pin '{args[0].type()}' only dense CPU tensors can be pinned")


@handles(aten.resize_.default)
def resize_(func, args, kwargs):
    tensor, size = args[0], tuple(args[1])
    memory_format = args[2] if len(args) > 2 else kwargs.get("memory_format")
    if size == tuple(tensor.shape) and memory_format is None:
        return tensor  # as on the CPU: an out= tensor of the right size keeps its strides
    if memory_format is None:
        strides = contiguous_strides(size)
    else:  # the CPU restrides to the format even when the size is unchanged
        strides = torch.empty(size, device="meta", memory_format=memory_format).stride()
    views.resize_in_storage(tensor, (size, strides, tensor.storage_offset(), tensor.dtype))
    return tensor


@handles(aten.resize_as_.default)
def resize_as_(func, args, kwargs):
    tensor, template = args[:2]
    memory_format = args[2] if len(args) > 2 else kwargs.get("memory_format")
    if memory_format == torch.preserve_format:
        memory_format = suggest_memory_format(template)
    return resize_(aten.resize_.default, (tensor, template.shape, memory_format), {})


@handles(aten.set_.source_Tensor)
def set_tensor(func, args, kwargs):
    tensor, source = args
    views.reset_view(tensor, source._storage, source._spec)
    return tensor


def _requested_view(tensor, args, kwargs):
    """The view `set_(source, storage_offset, size, stride=[])` asks for; an empty stride is contiguous."""
    offset, size = args[2], tuple(args[3])
    stride = args[4] if len(args) > 4 else kwargs.get("stride")
    return size, tuple(stride) if stride else contiguous_strides(size), offset, tensor.dtype


@handles(aten.set_.source_Tensor_storage_offset)
def set_tensor_view(func, args, kwargs):
    tensor, source = args[:2]
    views.reset_view(tensor, source._storage, _requested_view(tensor, args, kwargs))
    return tensor


@handles(aten.set_.source_Storage, aten.set_.source_Storage_storage_offset)
def set_storage(func, args, kwargs):
    tensor, untyped = args[:2]
    if untyped.device.type != "neuron":
        raise RuntimeError(f"Expected a storage on device neuron, but got one on {untyped.device}")
    target = storage.of_handle(untyped)
    if func is aten.set_.source_Storage:
        view = ((untyped.nbytes() // tensor.dtype.itemsize,), (1,), 0, tensor.dtype)
    else:
        view = _requested_view(tensor, args, kwargs)
    views.reset_view(tensor, target, view)
    return tensor


@handles(aten.record_stream.default)
def record_stream(func, args, kwargs):
    """Nothing to record: a device's streams are one in-order queue, and PJRT keeps a buffer alive for
    the work that uses it."""
    return None


def from_array(array, device_index: int, carried_complex=torch.complex64) -> NeuronTensor:
    """`carried_complex`: the dtype a complex64 array stands for (complex32 is carried as complex64). A
    registry.Prefix becomes a tensor of its rows over a buffer of at most twice their size."""
    if isinstance(array, registry.Prefix):
        array, shape = _rows_kept(array), (array.length, *array.row_shape)
    else:
        shape = array.shape
    dtype = to_torch(array.dtype)
    if dtype == torch.complex64:
        dtype = carried_complex
    return wrap_buffer(convert_to(array, dtype).reshape(-1), shape, dtype, device_index)


def _rows_kept(prefix):
    """The prefix's padded buffer cut to a power of two of rows: one slicing program per such size (a few
    per padded size), not one per length."""
    padded, length, row_shape = prefix
    row = math.prod(row_shape)
    kept = min(registry.rows_kept(length), padded.shape[0] // row if row else 0)
    return padded if kept * row == padded.shape[0] else lax.slice(padded, (0,), (kept * row,))


def _is_result(value) -> bool:
    return hasattr(value, "dtype") or isinstance(value, registry.Prefix)


def _carried_complex(tensors) -> torch.dtype:
    """complex32 where it is the widest complex input: XLA computed it in complex64, PyTorch keeps it."""
    complex_dtypes = {t.dtype for t in tensors if t.dtype.is_complex}
    return torch.complex32 if complex_dtypes == {torch.complex32} else torch.complex64


def data_dependent(func, args, kwargs):
    """Ops whose output shape depends on the data: run the lowering on concrete arrays."""
    from ..ops.registry import LOWERINGS, is_out

    if is_out(func):
        return _data_dependent_out(func, args, kwargs)
    cpu_dtypes.check_once_per_dtypes(func, args, kwargs)
    return _on_values(LOWERINGS[func], args, kwargs)


def _on_values(fn, args, kwargs):
    """`fn` of the tensors' values as concrete arrays, its results as tensors."""
    if sync.debug_mode:
        sync.host_read()  # the results' shapes wait for the values
    tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
    if any(type(t) is not NeuronTensor for t in tensors):
        # as in a compiled op: a 0-dim CPU tensor is brought over, any other device's refused
        on_device = list(tensors)
        transfers.bring_to_device(on_device)
        brought = {id(t): b for t, b in zip(tensors, on_device)}
        args, kwargs = tree_map(lambda v: brought.get(id(v), v), (args, kwargs))
        tensors = on_device
    device_index, carried_complex = tensors[0].device.index, _carried_complex(tensors)
    read = [v for v in tree_leaves((args, kwargs)) if isinstance(v, NeuronTensor)]

    def on_buffers(buffers):
        # each tensor's values as a (contiguous) device array, in the order tree_leaves and tree_map visit them
        values = iter([buffer.reshape(t.shape) for buffer, t in zip(buffers, read)])
        concrete = tree_map(lambda v: next(values) if isinstance(v, NeuronTensor) else v, (args, kwargs))
        return fn(*concrete[0], **concrete[1])

    out = storage.read_buffers([transfers.row_major_storage(t) for t in read], on_buffers)
    return tree_map(lambda a: from_array(a, device_index, carried_complex) if _is_result(a) else a, out,
                    is_leaf=_is_result)


@handles(aten.linalg_lstsq.default)
def lstsq(func, args, kwargs):
    """The solution laid out as LAPACK leaves it, as the CPU and CUDA return it: the first n rows of column-major
    (max(m, n), k) matrices (of max(m, n) vectors, for a vector right-hand side)."""
    solution, *others = data_dependent(func, args, kwargs)
    a = args[0]
    rows, n = max(a.shape[-2:]), a.shape[-1]
    if solution.dim() == a.dim() - 1:
        full = solution.new_empty(solution.shape[:-1] + (rows,))[..., :n]
    else:
        full = solution.new_empty(solution.shape[:-2] + (solution.shape[-1], rows)).mT[..., :n, :]
    return (full.copy_(solution), *others)


def _data_dependent_out(func, args, kwargs):
    target = rule(func).target
    return _out_of_functional(func, lambda *a, **k: data_dependent(target, a, k), args, kwargs)


def _out_of_functional(func, functional, args, kwargs):
    """An out= overload as `functional`'s results, then the out tensors resized to hold them."""
    names = registry.out_arguments(func)
    outs = [kwargs[name] for name in names]
    inputs = [a for a in tree_leaves(args) if isinstance(a, torch.Tensor)]
    for out in (o for o in tree_leaves(outs) if isinstance(o, torch.Tensor)):
        if inputs and out.device != inputs[0].device:  # the copy into it would move the result silently
            raise devices_differ(inputs[0].device, out.device)
    results = functional(*args, **{k: v for k, v in kwargs.items() if k not in names})
    results = results if isinstance(results, (tuple, list)) else [results]
    out_dtypes.check(func, args, kwargs, [r.dtype for r in results])
    for out, value in zip(outs, results):
        torch._refs._maybe_resize_out(out, value.shape).copy_(value)
    return outs[0] if len(outs) == 1 else tuple(outs)


@handles(aten.native_batch_norm.out, aten._native_batch_norm_legit.out)
def batch_norm_out(func, args, kwargs):
    """Their out tensors are written from the functional overload's results: that overload updates the
    running statistics, and saves the CPU's empty ones in eval mode (their own functional variant, by
    signature, would be the overload without running statistics)."""
    functional = aten.native_batch_norm.default if func is aten.native_batch_norm.out else \
        aten._native_batch_norm_legit.default
    return _out_of_functional(func, functional, args, kwargs)


def _masks_to_indices(x, indices):
    """Boolean masks in an index list become the long indices of their nonzeros, as PyTorch expands them."""
    expanded = []
    for index in indices:
        if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8):
            if index.dtype == torch.uint8:
                warnings.warn("indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool "
                              "instead.", stacklevel=2)
            _check_mask_shape(x, index, len(expanded))
            expanded.extend(aten.nonzero.default(index).unbind(1))
        else:
            expanded.append(index)
    return expanded


def _check_mask_shape(x, mask, first_dim):
    for i, size in enumerate(mask.shape):
        if first_dim + i < x.dim() and size != x.shape[first_dim + i]:
            raise IndexError(
                f"The shape of the mask {list(mask.shape)} at index {i} does not match the shape of the indexed "
                f"tensor {list(x.shape)} at index {first_dim + i}"
            )


def _indices_on_device(x, indices):
    """Index tensors may live on the CPU, as for CUDA tensors: they are copied to x's device."""
    if type(x) is not NeuronTensor:
        return indices
    return [
        transfers.from_host(i, x.device.index) if isinstance(i, torch.Tensor) and i.device.type == "cpu" else i for i in indices
    ]


def _is_leading_mask(x, indices) -> bool:
    """x[mask] for one boolean mask of x's leading dimensions."""
    return (type(x) is NeuronTensor and len(indices) == 1 and isinstance(indices[0], NeuronTensor)
            and indices[0].dtype == torch.bool and indices[0].dim() <= x.dim())


def _has_mask(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


@handles(aten.one_hot.default)
def one_hot(func, args, kwargs):
    """Checked on the device as the CPU checks it, not decomposed (the decomposition gives a zero row)."""
    x, num_classes = args[0], args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
    if type(x) is not NeuronTensor:  # traced by torch.compile (fake tensors): the decomposition is what it wants
        return func.decompose(x, num_classes)
    if num_classes == -1:
        if not x.numel():
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        num_classes = int(x.max()) + 1  # as the CPU kernel does: the output's size is the data's
    return _computation(func)(func, (x, num_classes), {})


@handles(aten.max_pool1d.default)
def max_pool1d(func, args, kwargs):
    """PyTorch's max_pool1d takes floating types only, on the CPU (its own kernel) as on CUDA (through
    max_pool2d_with_indices); its decomposition reaches max_pool2d_with_indices, whose CPU kernel takes
    integers too, so the CPU is asked first (not of fake tensors: torch.compile traces the decomposition)."""
    if type(args[0]) is NeuronTensor:
        cpu_dtypes.check_once_per_dtypes(func, args, kwargs)
    return func.decompose(*args, **kwargs)


@handles(aten.index.Tensor)
def index(func, args, kwargs):
    x, indices = args
    indices = _indices_on_device(x, indices)
    if _is_leading_mask(x, indices):
        # the rows the mask picks, computed at the mask's size: its nonzeros as indices would make the
        # gather's program one per number of them
        _check_mask_shape(x, indices[0], 0)
        return _on_values(masked_rows, (x, indices[0]), {})
    if _has_mask(indices):
        indices = _masks_to_indices(x, indices)
    return _computation(func)(func, (x, indices), kwargs)


@handles(aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default)
def index_put(func, args, kwargs):
    x, indices, *rest = args
    values = rest[0] if rest else kwargs["values"]
    if values.dtype != x.dtype:  # the decomposition would cast them; the CPU kernel refuses
        raise RuntimeError(
            f"Index put requires the source and destination dtypes match, got {scalar_type_name(x.dtype)} for the "
            f"destination and {scalar_type_name(values.dtype)} for the source."
        )
    indices = _indices_on_device(x, indices)
    if _is_leading_mask(x, indices):
        # x[mask] = values: the lowering puts through the mask at its size (the mask's nonzeros as indices
        # would make the program one per number of them)
        _check_mask_shape(x, indices[0], 0)
    elif _has_mask(indices):
        indices = _masks_to_indices(x, indices)
    return _computation(func)(func, (x, indices, *rest), kwargs)


@handles(aten._pack_padded_sequence.default)
def pack_padded_sequence(func, args, kwargs):
    """The packed rows gathered on the device and `batch_sizes` on the host, as CUDA's kernel returns them
    (PackedSequence refuses device batch sizes; the CPU fallback moved them). The lengths are host values
    (pack_padded_sequence moves them there): the CPU kernel run on the rows' numbers says which rows go
    where, and raises its own errors."""
    x, lengths, batch_first = args
    rows = torch.arange(math.prod(x.shape[:2])).reshape(x.shape[:2])
    packed_rows, batch_sizes = func(rows, lengths, batch_first)
    return x.flatten(0, 1).index_select(0, packed_rows.to(x.device)), batch_sizes


@handles(aten.native_batch_norm.default)
def native_batch_norm(func, args, kwargs):
    """Its schema does not mark the running statistics as written, though the kernel updates them:
    route to the overloads that say what they write."""
    x, weight, bias, running_mean, running_var, training, momentum, eps = args
    if running_mean is None:
        return aten._native_batch_norm_legit.no_stats(x, weight, bias, training, momentum, eps)
    if not training:
        return aten._native_batch_norm_legit_no_training.default(x, weight, bias, running_mean, running_var,
                                                                 momentum, eps)
    return aten._native_batch_norm_legit.default(x, weight, bias, running_mean, running_var, training, momentum, eps)


@handles(aten._linalg_det.default, aten._linalg_slogdet.default)
def determinant(func, args, kwargs):
    """PyTorch factors a real contiguous A through A^T (LAPACK's column-major view of it) and any other A
    directly, and det/slogdet's backward reads the LU factors it returns accordingly. The lowering always
    factors A^T; for the other layouts it is handed A^T (contiguous), whose transpose is A."""
    matrix = args[0]
    if not matrix.is_complex() and not matrix.is_contiguous():
        matrix = matrix.mT.contiguous()
    return _computation(func)(func, (matrix, *args[1:]), kwargs)
