"""Every patch TorchNeuron applies to PyTorch (and one each to Hugging Face transformers and safetensors), one
function each, naming the upstream gap.

Runtime patches (applied on import): a Python backend has no C++ allocator,
device guard or hooks beyond the basics, so PyTorch paths that need them are
routed around. Compile patches (applied when the `neuron` Dynamo backend
loads): a NeuronTensor is a wrapper subclass only so that its ops reach our
`__torch_dispatch__`; to Dynamo and AOTAutograd it must look like an ordinary
tensor on the `neuron` device, which PyTorch decides by exact type in a few
places. `applied()` reports every patch and a test checks they are in force.
"""
import contextlib
import functools
import importlib
import importlib.abc
import importlib.util
import inspect
import os
import sys

import torch

from .runtime import dlpack, events
from .runtime.dtypes import scalar_type_name
from .runtime.layout import conv_memory_format
from .runtime.tensor import NeuronTensor, assign_data, view_of

_APPLIED = []
# (owner, name) of each PyTorch function a runtime patch wraps that compiled code calls: Dynamo must trace the
# wrapper (dynamo_traces_our_wrappers_of_traced_functions), which it would skip as torchneuron's code
_TRACED_WRAPPERS = []


def _patch(fn):
    _APPLIED.append(fn.__name__)
    return fn


def _is_neuron(location) -> bool:
    return isinstance(location, (str, torch.device)) and torch.device(location).type == "neuron"


@_patch
def script_modules_load_onto_neuron() -> None:
    """torch.jit.load rebuilds each tensor in C++ by setting the storage and sizes of an empty device tensor's
    TensorImpl directly, which a neuron tensor's view, kept in Python, does not see: loaded onto neuron, the
    parameters came out empty. A module mapped to neuron, or saved from it, is loaded onto the CPU and its
    parameters and buffers then moved to their devices, tied ones staying tied."""
    original = torch.jit.load

    @functools.wraps(original)
    def load(f, map_location=None, *args, **kwargs):
        if _is_neuron(map_location):
            module = original(f, "cpu", *args, **kwargs)
            _move_script_tensors(module, lambda path: map_location)
            return module
        if map_location is not None:
            return original(f, map_location, *args, **kwargs)
        start = f.tell() if hasattr(f, "seek") else None
        module = original(f, None, *args, **kwargs)
        saved_on = {path: t.device for path, _, _, t in _script_tensors(module) if t.device.type == "neuron"}
        if not saved_on:
            return module
        if start is not None:
            f.seek(start)
        module = original(f, "cpu", *args, **kwargs)
        _move_script_tensors(module, lambda path: saved_on.get(path, "cpu"))
        return module

    torch.jit.load = load


def _script_tensors(module):
    """(path, owning module, name, tensor) of each parameter and buffer of a script module and its children."""
    for prefix, owner in module.named_modules():
        for kind in ("_parameters", "_buffers"):
            for name, tensor in getattr(owner, kind).items():
                if tensor is not None:
                    yield f"{prefix}.{name}" if prefix else name, owner, name, tensor


def _script_tensor_places(module) -> list:
    """Each tensor of a script module with its places, [(path, owner, name)]: a script module hands out the same
    Python object for a tensor while it is alive (kept alive here), so tied tensors (one C++ tensor in two
    modules) are recognised by identity."""
    places = {}
    for path, owner, name, tensor in _script_tensors(module):
        places.setdefault(id(tensor), (tensor, []))[1].append((path, owner, name))
    return list(places.values())


def _script_ties(module) -> list:
    """The (owner, name) places of each tensor found in more than one place of a script module."""
    return [[(owner, name) for _, owner, name in where] for _, where in _script_tensor_places(module) if len(where) > 1]


def _move_script_tensors(module, device_of) -> None:
    """Each tensor moved once, to the device `device_of` its first place's path, and set in all its places."""
    for tensor, where in _script_tensor_places(module):
        copy = tensor.detach().to(device_of(where[0][0])).requires_grad_(tensor.requires_grad)
        for _, owner, name in where:
            owner._c.setattr(name, copy)


@_patch
def foreach_tensor_type() -> None:
    """Optimizers and clip_grad_norm_ take their foreach/fused paths only for tensors whose exact type is in
    `_foreach_supported_types` (torch.Tensor, Parameter); neuron tensors are a subclass, so they would always
    take the per-tensor loop, and `foreach=True` would raise."""
    # by module path: this runs while `import torch` is still initialising torch.optim
    for name in ("torch.optim.optimizer", "torch.utils._foreach_utils"):
        allowlist = importlib.import_module(name)._foreach_supported_types
        if NeuronTensor not in allowlist:
            allowlist.append(NeuronTensor)


@_patch
def backward_runs_on_the_calling_thread() -> None:
    """The autograd engine runs every device's backward nodes on a thread of that device's, except the CPU's,
    Meta's and Lazy's (engine.cpp `should_run_in_cpu_ready_queue`), and a PrivateUse1 backend cannot join
    them. Our backward nodes are Python that launches asynchronous executables: a thread of their own overlaps
    nothing (the caller waits for the backward), and it moved the step's Python objects (refcounts, caches,
    the modules') between cores at every backward, which slowed the caller's own forward and optimizer step
    as much as the backward (a third more CPU time for the small GPT's step at negligible sizes; pinned to one
    core, the two threads cost what one does). A backward from neuron roots runs on the calling thread, as
    under `torch.autograd.set_multithreading_enabled(False)`, for `backward()` and `autograd.grad()` alike;
    `TORCHNEURON_AUTOGRAD_DEVICE_THREADS=1` keeps PyTorch's device threads."""
    if os.environ.get("TORCHNEURON_AUTOGRAD_DEVICE_THREADS", "0") == "1":
        return
    original = torch.autograd.graph._engine_run_backward
    is_enabled, set_enabled = torch._C._is_multithreading_enabled, torch._C._set_multithreading_enabled

    @functools.wraps(original)
    def engine_run_backward(t_outputs, *args, **kwargs):
        if not any(isinstance(t, NeuronTensor) for t in t_outputs) or not is_enabled():
            return original(t_outputs, *args, **kwargs)
        set_enabled(False)
        try:
            return original(t_outputs, *args, **kwargs)
        finally:
            set_enabled(True)

    engine_run_backward.neuron_patched = True
    torch.autograd.graph._engine_run_backward = torch.autograd._engine_run_backward = engine_run_backward


