"""The storage program: how every executable meets the storages it reads and writes.

Eager op executables, adaptive eager's fused queues (which inline them) and compiled graphs all run
one kind of program: read each input tensor through its view of a flat storage buffer, compute, write
the new values of the inputs the computation mutates back through their views, and return the written
storages' new buffers (the old ones are donated) followed by the computation's own results. Only the
computation differs (an op's lowering, a graph), so it is the one thing a caller gives.
"""
import concurrent.futures
import os
import threading

import jax
import torch
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from . import layout
from .dtypes import to_jax
from .platform import jax_device
from .storage import Pending
from .tensor import NeuronTensor


# torch.set_float32_matmul_precision's setting -> JAX's for float32 products and convolutions: full float32
# unless the user allows TF32 ("high") or bfloat16 ("medium"), as on CUDA; JAX's own default would let an
# accelerator round float32 operands (XLA:GPU to TF32), where PyTorch's default is "highest"
JAX_MATMUL_PRECISION = {"highest": "float32", "high": "tensorfloat32", "medium": "bfloat16"}
# part of every program's signature, read on every eager op: the C function behind
# torch.get_float32_matmul_precision, without its Python frame (75 ns a call against 100)
float32_matmul_precision = torch._C._get_float32_matmul_precision


def storage_views(tensors):
    """The storages the tensors view, and for each tensor its view and storage number (None, None if any is
    not a neuron tensor): what a program's signature is made of, as a tensor's view is read from its
    storage. Each view carries its storage's size and dtype too: a view's dtype may differ from its
    storage's (view(dtype)), and complex32 storages share their carrier with complex64 ones."""
    storages, views, index = [], [], {}
    for t in tensors:
        if type(t) is not NeuronTensor:
            return None, None
        s = t._storage
        i = index.get(s)
        if i is None:
            i = index[s] = len(storages)
            storages.append(s)
        views.append((t._spec, i, s.numel, s.dtype))
    return storages, views


class StorageProgram:
    """`compute(values, extras) -> (results, written)`, the program called `name`: `values` are the input tensors' arrays, `extras`
    the arguments that are not storages (traced scalars, a PRNG key), `written` maps the index of each
    input in `mutated_inputs` to its new value.

    Called as `function(*buffers, *extras)` with `buffers` from `buffers_of(storages)`: flat positional
    arguments, jit's fast path (no pytree work); the first `len(written_storages)` are donated. With
    `traced_offsets`, each input's storage offset is an argument too, between the buffers and the extras
    (one program for views that differ only in where they start: `x[i] = ...` in a loop). Its float32
    products keep the precision PyTorch's setting gave when it was made, which its callers' keys include.
    """

    def __init__(self, specs, pattern, storages, mutated_inputs, compute, name: str, traced_offsets=False):
        self.written_storages = written = sorted({pattern[i] for i in mutated_inputs})
        self.argument_storages = written + [p for p in range(len(storages)) if p not in written]
        self.storage_avals = [jax.ShapeDtypeStruct((storages[p].numel,), to_jax(storages[p].dtype))
                              for p in self.argument_storages]
        storage_dtypes = [s.dtype for s in storages]
        argument_storages, n_buffers = self.argument_storages, len(self.argument_storages)
        n_offsets = len(specs) if traced_offsets else 0
        precision = JAX_MATMUL_PRECISION[float32_matmul_precision()]

        def function(*flat):
            buffers = dict(zip(argument_storages, flat[:n_buffers]))
            offsets = flat[n_buffers : n_buffers + n_offsets] if n_offsets else [None] * len(specs)
            values = [layout.read_view(buffers[p], spec, storage_dtypes[p], offset)
                      for spec, p, offset in zip(specs, pattern, offsets)]
            with jax.default_matmul_precision(precision):
                results, new_values = compute(values, flat[n_buffers + n_offsets :])
            for i in mutated_inputs:
                p = pattern[i]
                buffers[p] = layout.write_view(buffers[p], new_values[i], specs[i], storage_dtypes[p], offsets[i])
            return (*[buffers[p] for p in written], *results)

        # the executable's name, in XLA's program text and in profiles
        function.__name__ = function.__qualname__ = name
        self.function = function

    def jit(self, device_index: int, function=None):
        """The program jitted for a device, to be traced and compiled once (see `jit_on_device`); `function`
        stands in for it (the same program, exported)."""
        return jit_on_device(function or self.function, device_index, tuple(range(len(self.written_storages))))

    def over_mesh(self, mesh, avals) -> "OverMesh":
        """The program compiled as one program of all `mesh`'s processes (its collectives name the mesh's axis)."""
        return OverMesh(self.function, mesh, avals, tuple(range(len(self.written_storages))))

    def avals(self, extras) -> list:
        """Arguments for tracing: the storages' buffers as abstract values, then `extras` as given."""
        return [*self.storage_avals, *extras]

    def buffers_of(self, storages) -> list:
        """The storages' current buffers in argument order (each op's path: the plain case read directly)."""
        flat = []
        for p in self.argument_storages:
            buffer = storages[p]._buffer
            flat.append(buffer if buffer is not None and type(buffer) is not Pending else storages[p].buffer)
        return flat


