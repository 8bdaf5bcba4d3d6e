"""The neuron tensor: a torch.Tensor whose payload is a view of a device Storage."""
import copy
import functools
from multiprocessing.reduction import ForkingPickler

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..native import _C as native
from . import dlpack, memory
from .dtypes import check_supported
from .layout import contiguous_strides, storage_extent
from .storage import Storage


class NeuronTensor(torch.Tensor):
    """A view (sizes, strides, offset) of a Storage, reporting them exactly as PyTorch would.

    `_spec` caches the view metadata for executable-cache keys; every change of
    metadata goes through `wrap` or `reset_view`, which refresh it.
    """

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if len(types) != 1 and any(t is not NeuronTensor for t in types):
            fake_mode = _fake_mode_taking_real_tensors(types, args, kwargs)
            if fake_mode is not None:
                # as a fake mode takes a plain tensor among its fake ones, as a constant: a neuron tensor captured
                # by a function PyTorch traces with fake tensors (flex attention's score_mod, for its joint graph)
                args, kwargs = torch.utils._pytree.tree_map_only(
                    NeuronTensor, functools.partial(fake_mode.from_tensor, static_shapes=True), (args, kwargs or {}))
                return func(*args, **kwargs)
            # another tensor subclass takes part (funcol's AsyncCollectiveTensor, ...): it unwraps to neuron
            # tensors first and dispatches again
            return NotImplemented
        return _dispatch(func, args, kwargs or {})

    @property
    def data(self):
        return _TENSOR_DATA.__get__(self)

    @data.setter
    def data(self, new):
        assign_data(self, new)
        # `t.data = new` (Module.half/float/to(dtype) on neuron parameters, weight initialisation, EMA) makes the
        # native tensor `new`'s view in C++ without a dispatch; the view kept here follows, or the tensor would
        # report the new shape and dtype and compute with its old values
        if isinstance(new, NeuronTensor):
            self._storage, self._spec = new._storage, new._spec

    def __reduce_ex__(self, protocol):
        # pickled as a plain device tensor is, its storage and view (torch.save writes a storage's bytes once
        # however many tensors view it, and torch.load gives them one storage again); the view this class keeps
        # in Python is made anew from those, so the class is named only for attributes set on the tensor (a
        # Parameter's mark, a user's), and is among torch.load's safe globals for them
        rebuild, args = self._reduce_ex_internal(protocol)
        state = self.__getstate__()
        if not state:
            return rebuild, args
        return torch._tensor._rebuild_from_type_v2, (rebuild, NeuronTensor, args, state)

    def __getstate__(self):
        return {name: value for name, value in self.__dict__.items() if name not in ("_storage", "_spec")}

    def __deepcopy__(self, memo):
        # PyTorch deep-copies a tensor that has a data pointer through UntypedStorage.clone, a host
        # memcpy; a neuron tensor is copied on the device (a new, counted storage), as XLA tensors are
        if not self.is_leaf:
            raise RuntimeError(
                "Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol at "
                "the moment.  If you were attempting to deepcopy a module, this may be because of a "
                "torch.nn.utils.weight_norm usage, see https://github.com/pytorch/pytorch/pull/103001"
            )
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            new = self.clone(memory_format=torch.preserve_format)
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            if name not in ("_storage", "_spec"):
                setattr(new, name, copy.deepcopy(value, memo))
        new.requires_grad_(self.requires_grad)
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        return new

    def __repr__(self, *, tensor_contents=None):
        # format a host copy (one transfer) and let PyTorch add device, dtype and grad_fn
        if tensor_contents is None:
            with torch.no_grad():
                tensor_contents = torch._tensor_str._tensor_str(self.detach().cpu(), indent=len("tensor("))
        text = torch._tensor_str._str(self, tensor_contents=tensor_contents)
        # PyTorch names subclasses in the prefix; users of a device expect plain `tensor(`
        return "tensor(" + text[len(type(self).__name__) + 1 :]

    def numpy(self, *, force: bool = False):
        # as a CUDA tensor refuses (PyTorch's message for subclasses names no remedy); np.asarray comes here too
        if not force:
            raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy the "
                            "tensor to host memory first.")
        return self.detach().cpu().numpy()

    def __dlpack__(self, *, stream=-1, max_version=None, dl_device=None, copy=None):
        # PyTorch's export reads a data pointer a neuron tensor's TensorImpl has not got; its checks are kept
        dlpack.refuse_unexportable(self)
        if stream is not None and type(stream) is not int:
            raise TypeError("stream must be ``int`` or ``none``")
        return dlpack.export(self, max_version, dl_device, copy)

    def __dlpack_device__(self):
        return dlpack.memory_device(self)

    def tolist(self):
        # PyTorch refuses tolist() on subclasses; the values are plain device data
        return self.detach().cpu().tolist()

    def __format__(self, format_spec):
        if self.dim() == 0:
            return self.item().__format__(format_spec)
        return object.__format__(self, format_spec)