def _holds_neuron(module) -> bool:
    return any(t.device.type == "neuron" for t in module.parameters())


def _swapping(method, targets_neuron):
    @functools.wraps(method)
    def convert(self, *args, **kwargs):
        to_neuron = targets_neuron(*args, **kwargs)
        if not (to_neuron or _holds_neuron(self)):
            return method(self, *args, **kwargs)
        if to_neuron:
            _refuse_uninitialized(self)
        previous = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)
        # a script module's tensors are swapped one slot at a time, a tied one once per slot
        ties = _script_ties(self) if isinstance(self, torch.jit.ScriptModule) else ()
        # swap_tensors swaps the objects' __dict__ too: attributes set on a parameter (vLLM's weight loaders)
        # would stay with the old tensor, where `param.data = new` (CUDA's path) keeps them
        attributes = [(p, dict(p.__dict__)) for p in self.parameters() if p.__dict__]
        try:
            return method(self, *args, **kwargs)
        except RuntimeError as error:
            if "Couldn't swap" not in str(error):
                raise
            # a parameter a live autograd graph holds cannot be swapped in place (the old nn.utils.weight_norm
            # keeps the weight it computed, and its graph, on the module; or a loss not yet backpropagated):
            # those left move as new Parameter objects, as PyTorch moves them between such devices without swapping
            torch.__future__.set_swap_module_params_on_conversion(False)
            return method(self, *args, **kwargs)
        finally:
            torch.__future__.set_swap_module_params_on_conversion(previous)
            for parameter, saved in attributes:
                for name, value in saved.items():
                    parameter.__dict__.setdefault(name, value)
            for (first, first_name), *others in ties:
                for owner, name in others:
                    owner._c.setattr(name, getattr(first, first_name))

    return convert


@_patch
def parameter_data_assignment_crosses_to_and_from_neuron() -> None:
    """`param.data = tensor` keeps the Parameter object and gives it the tensor's data. PyTorch allows it only
    between TensorImpls of compatible types (the CPU's and CUDA's are), and a CPU tensor's and a neuron
    tensor's (a wrapper subclass) are not: FullyShardedDataParallel moves its parameters to their device so.
    A CPU parameter given neuron data takes it as a neuron tensor does the other way (NeuronTensor.data)."""
    data = torch._C.TensorBase.data
    torch.nn.Parameter.data = property(data.__get__, assign_data, doc=data.__doc__)


@_patch
def dlpack_exchanges_neuron_tensors() -> None:
    """`torch.utils.dlpack.to_dlpack` (also `torch.to_dlpack`) is PyTorch's C export, which reads a data pointer a
    neuron tensor's TensorImpl has not got (it failed with "Could not run 'aten::view' ... from the 'neuron'
    backend"); a neuron tensor exports itself (runtime/dlpack.py), as `tensor.__dlpack__()` does. And
    `torch.from_dlpack` gives a tensor "on the same device as ext_tensor" unless told another: for a neuron
    tensor, whose memory DLPack places on the PJRT device's own kind, a tensor of the same storage (a CUDA
    tensor's is a CUDA tensor of the same memory)."""
    export, take = torch.utils.dlpack.to_dlpack, torch.utils.dlpack.from_dlpack

    @functools.wraps(export)
    def to_dlpack(tensor):
        return dlpack.export(tensor) if isinstance(tensor, NeuronTensor) else export(tensor)

    @functools.wraps(take)
    def from_dlpack(ext_tensor, *, device=None, copy=None):
        if isinstance(ext_tensor, NeuronTensor):
            target = ext_tensor.device if device is None else torch.device(device)
            if target.type == "neuron" and target.index in (None, ext_tensor.device.index):
                dlpack.refuse_unexportable(ext_tensor)
                return ext_tensor.clone() if copy else view_of(ext_tensor._storage, ext_tensor._spec)
        return take(ext_tensor, **dlpack.given(device=device, copy=copy))

    torch.utils.dlpack.to_dlpack = torch.to_dlpack = to_dlpack
    torch.utils.dlpack.from_dlpack = torch.from_dlpack = from_dlpack


def _refuse_uninitialized(module) -> None:
    """A lazy module's parameters cannot move to neuron before their first forward: an uninitialized
    parameter is a subclass of the tensor it moves, and a neuron tensor cannot be re-classed so (moved, it
    became an ordinary empty parameter, and the first forward failed on its size)."""
    tensors = [*module.parameters(), *module.buffers()]
    if any(isinstance(t, torch.nn.parameter.UninitializedTensorMixin) for t in tensors):
        raise NotImplementedError(
            f"torchneuron: {type(module).__name__} has uninitialized (lazy) parameters or buffers, which cannot "
            "move to neuron yet: run one forward on the CPU first (a dummy batch initializes them), then move "
            "the module. Please report it at the project's issue tracker if you need this."
        )


def _to_neuron(*args, **kwargs) -> bool:
    device = torch._C._nn._parse_to(*args, **kwargs)[0]
    return device is not None and device.type == "neuron"


@_patch
def tied_parameters_on_conversion() -> None:
    """`Module.to` keeps a Parameter object (`param.data = new`) only when the old and new tensors have
    compatible TensorImpls; between the CPU and a wrapper-subclass device it makes a new Parameter per
    module instead, which unties shared weights (GPT-2's lm_head and wte). PyTorch's swap_tensors path
    keeps each object; turn it on for conversions to and from neuron only."""
    module = torch.nn.Module
    module.to = _swapping(module.to, _to_neuron)
    module.cpu = _swapping(module.cpu, lambda *a, **k: False)
    module.neuron = _swapping(module.neuron, lambda *a, **k: True)


