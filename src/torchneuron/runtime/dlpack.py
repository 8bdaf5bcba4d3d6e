"""DLPack: a neuron tensor's memory shared with other libraries (JAX, NumPy, PyTorch), without a copy.

A storage's buffer lives in the memory of the PJRT device (host memory on XLA:CPU, the GPU's on XLA:GPU),
where PyTorch can view it as a tensor of that device's own kind; that view, with the neuron tensor's sizes,
strides and offset, is what is exported, so the consumer sees exactly the tensor's elements. XLA buffers
are immutable: a write on neuron after the export gives the storage a new buffer (XLA does not donate
one shared this way), so the consumer keeps the values it was given, as with torch_xla and JAX arrays;
what the consumer writes is seen by the neuron tensor until then.
"""
import jax
import torch

from . import pending_checks
from .storage import read_buffers


def refuse_unexportable(tensor: torch.Tensor) -> None:
    """PyTorch's checks before it exports a tensor."""
    if tensor.requires_grad:
        raise BufferError("Can't export tensors that require gradient, use tensor.detach()")
    if tensor.is_conj():
        raise BufferError("Can't export tensors with the conjugate bit set")


def shared_view(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor of the PJRT device's own kind (CPU on XLA:CPU, CUDA on XLA:GPU) viewing the neuron tensor's
    elements in its storage's buffer: the same memory, once the values are computed (a synchronisation point,
    where failed device-side checks raise, as for `.cpu()`)."""
    storage = tensor._storage
    shape, stride, offset, dtype, device_index = tensor._spec
    if torch.complex32 in (dtype, storage.dtype):
        raise BufferError(
            "neuron: a complex32 tensor cannot be shared through DLPack: XLA holds its values as complex64, "
            "not in PyTorch's layout. Copy it first (`tensor.to(torch.complex64)` or `tensor.cpu()`).")
    pending_checks.raise_failures(device_index)
    return read_buffers([storage], _torch_view).view(dtype).as_strided(shape, stride, offset)


def _torch_view(buffers) -> torch.Tensor:
    buffer, = buffers
    jax.block_until_ready(buffer)
    try:
        return torch.from_dlpack(buffer)
    except (BufferError, RuntimeError, TypeError) as error:
        if buffer.is_deleted():
            raise
        raise _unviewable(buffer, error) from error


def memory_device(tensor: torch.Tensor) -> tuple:
    """The DLPack device of the tensor's memory (kDLCPU on XLA:CPU, kDLCUDA on XLA:GPU), where a consumer finds
    it: its buffer's, which the view `shared_view` makes reports. Asked before every export, so it neither waits
    for the values nor makes the view."""
    buffer = tensor._storage.buffer
    try:
        kind, index = buffer.__dlpack_device__()
    except (BufferError, RuntimeError, TypeError, ValueError) as error:
        raise _unviewable(buffer, error) from error
    return torch.utils.dlpack.DLDeviceType(kind), index


def _unviewable(buffer, error) -> BufferError:
    return BufferError(
        f"neuron: PyTorch cannot view this device's memory ({next(iter(buffer.devices())).platform}), so the "
        f"tensor cannot be shared through DLPack: copy it with `tensor.cpu()` first ({error})")


def export(tensor: torch.Tensor, max_version=None, dl_device=None, copy=None):
    """The DLPack capsule of a neuron tensor (`Tensor.__dlpack__`'s arguments but the stream: the values
    are ready when it is made)."""
    return shared_view(tensor).__dlpack__(**given(max_version=max_version, dl_device=dl_device, copy=copy))


def given(**arguments) -> dict:
    """The arguments that are not None: older PyTorch releases' `__dlpack__` and `from_dlpack` take fewer."""
    return {name: value for name, value in arguments.items() if value is not None}