_TENSOR_DATA = torch._C.TensorBase.data


def assign_data(tensor: torch.Tensor, new) -> None:
    """`tensor.data = new`, for neuron tensors and (patches.py) parameters. Between a neuron tensor and another
    device's, whose TensorImpls PyTorch's set_data refuses to mix, the object takes `new`'s data by
    swap_tensors (its class with it), keeping what it was (a Parameter, requires_grad) and its attributes
    (FSDP's marks on its flat parameters); its gradient, of the old device, is dropped."""
    if isinstance(new, torch.Tensor) and isinstance(tensor, NeuronTensor) != isinstance(new, NeuronTensor):
        _swap_in_data(tensor, new)
    else:
        _TENSOR_DATA.__set__(tensor, new)


def _swap_in_data(tensor: torch.Tensor, new: torch.Tensor) -> None:
    replacement = new.detach()
    if isinstance(tensor, torch.nn.Parameter):
        replacement = torch.nn.Parameter(replacement, tensor.requires_grad)
    else:
        replacement.requires_grad_(tensor.requires_grad)
    attributes = dict(tensor.__dict__)
    try:
        torch.utils.swap_tensors(tensor, replacement)
    except RuntimeError as error:
        raise NotImplementedError(
            f"torchneuron: `tensor.data = new` from {new.device} to a {tensor.device} tensor (or back) swaps the "
            "tensor object's data, as PyTorch's set_data cannot mix a neuron tensor with another device's, and this "
            f"tensor is held by others (its views, an autograd graph): {error}. Move a copy instead "
            "(`tensor.to(...)`). Please report it at the project's issue tracker if you need this.") from error
    for name, value in attributes.items():
        tensor.__dict__.setdefault(name, value)


def host_copy_reduction(tensor):
    """A neuron tensor (dense or sparse) pickled as a host copy rebuilt on its device, as PyTorch pickles XLA
    tensors."""
    return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
            (tensor.detach().cpu(), tensor.dtype, str(tensor.device), tensor.requires_grad))


# sent to another process as a host copy: a storage goes there through CPU shared memory (or CUDA's IPC), which a
# neuron storage has not got
ForkingPickler.register(NeuronTensor, host_copy_reduction)
torch.serialization.add_safe_globals([NeuronTensor])


def _fake_mode_taking_real_tensors(types, args, kwargs):
    """The mode of the fake tensors among an op's arguments, if it takes real tensors (allow_non_fake_inputs)."""
    if FakeTensor not in types:
        return None
    fake = next(t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if type(t) is FakeTensor)
    return fake.fake_mode if fake.fake_mode.allow_non_fake_inputs else None


def _dispatch(func, args, kwargs):
    raise RuntimeError("torchneuron: neuron tensors need the eager layer (import torchneuron)")


def bind_dispatch(dispatch) -> None:
    """The eager layer, above this one, gives the function every op on neuron tensors goes to."""
    global _dispatch
    _dispatch = dispatch


def wrap(storage: Storage, shape, stride, offset: int, dtype: torch.dtype, versions_of=None) -> NeuronTensor:
    """A neuron tensor viewing `storage`: the only constructor (the class is never called directly). Given
    `versions_of`, a tensor of the same storage, it counts versions with that one, as a detached view does."""
    return view_of(storage, (tuple(shape), tuple(stride), offset, dtype, storage.device_index), versions_of)


def view_of(storage: Storage, spec: tuple, versions_of=None) -> NeuronTensor:
    """`wrap` given the tensor's `_spec` (shape, stride, offset, dtype, device index), which it keeps: views and
    detaches share their cached or source's spec, a tuple fewer for Python's garbage collector to count per op."""
    tensor = native.new_tensor(NeuronTensor, storage, spec[0], spec[1], spec[2], spec[3], versions_of)
    tensor._storage = storage
    tensor._spec = spec
    return tensor


def new_tensor(flat, spec) -> NeuronTensor:
    """A tensor with view `spec` (its `_spec`: shape, stride, offset, dtype, device index, kept as given) of a new
    Storage holding the flat buffer."""
    return view_of(Storage(flat.shape[0], spec[3], spec[4], flat), spec)


def wrap_buffer(flat, shape, dtype, device_index: int) -> NeuronTensor:
    """A new contiguous tensor of `shape` and `dtype` owning the flat device buffer `flat`."""
    shape = tuple(shape)
    return new_tensor(flat, (shape, contiguous_strides(shape), 0, dtype, device_index))


def new_storage_for(shape, stride, dtype, device_index, buffer=None) -> Storage:
    check_supported(dtype)
    numel = storage_extent(shape, stride)
    if buffer is None:
        memory.check_fits(numel * dtype.itemsize, device_index)
    return Storage(numel, dtype, device_index, buffer)