@_patch
def accelerator_api_routes_to_torch_neuron():
    """torch.accelerator.memory_* read a C++ DeviceAllocator's statistics; neuron's memory is accounted
    in Python (device buffers are PJRT's), and empty_host_cache asks for a C++ HostAllocator that neuron
    does not register (it crashed once the device was in use; get_memory_info and
    reset_accumulated_memory_stats failed an internal assert). When neuron is the current accelerator these
    calls go to torch.neuron instead, in torch.accelerator and in its `memory` module (whose functions call
    each other: torch.accelerator.memory.memory_allocated failed the same assert). (Device index and
    synchronize go through the native device guard.)"""
    namespaces = [torch.accelerator, getattr(torch.accelerator, "memory", None)]

    def route(name, neuron_name=None):
        for namespace in filter(None, namespaces):
            original = getattr(namespace, name, None)
            if original is None:
                continue

            @functools.wraps(original)
            def routed(*args, original=original, **kwargs):
                if _accelerator_is_neuron():
                    return getattr(torch.neuron, neuron_name or name)(*args, **kwargs)
                return original(*args, **kwargs)

            setattr(namespace, name, routed)

    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                 "memory_stats", "reset_peak_memory_stats", "reset_accumulated_memory_stats", "empty_cache",
                 "empty_host_cache"):
        route(name)
    route("get_memory_info", "mem_get_info")


@_patch
def data_parallel_copies_between_neuron_devices() -> None:
    """nn.DataParallel (and torch.nn.parallel.comm, which torch.neuron.comm is) moves tensors between devices
    with C++ functions that only CUDA builds of PyTorch have (torch._C._broadcast_coalesced, _scatter,
    _gather, ...), for CUDA tensors only. For neuron tensors, and in builds without them, they are the copies
    CUDA's comm.cpp makes (a tensor's own device keeps the tensor, the others get copies; coalesced copies get
    version counters of their own). reduce_add, PyTorch's Python, asks whether NCCL can take the tensors, which
    warns in builds without NCCL: it cannot take neuron tensors."""
    for name, ours in (("_broadcast", _broadcast), ("_broadcast_out", _broadcast_out),
                       ("_broadcast_coalesced", _broadcast_coalesced), ("_scatter", _scatter),
                       ("_scatter_out", _scatter_out), ("_gather", _gather), ("_gather_out", _gather_out)):
        setattr(torch._C, name, _for_neuron_tensors(getattr(torch._C, name, None), ours))
    nccl = importlib.import_module("torch.cuda.nccl")
    is_available = nccl.is_available

    @functools.wraps(is_available)
    def nccl_is_available(tensors):
        tensors = list(tensors)
        return not any(t.device.type == "neuron" for t in tensors) and is_available(tensors)

    nccl.is_available = nccl_is_available


@_patch
def subgroups_default_to_the_neuron_devices() -> None:
    """dist.new_subgroups() (the intra-machine groups of post-localSGD and hierarchical model averaging) takes
    its default group size from torch.cuda.device_count() and refuses without CUDA; with neuron as the
    accelerator the default is torch.neuron.device_count(), as CUDA's is its device count."""
    if not torch.distributed.is_available():
        return
    c10d = importlib.import_module("torch.distributed.distributed_c10d")
    new_subgroups = c10d.new_subgroups

    @functools.wraps(new_subgroups)
    def new_subgroups_of_neuron_devices(group_size=None, *args, **kwargs):
        if group_size is None and not torch.cuda.is_available() and _accelerator_is_neuron():
            group_size = torch.neuron.device_count()
        return new_subgroups(group_size, *args, **kwargs)

    c10d.new_subgroups = torch.distributed.new_subgroups = new_subgroups_of_neuron_devices


@_patch
def checkpoint_staging_leaves_the_device_view_behind() -> None:
    """Distributed checkpoint's async save stages a state dict in host memory with a deep copy of its own
    (StateDictStager), which copies each tensor's storage to the host and its Python attributes onto the copy.
    A neuron tensor's view of its device storage is kept in such attributes; copying them failed ("cannot pickle
    'PyCapsule' object"). They are left out: the host copy is a CPU tensor like any other."""
    if not torch.distributed.is_available():
        return

    def patch(stager_module):
        offload = getattr(stager_module.StateDictStager, "_offload_tensor", None)  # private: it may change
        if offload is None:
            return

        @functools.wraps(offload)
        def _offload_tensor(self, x, memo, non_blocking=False):
            if type(x) is not NeuronTensor:
                return offload(self, x, memo, non_blocking)
            for own in (x._storage, x._spec):
                memo[id(own)] = None  # the deep copy finds them copied already, as nothing
            staged = offload(self, x, memo, non_blocking)
            for name in ("_storage", "_spec"):
                staged.__dict__.pop(name, None)
            return staged

        stager_module.StateDictStager._offload_tensor = _offload_tensor

    _when_imported("torch.distributed.checkpoint._state_dict_stager", patch)


@_patch
def fsdp1_offloads_neuron_parameters_by_copy() -> None:
    """FSDP1's offloaded state dicts and summon_full_params(offload_to_cpu=True) move the unsharded flat
    parameter to the CPU with `flat_param.data = ...` while the module's views of it are alive, which a neuron
    tensor cannot do (patches above swap the object's data, and views hold it). For a neuron flat parameter the
    module's views are made of a CPU copy instead, and what they wrote is copied back at the end, as FSDP's own
    move back does."""

    def patch(flat_param_module):
        handle_class = flat_param_module.FlatParamHandle
        to_cpu = handle_class.to_cpu

        @contextlib.contextmanager
        def to_cpu_by_copy(self):
            if self.flat_param.device.type != "neuron":
                with to_cpu(self):
                    yield
                return
            on_host = self.flat_param.detach().cpu()
            views_of = self._get_unflat_views
            self._get_unflat_views = lambda tensor=None: views_of(on_host if tensor is None else tensor)
            self._use_unsharded_views(as_params=self._use_orig_params)
            try:
                yield
            finally:
                self._get_unflat_views = views_of
                with torch.no_grad():
                    self.flat_param.copy_(on_host)
                self._use_unsharded_views(as_params=self._use_orig_params)

        handle_class.to_cpu = to_cpu_by_copy

    if torch.distributed.is_available():
        _when_imported("torch.distributed.fsdp._flat_param", patch)


def _for_neuron_tensors(cuda_function, ours):
    if cuda_function is None:
        return ours

    @functools.wraps(cuda_function)
    def copy(*args):
        # host tensors go where device indices mean neuron devices (DataParallel scatters its inputs so)
        tensors = [t for a in args for t in (a if isinstance(a, (list, tuple)) else [a]) if isinstance(t, torch.Tensor)]
        to_neuron = any(t.device.type == "neuron" for t in tensors) or _accelerator_is_neuron()
        return ours(*args) if to_neuron else cuda_function(*args)

    return copy


