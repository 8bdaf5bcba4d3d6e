"""A neuron tensor's values as one flat device array, and results written back in place.

Collectives move flat arrays. A tensor that is its whole storage (DDP buckets,
FSDP2's flat parameters, most user tensors) is its buffer as it stands; any
other view is read and written through its (shape, stride, offset) by small
cached programs, so outputs land in the caller's storage exactly as PyTorch's
backends write them.
"""
import functools

import jax
import torch

from ..runtime.dtypes import convert_to
from ..runtime.layout import covers_storage, read_view, write_view


def _is_whole_storage(tensor) -> bool:
    storage = tensor._storage
    shape, stride, offset, dtype, _ = tensor._spec
    return dtype == storage.dtype and covers_storage(shape, stride, offset, storage.numel)


def _read(buffer, spec, storage_dtype):
    return read_view(buffer, spec, storage_dtype).reshape(-1)


def _write(buffer, flat, spec, storage_dtype):
    return write_view(buffer, flat.reshape(spec[0]), spec, storage_dtype)


@functools.cache
def _reader(spec, storage_dtype):
    return jax.jit(functools.partial(_read, spec=spec, storage_dtype=storage_dtype))


@functools.cache
def _writer(spec, storage_dtype):
    return jax.jit(functools.partial(_write, spec=spec, storage_dtype=storage_dtype), donate_argnums=0)


def _flush_queued_ops() -> None:
    """Bound on first use to adaptive eager's flush (importing it pulls in Dynamo: not at `import torch`)."""
    global _flush_queued_ops
    from ..eager import adaptive

    _flush_queued_ops = adaptive.flush
    adaptive.flush()


def flat(tensor) -> jax.Array:
    """The tensor's values, flattened in row-major order, on its device."""
    _flush_queued_ops()
    if _is_whole_storage(tensor):
        return tensor._storage.buffer
    return _reader(tensor._spec, tensor._storage.dtype)(tensor._storage.buffer)


def write(tensor, values: jax.Array) -> None:
    """Write flat `values` (the tensor's numel) into the tensor's storage through its view."""
    storage = tensor._storage
    if _is_whole_storage(tensor):
        storage.buffer = convert_to(values, storage.dtype)
    else:
        storage.buffer = _writer(tensor._spec, storage.dtype)(storage.buffer, values)


def reader(tensor):
    """What `flat` computes, as a function of the storage's buffer to trace into a program."""
    if _is_whole_storage(tensor):
        return lambda buffer: buffer
    return functools.partial(_read, spec=tensor._spec, storage_dtype=tensor._storage.dtype)


def writer(tensor):
    """What `write` computes, as a function (buffer, values) -> the storage's new buffer to trace into a program."""
    storage_dtype = tensor._storage.dtype
    if _is_whole_storage(tensor):
        return lambda buffer, values: convert_to(values, storage_dtype)
    return functools.partial(_write, spec=tensor._spec, storage_dtype=storage_dtype)


def check_neuron(tensor, name: str = "tensor") -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"Invalid function argument. Expected parameter `{name}` of type torch.Tensor but got {type(tensor)} instead.")
    if tensor.device.type != "neuron":
        raise ValueError(f"neuron process group: expected a neuron tensor, got one on {tensor.device}")
    if tensor.layout != torch.strided:
        # ProcessGroup.allreduce takes sparse COO tensors before this check; no collective takes compressed ones
        supported = "only all_reduce is" if tensor.layout == torch.sparse_coo else "none is"
        raise NotImplementedError(f"neuron process group: of the collectives of {tensor.layout} tensors {supported} "
                                  "supported. Please report it at the project's issue tracker if you need another.")
