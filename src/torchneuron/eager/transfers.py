"""Tensors between the host and the device, and between devices."""
import torch

from ..runtime import pending_checks, transfer
from ..runtime.layout import covers_storage
from ..runtime.storage import Storage, read_buffers
from ..runtime.tensor import NeuronTensor, wrap_buffer
from . import adaptive

aten = torch.ops.aten


def from_host(tensor: torch.Tensor, device_index: int) -> NeuronTensor:
    """A new contiguous neuron tensor holding a CPU tensor's values."""
    return wrap_buffer(transfer.host_to_device(tensor, device_index), tensor.shape, tensor.dtype, device_index)


def row_major_storage(tensor: NeuronTensor) -> Storage:
    """A storage holding the tensor's values in row-major order (its own, if it already is one): what reading a
    tensor's values (on the host, in a data-dependent op, on another device) starts from."""
    adaptive.refuse_while_capturing("reading a tensor's values")
    if not is_whole_storage(tensor):
        tensor = aten.clone.default(tensor, memory_format=torch.contiguous_format)
    return tensor._storage


# a view of a storage this small is read by copying the whole storage and taking the view on the host, where a
# larger one is first gathered on the device (a program for each new view: `x[-1].item()` in a loop)
_READ_WHOLE_BYTES = 1 << 17


def to_host(tensor: NeuronTensor) -> torch.Tensor:
    """A new contiguous CPU tensor holding a neuron tensor's values (a synchronisation point)."""
    pending_checks.raise_failures(tensor.device.index)
    shape, stride, offset, dtype, _ = tensor._spec
    storage = tensor._storage
    if dtype == storage.dtype and storage.numel * dtype.itemsize <= _READ_WHOLE_BYTES and not is_whole_storage(tensor):
        adaptive.refuse_while_capturing("reading a tensor's values")
        host = read_buffers([storage], lambda buffers: transfer.device_to_host(buffers[0], dtype))
        return host.as_strided(shape, stride, offset).clone()
    host = read_buffers([row_major_storage(tensor)], lambda buffers: transfer.device_to_host(buffers[0], dtype))
    return host.reshape(shape)


def read_through_storage(tensor: NeuronTensor) -> bool:
    """Whether the tensor's values are best read by reading its whole storage: it is the whole storage, or a
    view of a small one (see `to_host`)."""
    storage = tensor._storage
    return tensor._spec[3] == storage.dtype and (storage.nbytes <= _READ_WHOLE_BYTES or is_whole_storage(tensor))


def is_whole_storage(t: NeuronTensor) -> bool:
    shape, stride, offset, dtype, _ = t._spec
    return dtype == t._storage.dtype and covers_storage(shape, stride, offset, t._storage.numel)


def bring_to_device(tensors: list) -> None:
    """Replace 0-dim CPU tensors (which PyTorch lets mix with device tensors) by neuron copies."""
    device_index = next((t._spec[4] for t in tensors if type(t) is NeuronTensor), 0)
    for i, t in enumerate(tensors):
        if type(t) is NeuronTensor:
            continue
        if t.device.type == "cpu" and t.dim() == 0:
            tensors[i] = wrap_buffer(transfer.host_scalar_to_device(t, device_index), (), t.dtype, device_index)
        else:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"neuron:{device_index} and {t.device}!"
            )


def move(tensor: NeuronTensor, device_index: int) -> NeuronTensor:
    moved = read_buffers([row_major_storage(tensor)],
                         lambda buffers: transfer.device_to_device(buffers[0], device_index))
    return wrap_buffer(moved, tensor.shape, tensor.dtype, device_index)