def _accelerator_is_neuron() -> bool:
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == "neuron"


def _neuron(index) -> torch.device:
    return torch.device("neuron", index)


def _broadcast(tensor, devices):
    on_device = tensor.device.type == "neuron"
    if on_device and tensor.get_device() != devices[0]:
        raise RuntimeError("device of broadcasted tensor must appear as the first on devices list")
    copies = [tensor.to(_neuron(d), non_blocking=True, copy=True) for d in (devices[1:] if on_device else devices)]
    return [tensor, *copies] if on_device else copies


def _broadcast_out(tensor, out):
    for i, o in enumerate(out):
        if o.shape != tensor.shape:
            raise RuntimeError(f"Expected all output tensors to have same shape as the source (expected "
                               f"{list(tensor.shape)}) in order to broadcast, but output tensor at index {i} has "
                               f"shape {list(o.shape)}")
        o.copy_(tensor, non_blocking=True)
    return list(out)


def _broadcast_coalesced(tensors, devices, buffer_size):
    if any(t.get_device() != devices[0] for t in tensors):
        raise RuntimeError("All tensors must be on devices[0]: " + str(devices[0]))
    outputs = [list(tensors)] + [[] for _ in devices[1:]]
    for chunk in torch._utils._take_tensors(tensors, buffer_size):
        flat = _broadcast(torch._utils._flatten_dense_tensors(chunk), devices)
        for device_outputs, copy in zip(outputs[1:], flat[1:]):
            # `.data`: views of one flat copy would share its version counter
            device_outputs += [t.data for t in torch._utils._unflatten_dense_tensors(copy, chunk)]
    return [outputs[0]] + [list(torch._utils._reorder_tensors_as(o, tensors)) for o in outputs[1:]]


def _scatter(tensor, devices, chunk_sizes, dim, streams):
    if chunk_sizes is None:
        chunks = tensor.chunk(len(devices), dim)
    else:
        if sum(chunk_sizes) != tensor.size(dim):
            raise RuntimeError(f"given chunk sizes don't sum up to the tensor's size (sum(chunk_sizes) == "
                               f"{sum(chunk_sizes)}, but expected {tensor.size(dim)})")
        if any(size <= 0 for size in chunk_sizes):
            raise RuntimeError("Chunk size must be positive")
        chunks = tensor.split(list(chunk_sizes), dim)
    return [_on_stream(streams, i, devices[i], lambda: c.to(_neuron(devices[i]), non_blocking=True))
            for i, c in enumerate(chunks)]


def _scatter_out(tensor, out, dim, streams):
    chunks = tensor.split([o.size(dim) for o in out], dim)
    return [_on_stream(streams, i, o.get_device(), lambda: o.copy_(c, non_blocking=True))
            for i, (o, c) in enumerate(zip(out, chunks))]


def _on_stream(streams, i, device_index, copy):
    stream = streams[i] if streams else None
    if stream is None:
        return copy()
    if stream.device_index != device_index:
        raise RuntimeError(f"Expected the device associated with the stream at index {i} (was "
                           f"{stream.device_index}) to match the device supplied at that index (expected "
                           f"{device_index})")
    with torch.neuron.stream(stream):
        return copy()


def _gather(tensors, dim, destination):
    device = torch.device("cpu") if destination == -1 else _neuron(destination)
    return _gather_out(tensors, torch.empty(_gathered_shape(tensors, dim), dtype=tensors[0].dtype, device=device,
                                            memory_format=_gathered_format(tensors)), dim)


def _gather_out(tensors, out, dim):
    shape = _gathered_shape(tensors, dim)
    if list(out.shape) != shape:
        raise RuntimeError(f"Expected out tensor to have size {shape}, but got {list(out.shape)}")
    start = 0
    for t in tensors:
        out.narrow(dim, start, t.size(dim)).copy_(t, non_blocking=True)
        start += t.size(dim)
    return out


def _gathered_shape(tensors, dim) -> list:
    if not tensors:
        raise RuntimeError("Expected at least one tensor to gather from")
    expected = list(tensors[0].shape)
    for t in tensors:
        expected[dim] = t.size(dim)
        if list(t.shape) != expected:
            raise RuntimeError(f"Gather got an input of invalid size: got {list(t.shape)}, but expected {expected}")
    expected[dim] = sum(t.size(dim) for t in tensors)
    return expected


def _gathered_format(tensors):
    channels_last = all(t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) for t in tensors)
    return torch.channels_last if channels_last else torch.contiguous_format


@_patch
def flex_attention_accepts_neuron() -> None:
    """`flex_attention` refuses devices outside a fixed set (cuda, cpu, xpu, hpu, mps) before it runs
    anything; on neuron its higher-order ops run PyTorch's dense implementation (ops/flex_attention.py)."""
    module = importlib.import_module("torch.nn.attention.flex_attention")
    original = module._validate_device

    def _validate_device(query, key, value):
        if query.device.type != "neuron":
            original(query, key, value)

    module._validate_device = _validate_device
    _TRACED_WRAPPERS.append((module, "_validate_device"))


@_patch
def jagged_attention_on_neuron_takes_flash_attention() -> None:
    """scaled_dot_product_attention of nested (jagged) tensors chooses its kernel with CUDA's checks, which refuse
    neuron tensors, and then takes the math path, which converts to strided nested tensors, which neuron cannot
    hold. Without a mask (flash attention's case, as on CUDA) neuron's inputs take the flash path: its op for
    packed sequences, `_flash_attention_forward`, is lowered (ops/attention.py)."""
    def patch(sdpa):
        original = sdpa._select_sdp_backend

        def _select_sdp_backend(query, key, value, attn_mask, dropout, is_causal, enable_gqa):
            if (query.device.type == "neuron" and attn_mask is None and not enable_gqa
                    and torch.backends.cuda.flash_sdp_enabled()):
                return torch.nn.attention.SDPBackend.FLASH_ATTENTION
            return original(query, key, value, attn_mask, dropout, is_causal, enable_gqa)

        sdpa._select_sdp_backend = _select_sdp_backend
        _select_sdp_backend.neuron_patched = True

    _when_imported("torch.nested._internal.sdpa", patch)


def _when_imported(name: str, then) -> None:
    """`then(module)` now if the module is imported, else once it is."""
    if name in sys.modules:
        then(sys.modules[name])
    else:
        sys.meta_path.insert(0, _WhenImported(name, then))