def jit_on_device(function, device_index: int, donate_argnums=()):
    """`function` jitted to run on one device, its arguments and results placed there explicitly: results
    that depend on no input buffer (factories, fill_) would otherwise land on JAX's default device, and a
    number given as itself (uncommitted) or as a device scalar (committed) would be two signatures, each
    compiled (see transfer.device_scalars).

    Meant to be traced and compiled ahead of time (`.trace(...).lower().compile()`), then dropped: JAX keeps
    a jitted function's traces for as long as the traced Python function lives, and the garbage collector
    walks all their objects at every full collection, which the many small objects of each eager step
    trigger (a fused optimizer step's trace alone is tens of thousands). So the jit is of a function of its
    own, which a storage program's function (kept for adaptive eager to inline) is not."""
    placed = SingleDeviceSharding(jax_device(device_index))
    return jax.jit(_own_function(function), donate_argnums=donate_argnums, in_shardings=placed,
                   out_shardings=placed)


def _own_function(function):
    """`function` called through a new function object of the same name (the executable's, in XLA's program
    text and in profiles)."""

    def program(*args):
        return function(*args)

    program.__name__ = program.__qualname__ = function.__name__
    return program


def compile_on_device(function, device_index: int, args):
    """`function` compiled for `args` (arrays, numbers) on one device, keeping nothing of its trace."""
    return jit_on_device(function, device_index).trace(*args).lower().compile()


# threads compiling new ops' programs ahead of their first run (TORCHNEURON_COMPILE_THREADS; 0: none, each program is
# compiled at its first run): XLA compiles outside the GIL, so programs compile side by side and beside the host's work
COMPILE_THREADS = int(os.environ.get("TORCHNEURON_COMPILE_THREADS", min(os.cpu_count() or 1, 8)))
_compile_pool = None
_compile_pool_lock = threading.Lock()
_compiling = set()  # the compiles started ahead and not finished


def compiles_ahead() -> bool:
    """Whether there are compile threads: what is to be compiled on one may be prepared for it."""
    return COMPILE_THREADS > 0


def compile_ahead(compile, *args):
    """`compile(*args)` started on a compile thread: its Future, or None where there are no compile threads (or no
    longer: an op run while the interpreter shuts down, from an atexit hook, compiles at its first run)."""
    global _compile_pool
    if not COMPILE_THREADS:
        return None
    with _compile_pool_lock:
        if _compile_pool is None:
            _compile_pool = concurrent.futures.ThreadPoolExecutor(COMPILE_THREADS, "torchneuron-compile")
        try:
            compiling = _compile_pool.submit(compile, *args)
        except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
            return None
    _compiling.add(compiling)
    compiling.add_done_callback(_compiling.discard)
    return compiling


def wait_for_compiles() -> None:
    """Until every compile started ahead has finished: for whoever counts or times compiles (tests, benchmarks),
    as a structure's fused program may still be compiling after the last flush that will run it."""
    concurrent.futures.wait(list(_compiling))


def _forget_compile_pool() -> None:
    """A forked child has none of its parent's threads: it starts a pool of its own when it first needs one."""
    global _compile_pool, _compile_pool_lock
    _compile_pool, _compile_pool_lock = None, threading.Lock()
    _compiling.clear()


os.register_at_fork(after_in_child=_forget_compile_pool)


def fast_call(compiled):
    """What calls a compiled program without `Compiled.__call__`'s Python frame (0.5 us a call, on the
    op-by-op path): jax's C++ call of it, which it sets at its first call; the program itself where a jax
    version has none."""
    return getattr(compiled, "_call", None) or compiled


class OverMesh:
    """`function` of this process's flat arrays compiled, for arrays like `args`, as one program of all `mesh`'s
    processes (its collectives name the mesh's one axis); called on this process's arrays, it gives this
    process's results. Each argument and result is this process's shard of an array over the mesh (no copy of
    a device array; a host one, as a random op's key is, is put on this process's device of the mesh); a 0-d
    result (a device-side check's flag), which cannot be split, travels as one element and comes back 0-d.
    `out_info`: this process's results, as a compiled executable's."""

    def __init__(self, function, mesh, args, donate_argnums=()):
        axis = PartitionSpec(mesh.axis_names[0])
        self.sharding, self.size, (self.device,) = NamedSharding(mesh, axis), mesh.size, mesh.local_devices
        self.out_info = []

        def flat_results(*flat):
            results = function(*flat)
            self.out_info = [jax.ShapeDtypeStruct(r.shape, r.dtype) for r in results]
            return [r.reshape(-1) for r in results]

        flat_results.__name__ = function.__name__
        mapped = jax.shard_map(_own_function(flat_results), mesh=mesh, in_specs=axis, out_specs=axis,
                               check_vma=False)
        shards = [jax.ShapeDtypeStruct((self.size * a.shape[0],), a.dtype, sharding=self.sharding) for a in args]
        self.compiled = jax.jit(mapped, donate_argnums=donate_argnums).trace(*shards).lower().compile()

    def __call__(self, *arrays):
        shards = [jax.make_array_from_single_device_arrays((self.size * a.shape[0],), self.sharding,
                                                            [self._on_device(a)]) for a in arrays]
        results = [r.addressable_data(0) for r in self.compiled(*shards)]
        return [r if r.shape == out.shape else r.reshape(out.shape) for r, out in zip(results, self.out_info)]

    def _on_device(self, array):
        return array if isinstance(array, jax.Array) else jax.device_put(array, self.device)
