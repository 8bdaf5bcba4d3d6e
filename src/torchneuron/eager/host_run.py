"""An op run by PyTorch's CPU kernel on host copies of its neuron tensors: how the CPU fallback and host
bookkeeping run one.

Tensors are copied by their storages: each storage is read whole once, and each tensor's copy views the host
copy as the tensor views the storage, so copies alias as the tensors do, and a storage the kernel writes
(through any of its views) goes back whole; new results go to the device directly. Neither takes a program or
the dispatch of a `.cpu()` and a `.to()` per tensor. A tensor whose storage is too large to read for it (a row of
a large weight), a sparse one or one with a conjugate or negative bit is copied on its own (`.cpu()`) and
written back by `copy_`.
"""
import torch

from ..ops import registry
from ..runtime import pending_checks, transfer
from ..runtime.program import storage_views
from ..runtime.storage import read_buffers
from . import adaptive, transfers

SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


class HostCopies:
    """Host copies of `tensors` (neuron tensors, strided or sparse) for the CPU kernel of an op whose new results
    go to neuron:`device_index`; `of(tensor)` is a tensor's copy. Each tensor is read through its storage where
    `by_storage(tensor)` says so, or all are where their `storages` and `views` (program.storage_views) are
    given; the rest are copied on their own."""

    def __init__(self, tensors, device_index: int, by_storage=None, storages=None, views=None):
        whole, apart = tensors, []
        if views is None:
            whole, apart = [], []
            for t in tensors:
                (whole if by_storage(t) else apart).append(t)
            storages, views = storage_views(whole)
        self.device_index = device_index
        self.storages, self.views = storages, views
        self.tensors = whole + apart
        self.hosts = _read(storages) if storages else []
        self.copies = [self.hosts[i].as_strided(*spec[:3]) for spec, i, _, _ in views] + [t.cpu() for t in apart]
        self._copy_of = {id(t): copy for t, copy in zip(self.tensors, self.copies)}

    def of(self, value):
        """`value`'s host copy if it is one of the tensors, else `value`."""
        return self._copy_of.get(id(value), value)

    def arguments(self, args, kwargs):
        """An op's arguments with the copies in place of the tensors (at the top or in a list, as ATen takes
        them)."""
        return [self._argument(a) for a in args], {k: self._argument(v) for k, v in kwargs.items()}

    def _argument(self, value):
        kind = type(value)
        return kind(map(self.of, value)) if kind is list or kind is tuple else self.of(value)

    def results(self, func, args, kwargs, out):
        """The op's results on the device, once `func(*args, **kwargs)` (the arguments holding the copies) gave
        `out`: what it wrote of the copies is written back, a returned copy is its tensor, the rest is new."""
        written = {id(value) for value in registry.flatten(registry.written_arguments(func, args, kwargs))}
        rewritten, copied = set(), []
        for k, (tensor, copy) in enumerate(zip(self.tensors, self.copies)):
            if id(copy) not in written:
                continue
            view = self.views[k] if k < len(self.views) else None
            if view is not None and (tuple(copy.shape), copy.stride(), copy.storage_offset()) == view[0][:3]:
                rewritten.add(view[1])
            else:
                copied.append((tensor, copy))  # copied on its own, or an out= the kernel resized
        for i in rewritten:  # once, however many of its views the op wrote
            storage = self.storages[i]
            storage.buffer = transfer.host_to_device(self.hosts[i], storage.device_index)
        for tensor, copy in copied:
            if tensor.shape != copy.shape:
                tensor.resize_(copy.shape)
            tensor.copy_(copy)
        tensor_of = {id(copy): tensor for tensor, copy in zip(self.tensors, self.copies)}
        return _on_device(func, out, tensor_of, self.device_index)


def leaves(args, kwargs):
    """An op's arguments, those in its lists (ATen's tensor lists) in their place."""
    for value in (*args, *kwargs.values()):
        if type(value) is list or type(value) is tuple:
            yield from value
        else:
            yield value


def _read(storages) -> list:
    adaptive.refuse_while_capturing("reading a tensor's values")
    for device_index in {storage.device_index for storage in storages}:
        pending_checks.raise_failures(device_index)  # as reading any tensor's values does
    return read_buffers(storages, lambda buffers: [transfer.device_to_host(buffer, storage.dtype)
                                                   for buffer, storage in zip(buffers, storages)])


def _on_device(func, value, tensor_of, device_index: int):
    """The host run's results on the device: its tensors' own neuron tensors where it returns their copies (an
    in-place op's `self`), new ones for the rest."""
    if isinstance(value, torch.Tensor):
        tensor = tensor_of.get(id(value))
        if tensor is not None:
            return tensor
        if value.layout not in (torch.strided, *SPARSE_LAYOUTS) or value.is_nested:
            kind = "nested" if value.is_nested else str(value.layout)
            raise NotImplementedError(
                f"torchneuron: {func} returns a {kind} tensor; only strided and sparse tensors live on neuron. "
                "Please report the op at the project's issue tracker.")
        if value.layout == torch.strided and value.is_contiguous():
            return transfers.from_host(value, device_index)
        return value.to(torch.device("neuron", device_index))  # its strides kept, as `.to` keeps them
    if isinstance(value, (tuple, list)):
        return type(value)([_on_device(func, v, tensor_of, device_index) for v in value])
    return value