@_patch
def inductor_hands_neuron_graphs_to_neuron() -> None:
    """Inductor has no code generator for PrivateUse1 devices, so `torch.compile(fn)` with its default
    backend (TorchTitan compiles flex_attention and create_block_mask that way) would fail on neuron
    inputs: such graphs go to the `neuron` backend instead; Inductor's options do not apply to it."""
    original = torch._TorchCompileInductorWrapper.__call__

    def __call__(self, model, inputs):
        # a graph may make its neuron tensors itself (create_block_mask takes no tensor)
        values = torch.utils._pytree.tree_leaves([*inputs, *(n.meta.get("example_value") for n in model.graph.nodes)])
        if any(isinstance(x, torch.Tensor) and x.device.type == "neuron" for x in values):
            return torch._dynamo.lookup_backend("neuron")(model, inputs)
        return original(self, model, inputs)

    torch._TorchCompileInductorWrapper.__call__ = __call__


@_patch
def compile_and_export_apply_the_compile_patches() -> None:
    """Dynamo needs the compile patches below before it wraps a tensor, whatever the backend: `torch.compile(fn)`
    with Inductor (which hands neuron graphs to `neuron`), "eager" or "aot_eager", eager `flex_attention`
    (which compiles its op with the "eager" backend), strict `torch.export.export` and Dynamo's own entry points
    (`torch._dynamo.explain`, `optimize`, `export`) would otherwise see neuron tensors as user-defined objects
    ("Unsupported method call"), and trace into torchneuron itself. They are applied at the first call of any,
    not at import: that would import Dynamo into every `import torch` (about a second)."""
    for module, name in ((torch, "compile"), (torch.export, "export")):
        _apply_compile_patches_first(module, name)
    _when_imported("torch._dynamo", _wrap_dynamo_entry_points)  # imported before torchneuron when autoloading is off


def _apply_compile_patches_first(module, name) -> None:
    original = getattr(module, name)

    def patched_first(*args, _original=original, **kwargs):
        apply_compile()
        return _original(*args, **kwargs)

    setattr(module, name, functools.wraps(original)(patched_first))


def _wrap_dynamo_entry_points(dynamo) -> None:
    for name in ("explain", "optimize", "export"):
        _apply_compile_patches_first(dynamo, name)


@_patch
def transformers_sees_neuron_graph_captures() -> None:
    """Hugging Face transformers skips its host-side checks (a padding mask's `.all()`, read on the host) while
    a graph is captured, but asks only CUDA and XPU whether one is (`is_tracing`): capturing a model on neuron
    failed at the first check. Its question about CUDA's capture also asks neuron's, once transformers is
    imported (nothing is imported here)."""

    def patch(import_utils):
        asks_cuda = getattr(import_utils, "is_cuda_stream_capturing", None)
        if asks_cuda is None or getattr(asks_cuda, "neuron_patched", False):
            return

        @functools.wraps(asks_cuda)
        def is_cuda_stream_capturing():
            return torch.neuron.is_current_stream_capturing() or asks_cuda()

        is_cuda_stream_capturing.neuron_patched = True
        import_utils.is_cuda_stream_capturing = is_cuda_stream_capturing

    _when_imported("transformers.utils.import_utils", patch)


@_patch
def safetensors_loads_onto_neuron() -> None:
    """safetensors' loader (in Rust) takes only the device names it knows (cpu, cuda, mps, xpu, ...):
    `safetensors.torch.load_file(path, device="neuron")`, `load_model(..., device="neuron")` and
    `safe_open(..., device="neuron")` raised "device neuron is invalid". Given a neuron device, the file is
    read on the CPU and each tensor handed over on the device, as safetensors moves them to CUDA."""

    def patch(module):
        opens = module.safe_open
        if getattr(opens, "neuron_patched", False):
            return

        @functools.wraps(opens)
        def safe_open(filename, framework, device="cpu", **kwargs):
            if not _is_neuron(device):
                return opens(filename, framework, device=device, **kwargs)
            return _ReadOnTheHost(opens(filename, framework, device="cpu", **kwargs), torch.device(device))

        safe_open.neuron_patched = True
        module.safe_open = safe_open

    _when_imported("safetensors", patch)
    _when_imported("safetensors.torch", patch)  # which took the name at its import


class _ReadOnTheHost:
    """A safetensors file opened on the CPU whose tensors (and slices) are handed over on `device`."""

    def __init__(self, opened, device):
        self._opened, self._device = opened, device

    def __enter__(self):
        self._opened.__enter__()
        return self

    def __exit__(self, *exc_info):
        return self._opened.__exit__(*exc_info)

    def get_tensor(self, name):
        return self._opened.get_tensor(name).to(self._device)

    def get_tensors(self):
        return {name: tensor.to(self._device) for name, tensor in self._opened.get_tensors().items()}

    def get_slice(self, name):
        return _SliceOnTheHost(self._opened.get_slice(name), self._device)

    def __getattr__(self, name):  # keys, metadata, offset_keys: as the file has them
        return getattr(self._opened, name)


class _SliceOnTheHost:
    def __init__(self, opened, device):
        self._opened, self._device = opened, device

    def __getitem__(self, index):
        return self._opened[index].to(self._device)

    def __getattr__(self, name):  # get_shape, get_dtype
        return getattr(self._opened, name)


class _WhenImported(importlib.abc.MetaPathFinder):
    """Calls `then(module)` once the module named `name` is imported, after its own code ran; `then` only wraps
    attributes (importing anything there could meet modules still being imported)."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            exec_module = spec.loader.exec_module

            def exec_then(module):
                exec_module(module)
                self.then(module)

            spec.loader.exec_module = exec_then
        return spec


# --- compile patches ---------------------------------------------------------------


def dynamo_wraps_neuron_tensors_as_tensors() -> None:
    """Dynamo's VariableBuilder wraps a tensor as a TensorVariable only for its exact type table
    (Tensor, Parameter, FakeTensor, FunctionalTensor) or when `__torch_dispatch__` is Tensor's own;
    anything else becomes a user-defined object and Dynamo traces into our dispatcher. Wrapped, it is a
    plain tensor's TensorVariable, not the subclass variable of a tensor with a `__torch_function__` (ours is
    disabled): higher-order ops check their tensors' variable type exactly (`torch.cond` refused a neuron
    predicate as "improper")."""
    from torch._dynamo.variables import builder
    from torch._dynamo.variables.builder import VariableBuilder

    original = VariableBuilder._type_dispatch_impl
    if getattr(original, "neuron_patched", False):
        return
    infer_subclass_type = builder.infer_subclass_type
    builder.infer_subclass_type = lambda value: None if type(value) is NeuronTensor else infer_subclass_type(value)
    unwrapped = original.__func__.__wrapped__

    @functools.cache
    def type_dispatch_impl(cls, trace_numpy):
        table = dict(unwrapped(cls, trace_numpy))
        table[NeuronTensor] = cls.wrap_tensor
        return table

    type_dispatch_impl.neuron_patched = True
    VariableBuilder._type_dispatch_impl = classmethod(type_dispatch_impl)


def tangents_accept_neuron_tensors() -> None:
    """AOTAutograd's backward compares each runtime tangent's type with the plain `torch.Tensor` it
    traced, and rejects a subclass unless it defines `__coerce_same_metadata_as_tangent__`."""

    def coerce_same_metadata_as_tangent(self, expected_metadata, expected_type=None):
        return self

    NeuronTensor.__coerce_same_metadata_as_tangent__ = coerce_same_metadata_as_tangent


# the runtime and the libraries it runs on, which Dynamo must leave alone
_RUNTIME_PACKAGES = ("torchneuron", "jax", "jaxlib")


def proxy_tracing_takes_neuron_tensors_as_tensors() -> None:
    """AOTAutograd's functionalization and make_fx's proxy mode handle exact tensor types only and leave
    others to their own dispatch. A tensor made from data inside a compiled function (`torch.tensor([],
    device="neuron")`, a KV cache's first keys) is a real neuron tensor there: unrecorded, its fake value
    became the graph's constant, which no program can read. Taken as a plain tensor is taken, it is the
    graph's constant and its lift an op of the graph."""
    from torch._functorch._aot_autograd import runtime_wrappers
    from torch._subclasses import functional_tensor
    from torch.fx.experimental import proxy_tensor

    if NeuronTensor in proxy_tensor.HANDLED_TYPES:
        return
    # runtime_wrappers imported the tuple by name: its analysis mode decides by it as well
    proxy_tensor.HANDLED_TYPES = runtime_wrappers.HANDLED_TYPES = (*proxy_tensor.HANDLED_TYPES, NeuronTensor)
    # functionalization's list of recognised types is written inside its dispatch methods (torch 2.11)
    for dispatcher in (functional_tensor.FunctionalTensor, functional_tensor.FunctionalTensorMode):
        dispatcher.__torch_dispatch__ = _taking_neuron_tensors_as_tensors(dispatcher.__torch_dispatch__)


def _taking_neuron_tensors_as_tensors(torch_dispatch):
    @functools.wraps(torch_dispatch)
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return torch_dispatch(self, func, tuple(t for t in types if t is not NeuronTensor), args, kwargs)

    return __torch_dispatch__


def dynamo_skips_torchneuron_frames() -> None:
    """Dynamo compiles every Python frame that runs while a compiled function is active and that is not
    in its skip list. Eager code between graphs (a graph break's `bool(tensor)`, an op run eagerly)
    enters our dispatcher in Python, and Dynamo would try to trace the runtime itself, and JAX's own
    Python when an op's first run traces its lowering (Dynamo's numpy support then breaks JAX)."""
    from torch._dynamo import trace_rules

    for package in _RUNTIME_PACKAGES:
        if not _skipped_by_dynamo(package):
            trace_rules.add(package)


def _skipped_by_dynamo(package: str = "torchneuron") -> bool:
    from torch._dynamo import trace_rules

    directory = os.path.dirname(os.path.abspath(importlib.import_module(package).__file__))
    return any(os.path.abspath(d) == directory for d in trace_rules.SKIP_DIRS if os.path.isabs(d))


@_patch
def torch_profiler_sessions_reach_neuron() -> None:
    """torch.profiler tells a backend written in Python nothing when a profile starts, stops or is
    exported, and Kineto takes no device activities from Python. `events.session_handler`
    (torchneuron.profiler) is told each start with its activities and config, each stop, and each Chrome
    trace export, which it completes with the neuron device's track and JAX's trace."""
    module = torch.autograd.profiler
    enable, disable, export = module._enable_profiler, module._disable_profiler, module.profile.export_chrome_trace

    def _enable_profiler(config, activities, *args, **kwargs):
        result = enable(config, activities, *args, **kwargs)
        if events.session_handler is not None:
            events.session_handler.start(activities, config)
        return result

    def _disable_profiler(*args, **kwargs):
        if events.session_handler is not None:
            events.session_handler.stop()
        results = disable(*args, **kwargs)
        if events.session_handler is not None:
            events.session_handler.stopped(results)
        return results

    @functools.wraps(export)
    def export_chrome_trace(self, path, *args, **kwargs):
        written = export(self, path, *args, **kwargs)
        if events.session_handler is not None:
            events.session_handler.exported(self.kineto_results, path)
        return written

    module._enable_profiler, module._disable_profiler = _enable_profiler, _disable_profiler
    module.profile.export_chrome_trace = export_chrome_trace


def flex_attention_runs_under_aot_analysis() -> None:
    """AOTAutograd runs a compiled graph's first call under a dispatch mode that checks custom ops for
    aliasing; a higher-order op needs a rule for every mode it meets, and flex attention's ops, which
    run between compiled pieces on neuron when their subgraphs hold an op without a lowering
    (ops/flex_attention.py), have none for this one, which only watches: they run as if it were not
    there."""
    from torch._functorch._aot_autograd.runtime_wrappers import _AnalyzeCustomOpInputOutputMode
    from torch._higher_order_ops.flex_attention import flex_attention, flex_attention_backward

    def unwatched(hop):
        return lambda mode, *args, **kwargs: hop(*args, **kwargs)

    for hop in (flex_attention, flex_attention_backward):
        if _AnalyzeCustomOpInputOutputMode not in hop.python_key_table:
            hop.py_impl(_AnalyzeCustomOpInputOutputMode)(unwatched(hop))


# out= overload -> the functional overload computing its value
_MATRIX_RANK_OUTS = {"out": "default", "out_tol_tensor": "tol_tensor", "atol_rtol_tensor_out": "atol_rtol_tensor",
                     "atol_rtol_float_out": "atol_rtol_float"}
_LIBRARIES = []


@_patch
def matrix_rank_out_writes_its_out() -> None:
    """linalg.matrix_rank's out= overloads are composite kernels that rebind their result instead of writing
    it into `out` when the ops they call go through Python (a tensor subclass, or a dispatch mode: the CPU
    leaves `out` unwritten under one too). For neuron tensors they compute the functional result and copy
    it into `out`, above the composite."""
    library = torch.library.Library("aten", "IMPL")
    for out_overload, functional in _MATRIX_RANK_OUTS.items():
        compute = getattr(torch.ops.aten.linalg_matrix_rank, functional)

        def write_out(*args, out, compute=compute, **kwargs):
            value = compute(*args, **kwargs)
            torch._check(torch.can_cast(value.dtype, out.dtype), lambda: "torch.linalg.matrix_rank: Expected result "
                         f"to be safely castable from Long dtype, but got result with dtype {scalar_type_name(out.dtype)}")
            return torch._refs._maybe_resize_out(out, value.shape).copy_(value)

        library.impl(f"linalg_matrix_rank.{out_overload}", write_out, "AutogradPrivateUse1")
    _LIBRARIES.append(library)


@_patch
def ctc_loss_reads_tensor_lengths_on_the_host() -> None:
    """ctc_loss's composite kernel for lengths given as tensors takes a path of its own for tensor subclasses
    that divides the device loss by the target lengths where they are: CPU lengths, the usual kind, failed
    ("Expected all tensors to be on the same device"). For neuron tensors it reads the lengths as numbers,
    as it does for CUDA's, and takes the list overload."""
    library = torch.library.Library("aten", "IMPL")

    def with_host_lengths(log_probs, targets, input_lengths, target_lengths, blank=0, reduction=1,
                          zero_infinity=False):
        for name, lengths in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
            if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
                raise RuntimeError(f"{name} must be integral")
        return torch.ops.aten.ctc_loss.IntList(log_probs, targets, input_lengths.tolist(), target_lengths.tolist(),
                                               blank, reduction, zero_infinity)

    library.impl("ctc_loss.Tensor", with_host_lengths, "AutogradPrivateUse1")
    _LIBRARIES.append(library)


_META_KERNELS_GIVEN = []  # the ops meta_kernel_where_pytorch_has_none gave a Meta kernel


def meta_kernel_where_pytorch_has_none(op, meta) -> None:
    """`meta` becomes `op`'s Meta kernel if PyTorch has none (it must make output metadata alone, never call
    `op`). Without one, torch.compile's fake tensors run the op on real zero tensors of its device, which
    cannot be made for neuron. The op table (ops.registry.meta_kernel) calls it for ops it lowers that some
    PyTorch release leaves without one: random samplers, in-place fused optimizer steps, and before 2.13
    fused attention's backward and the Transformer encoder's inference fast path."""
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Meta"):
        return
    _meta_library().impl(op, meta, "Meta")
    _META_KERNELS_GIVEN.append(op)


@functools.cache
def _meta_library():
    library = torch.library.Library("aten", "IMPL")
    _LIBRARIES.append(library)
    return library


class NestedTensorsRefused(NotImplementedError):
    def __init__(self):
        super().__init__("torchneuron: nested tensors cannot live on neuron (torch._nested_tensor_from_mask); only "
                         "torch.strided tensors do. Please report your use at the project's issue tracker.")


@_patch
def transformer_encoder_masks_padding_instead_of_nesting() -> None:
    """nn.TransformerEncoder's inference fast path (eval, no_grad, a padding mask, enable_nested_tensor on: the
    default) packs the unpadded tokens into a nested tensor, which neuron cannot hold, and unpads the result
    with zeros. For neuron input the layers take the padding mask instead, which gives every unpadded token
    the same output, and the padded positions get what unpadding and the final norm give them."""
    nest = torch._nested_tensor_from_mask

    def nest_on_host_only(tensor, mask, mask_check=True):
        if type(tensor) is NeuronTensor:
            raise NestedTensorsRefused()
        return nest(tensor, mask, mask_check)

    torch._nested_tensor_from_mask = nest_on_host_only
    left_aligned = torch._nested_tensor_from_mask_left_aligned

    def left_aligned_on_the_device(tensor, mask):
        # whether each row's unmasked tokens come first, which decides whether the CPU would unpad with zeros
        if type(mask) is NeuronTensor:
            return not bool((mask[:, 1:] & ~mask[:, :-1]).any())
        return left_aligned(tensor, mask)

    torch._nested_tensor_from_mask_left_aligned = left_aligned_on_the_device
    encoder_forward = torch.nn.TransformerEncoder.forward

    @functools.wraps(encoder_forward)
    def forward(self, src, *args, **kwargs):
        try:
            return encoder_forward(self, src, *args, **kwargs)
        except NestedTensorsRefused:
            padding = _argument(encoder_forward, "src_key_padding_mask", args, kwargs)
        self.use_nested_tensor = False
        try:
            out = encoder_forward(self, src, *args, **kwargs)
        finally:
            self.use_nested_tensor = True
        # the fast path runs batch-first encoders only: padding is (batch, sequence) as the output's first dims
        filler = src.new_zeros(src.shape[-1])
        if self.norm is not None:
            filler = self.norm(filler)
        return torch.where(padding.bool().unsqueeze(-1), filler, out)

    torch.nn.TransformerEncoder.forward = forward
    _TRACED_WRAPPERS.append((torch.nn.TransformerEncoder, "forward"))


def _argument(function, name, args, kwargs):
    """The value `function(self, src, *args, **kwargs)` got for the parameter `name`."""
    return inspect.signature(function).bind(None, None, *args, **kwargs).arguments.get(name)


@_patch
def fake_convolutions_on_neuron_take_the_eager_memory_format() -> None:
    """torch.compile's fake convolution (and its backward) asks the backend PyTorch would pick for the device
    which memory format the result takes; for a PrivateUse1 device that backend answers contiguous. Neuron
    answers as its eager convolutions do (channels-last for a channels-last input or weight, as CUDA), so a
    compiled convolution's result has the strides of the eager one."""
    determine = torch._C._conv_determine_backend_memory_format

    def determine_for_neuron(input, weight, backend):
        if input.device.type == "neuron":
            return conv_memory_format(input, weight)
        return determine(input, weight, backend)

    torch._C._conv_determine_backend_memory_format = determine_for_neuron


@_patch
def profiler_activity_named_neuron() -> None:
    """torch.profiler.ProfilerActivity names the PrivateUse1 activity after the renamed backend from torch 2.13
    on; older releases know it only as PrivateUse1, and `ProfilerActivity.NEURON` failed."""
    activity = torch.profiler.ProfilerActivity
    if not hasattr(activity, "NEURON"):
        activity.NEURON = activity.PrivateUse1


def compiled_optimizers_capture_on_neuron() -> None:
    """Dynamo traces an optimizer step with `capturable` on, and turns it on in the optimizer itself only
    for CUDA and XPU parameters (whose state it has not made yet); elsewhere the step counts stay CPU tensors,
    and their increments and bias corrections run on the CPU at each step. Neuron parameters get CUDA's
    treatment: counts on the device, the whole step one compiled program (eager steps of that optimizer
    then take its capturable path, as on CUDA)."""
    from torch._dynamo.variables.optimizer import OptimizerVariable

    original = OptimizerVariable._set_capturable
    if getattr(original, "neuron_patched", False):
        return

    @functools.wraps(original)
    def set_capturable(self, tx):
        state = self.value.state
        for group in self.value.param_groups:
            params = group.get("params", [])
            if "capturable" in group and params and all(p.device.type == "neuron" and p not in state for p in params):
                group["capturable"] = True
        return original(self, tx)

    set_capturable.neuron_patched = True
    OptimizerVariable._set_capturable = set_capturable


def dynamo_traces_our_wrappers_of_traced_functions() -> None:
    """Dynamo skips torchneuron's frames (dynamo_skips_torchneuron_frames), among them the wrappers runtime
    patches put around PyTorch functions that compiled code calls: nn.TransformerEncoder.forward
    (transformer_encoder_masks_padding_instead_of_nesting) and flex attention's device check
    (flex_attention_accepts_neuron). Each broke the graph there, on any device once torchneuron was imported,
    and `fullgraph=True` or precompiling (`aot_compile`) failed. Dynamo traces them, as it traced PyTorch's."""
    for owner, name in _TRACED_WRAPPERS:
        function = getattr(owner, name)
        if not getattr(function, "neuron_patched", False):
            traced = functools.wraps(function)(torch._dynamo.dont_skip_tracing(function))
            traced.neuron_patched = True
            setattr(owner, name, traced)


_COMPILE_PATCHES = (dynamo_wraps_neuron_tensors_as_tensors, tangents_accept_neuron_tensors,
                    proxy_tracing_takes_neuron_tensors_as_tensors, dynamo_skips_torchneuron_frames,
                    flex_attention_runs_under_aot_analysis, compiled_optimizers_capture_on_neuron,
                    dynamo_traces_our_wrappers_of_traced_functions)


def apply() -> None:
    if getattr(apply, "done", False):
        return
    script_modules_load_onto_neuron()
    foreach_tensor_type()
    backward_runs_on_the_calling_thread()
    tied_parameters_on_conversion()
    parameter_data_assignment_crosses_to_and_from_neuron()
    dlpack_exchanges_neuron_tensors()
    transformer_encoder_masks_padding_instead_of_nesting()
    fake_convolutions_on_neuron_take_the_eager_memory_format()
    accelerator_api_routes_to_torch_neuron()
    data_parallel_copies_between_neuron_devices()
    subgroups_default_to_the_neuron_devices()
    checkpoint_staging_leaves_the_device_view_behind()
    fsdp1_offloads_neuron_parameters_by_copy()
    torch_profiler_sessions_reach_neuron()
    flex_attention_accepts_neuron()
    jagged_attention_on_neuron_takes_flash_attention()
    inductor_hands_neuron_graphs_to_neuron()
    compile_and_export_apply_the_compile_patches()
    matrix_rank_out_writes_its_out()
    ctc_loss_reads_tensor_lengths_on_the_host()
    profiler_activity_named_neuron()
    transformers_sees_neuron_graph_captures()
    safetensors_loads_onto_neuron()
    apply.done = True


@functools.cache
def apply_compile() -> None:
    for patch in _COMPILE_PATCHES:
        patch()


def applied() -> dict:
    """Which patches are in force, by name (the test suite asserts all are)."""
    from torch._dynamo.variables.builder import VariableBuilder
    from torch._dynamo.variables.optimizer import OptimizerVariable
    from torch.fx.experimental import proxy_tensor

    runtime = {name: getattr(apply, "done", False) for name in _APPLIED}
    return runtime | {
        "dynamo_wraps_neuron_tensors_as_tensors": getattr(
            VariableBuilder._type_dispatch_impl, "neuron_patched", False
        ),
        "tangents_accept_neuron_tensors": hasattr(NeuronTensor, "__coerce_same_metadata_as_tangent__"),
        "proxy_tracing_takes_neuron_tensors_as_tensors": NeuronTensor in proxy_tensor.HANDLED_TYPES,
        "backward_runs_on_the_calling_thread": getattr(torch.autograd._engine_run_backward, "neuron_patched", False),
        "dynamo_skips_torchneuron_frames": all(_skipped_by_dynamo(p) for p in _RUNTIME_PACKAGES),
        "flex_attention_runs_under_aot_analysis": _flex_attention_watched(),
        "compiled_optimizers_capture_on_neuron": getattr(OptimizerVariable._set_capturable, "neuron_patched", False),
        "jagged_attention_on_neuron_takes_flash_attention": getattr(
            importlib.import_module("torch.nested._internal.sdpa")._select_sdp_backend, "neuron_patched", False),
        "dynamo_traces_our_wrappers_of_traced_functions": all(
            getattr(getattr(owner, name), "neuron_patched", False) for owner, name in _TRACED_WRAPPERS),
        "meta_kernel_where_pytorch_has_none": all(
            torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Meta") for op in _META_KERNELS_GIVEN),
    }


def _flex_attention_watched() -> bool:
    from torch._functorch._aot_autograd.runtime_wrappers import _AnalyzeCustomOpInputOutputMode
    from torch._higher_order_ops.flex_attention import flex_attention

    return _AnalyzeCustomOpInputOutputMode in flex_attention.python_key_table
