"""The computation of an op with a lowering: one storage program per op signature, compiled and cached.

For each op and argument signature (shapes, strides, dtypes, static arguments) one XLA executable is
built and cached. It reads its inputs straight from the storages through their views, runs the op's
lowering, and writes in-place and out= results back through the views into the storages, whose old
buffers it donates (runtime/program.py). PyTorch's meta kernels give the output metadata and, for bad
input, PyTorch's own errors before anything is compiled.
"""
import math
import pickle
import threading
import warnings

import jax
import numpy as np
import torch

from ..ops import checks, registry, rules, shape
from ..runtime import compilation_cache, events, layout, memory, pending_checks, rng, sync, transfer
from ..runtime.cache import eager_cache
from ..runtime.dtypes import convert_to
from ..runtime.platform import jax_device, platform_name
from ..runtime.program import StorageProgram, compile_ahead, fast_call, float32_matmul_precision, storage_views
from ..runtime.storage import Storage
from ..runtime.tensor import NeuronTensor, new_tensor
from ..runtime.transfer import device_scalars
from . import adaptive, cpu_dtypes, fallback, host_bookkeeping, out_dtypes, transfers, views
from .arguments import TENSOR_SLOTS, fill, generator_of, template

warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


class Compute:
    """The handler of an op with a lowering: key -> cached executable -> outputs."""

    def __init__(self, rule: rules.OpRule):
        self.rule = rule
        self.func = rule.op
        self.random = rule.random
        self.dtype_from_out = rule.dtype_from_out
        self.drop_kwargs = set(rule.mutated) if rule.out else set()

    def __call__(self, func, args, kwargs, generator=None):
        if self.random and generator is None:
            generator = generator_of(args, kwargs)
        if self.dtype_from_out and kwargs.get("dtype") is None:
            # the CPU kernel may refuse to accumulate in the out tensor's dtype where it takes that `dtype` given
            # (nansum of floats into an integer out): asked before `dtype` is filled in
            cpu_dtypes.check_once_per_dtypes(func, args, kwargs)
            kwargs = {**kwargs, "dtype": kwargs["out"].dtype}
        # the key: the op, its arguments with tensors as slots, each tensor's view and which storage it views
        # (aliasing is part of the program), the default dtype (result dtype of float scalars, int division,
        # factories) and float32 matmul precision; top-level neuron tensors, the common case, are slotted inline
        tensors, scalars, targs = [], [], []
        dynamic = self.rule.traced_floats
        for a in args:
            kind = type(a)
            if kind is NeuronTensor:
                targs.append(TENSOR_SLOTS[len(tensors)])
                tensors.append(a)
            elif kind is int:
                targs.append(a)
            else:
                targs.append(template(a, tensors, scalars, dynamic))
        targs = tuple(targs)
        tkwargs = tuple([(k, template(v, tensors, scalars, dynamic)) for k, v in kwargs.items()]) if kwargs else ()
        storages, views = storage_views(tensors)
        if storages is None:
            _refuse_host_outputs(func, args, kwargs, tensors)
            transfers.bring_to_device(tensors)
            return self(func, *_refilled(targs, tkwargs, tensors, scalars), generator)
        scalar_types = tuple(map(type, scalars)) if scalars else ()
        key = (func, targs, tkwargs, tuple(views), scalar_types, torch.get_default_dtype(),
               float32_matmul_precision())
        entry = eager_cache.get(key)
        try:
            if entry is None:
                # views of distinct storages that differ from a signature seen before only in where they
                # start share one program taking the offsets as arguments (a loop writing x[i] would
                # otherwise compile once per i); shared storages keep static offsets, as aliasing depends
                # on them
                anywhere = _offsets_as_arguments(key, views) if len(storages) == len(tensors) else None
                entry = anywhere and eager_cache.get(anywhere)
                if entry is None:
                    on_host = host_bookkeeping.run(self.rule, key, anywhere or key, storages, views, tensors,
                                                  lambda values: _refilled(targs, tkwargs, values, scalars),
                                                  adaptive.current())
                    if on_host is not host_bookkeeping.NOT_RUN:
                        return on_host
                    entry = Executable(self, key, anywhere, targs, tkwargs, tensors, [v[1] for v in views],
                                       storages, scalars)
                    key = anywhere if entry.traced_offsets else key
                    eager_cache.put(key, entry)
                    if events.listening:
                        events.signature("eager", func, key)
            elif entry is fallback.run_on_cpu:
                return fallback.run_on_cpu(func, args, kwargs)
            return entry.run(tensors, storages, scalars, generator)
        except LoweringFailed as failure:
            # a lowering that cannot handle these arguments: the CPU gives the right answer or error
            eager_cache.put(key, fallback.run_on_cpu)
            fallback.note_failure(func, failure.cause)
            return fallback.run_on_cpu(func, args, kwargs)


_first_offsets = {}  # a signature without its view offsets -> the offsets it was first seen with


def _offsets_as_arguments(key, views):
    """The key of the signature `key` with its views' offsets as arguments, if it has been seen before with
    other offsets (else None: one offset is compiled in, as most views' is)."""
    func, targs, tkwargs, _, scalar_types, *settings = key
    # each spec keeps its place for the offset (None), as the profiler reads keys by position
    anywhere = (func, targs, tkwargs, tuple((s[:2] + (None,) + s[3:], *rest) for s, *rest in views), scalar_types,
                *settings, "offsets as arguments")
    offsets = tuple(v[0][2] for v in views)
    first = _first_offsets.get(anywhere)
    if first is None:
        if len(_first_offsets) >= eager_cache.capacity:
            _first_offsets.clear()
        _first_offsets[anywhere] = offsets
    return anywhere if first is not None and first != offsets else None


def _refilled(targs, tkwargs, tensors, scalars):
    return fill(targs, tensors, scalars), {k: fill(v, tensors, scalars) for k, v in tkwargs}


def _keeps_its_view(func, kwargs, meta, before) -> bool:
    """An out= tensor of the right shape keeps its strides, written through as they are, as the CPU's kernels keep
    them (they restride only an out they resize), where PyTorch's meta kernel made it contiguous (sort's,
    linalg.solve's): the result went to a new storage, and the tensor the user gave as `out[::2]` lost its base."""
    if tuple(meta.shape) != before[0]:
        return False
    return any(a.is_out and any(m is meta for m in registry.flatten([kwargs.get(a.name)]))
               for a in func._schema.arguments)


def _meta_spec(t: torch.Tensor):
    return (tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype)


def devices_differ(first, second) -> RuntimeError:
    """The CPU's error for tensors of one op on two devices."""
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, {first} and "
                        f"{second}!")


def _refuse_host_outputs(func, args, kwargs, tensors):
    """A 0-dim CPU tensor may be an input of a device op but never what it writes (its in-place `self`, an
    out=): CUDA's TensorIterator raises, where a device copy would take the result and drop it."""
    for written in registry.flatten(registry.written_arguments(func, args, kwargs)):
        if isinstance(written, torch.Tensor) and type(written) is not NeuronTensor:
            device_index = next((t._spec[4] for t in tensors if type(t) is NeuronTensor), 0)
            raise devices_differ(f"neuron:{device_index}", written.device)


def _check_same_device(tensors):
    devices = {t._spec[4] for t in tensors}
    if len(devices) > 1:
        a, b = sorted(devices)[:2]
        raise devices_differ(f"neuron:{a}", f"neuron:{b}")


class LoweringFailed(Exception):
    def __init__(self, op, cause):
        super().__init__(f"lowering of {op} failed: {type(cause).__name__}: {cause}")
        self.cause = cause


class Executable:
    """One compiled storage program for one op signature, with the plan for its outputs."""

    def __init__(self, op: Compute, key, anywhere, targs, tkwargs, tensors, pattern, storages, scalars):
        """`key`: the signature's; `anywhere`: the same with the views' offsets as arguments, if the program should
        take them (`_offsets_as_arguments`), else None."""
        _check_same_device(tensors)
        self.device_index = tensors[0]._spec[4] if tensors else _factory_device_index(tkwargs)
        specs = [t._spec for t in tensors]
        rule = op.rule
        # the signature as text, which names its program on disk (and in adaptive eager's fused programs' keys);
        # with offsets as arguments, which text depends on the meta kernel (below)
        disk_key = None if anywhere is not None else _disk_key(rule, key)
        path = self._path_for(disk_key)
        stored = compilation_cache.read(path)
        # a signature an earlier process compiled keeps its outputs' plan on disk with its executable: no meta
        # kernel or argument check runs again (a warm start's first step), but where the signature takes numbers,
        # whose values the checks may read (a fill value out of its dtype's range), or resizes an out= (whose meta
        # kernel warns, as the CPU's does, when the out= held elements)
        known = stored[1][2] if stored and len(stored[1]) > 2 and not scalars else None
        if known and known[1]:
            known = None
        mutated, resized, new_specs, plan, fresh_specs = known or self._outputs_from_meta(
            op, targs, tkwargs, specs, pattern, storages, scalars)
        self.resized, self.new_specs, self.plan, self.fresh_specs = resized, new_specs, plan, fresh_specs
        written_in_place = [i for i in mutated if i not in resized]
        # a resized tensor's new view is the meta kernel's for these offsets
        self.traced_offsets = traced_offsets = anywhere is not None and not resized
        if anywhere is not None:
            disk_key = _disk_key(rule, anywhere if traced_offsets else key)
            path = self._path_for(disk_key)
            stored = compilation_cache.read(path)
        self.random = op.random
        self.op = op.func
        self.rule = rule
        # the device-side checks the lowering asks for (ops.checks): found when the program is traced, below
        self.check_errors = check_errors = []
        lowering, drop, n_scalars, n_fresh = rule.lowering, op.drop_kwargs, len(scalars), len(fresh_specs)

        def compute(values, extras):
            scalar_values = extras[:n_scalars]
            call_args = fill(targs, values, scalar_values)
            call_kwargs = {k: fill(v, values, scalar_values) for k, v in tkwargs if k not in drop}
            if self.random:
                call_args = [rng.key_from(extras[-1]), *call_args]
            with checks.collecting() as conditions:
                # Python ints among the results are sizes the meta kernel gives already (fused attention's max_q)
                results = [r for r in registry.flatten(lowering(*call_args, **call_kwargs))
                           if r is not None and type(r) is not int]
            if rule.checked_outputs:  # a library lowering's, never stored: its plan came from the meta kernel
                registry.check_outputs(rule.target, results[:n_fresh], self._fresh_metas)
            check_errors[:] = [(error, message) for _, error, message in conditions]
            written = dict(zip(mutated, results[n_fresh:]))
            outputs = [_materialize(v, spec) for v, spec in zip(results[:n_fresh], fresh_specs)]
            outputs += [_materialize(written[i], spec) for i, spec in zip(resized, new_specs)]
            return outputs + [c for c, _, _ in conditions], written

        self.program = StorageProgram(specs, pattern, storages, written_in_place, compute,
                                      events.executable_name(op.func), traced_offsets)
        self.cache_key = anywhere if traced_offsets else key
        # what computing the program's results on the CPU needs (`_on_cpu`)
        self.specs, self.pattern, self.targs, self.tkwargs = specs, pattern, targs, tkwargs
        self.storage_dtypes = [s.dtype for s in storages]
        # whether adaptive eager may queue it before its first run, compiling it meanwhile (`_compiles_ahead`): not
        # where the CPU could not stand in for a failed compile there (a resized output, a view of another dtype
        # than its storage's), nor a library lowering, whose failure its author sees at the op
        self.may_compile_ahead = (not resized and not rule.checked_outputs
                                  and all(spec[3] == self.storage_dtypes[p] for spec, p in zip(specs, pattern)))
        self._compiling = None  # the Future of its compile, started ahead of its first run
        self.argument_storages = self.program.argument_storages
        self.mutated_storages = self.program.written_storages
        # the new tensors' specs, shared by every run's outputs
        self.output_specs = [spec + (self.device_index,) for spec in fresh_specs]
        # the common case, one new tensor and nothing resized: built directly
        self.single_output = self.output_specs[0] if self.plan == ("new", 0) and not resized else None
        self.compiled = self._compile_and_run
        self._first_run = threading.Lock()
        self.ran = False
        self.disk_key, self._path = disk_key, path
        # what a later process needs of the meta kernel's plan, stored with the executable
        self._outputs_plan = (mutated, resized, new_specs, plan, fresh_specs)
        # found on disk, the executable is loaded at its first run, which a fused program found on disk may
        # make unnecessary (adaptive eager at a warm start)
        self._stored = stored[0] if stored else None
        self._loaded = None  # its stored executable, loaded ahead of its first run (`load_stored`)
        self.loaded_from_disk = self._stored is not None
        # adaptive eager queues it once it has run, or was compiled by an earlier process: its compile is known good
        # (before that, only while it compiles ahead: `_compiles_ahead`)
        self.known_good = self.loaded_from_disk
        if self.loaded_from_disk:
            check_errors[:], self.output_sizes = stored[1][:2]
            return
        # the numbers as themselves, as a first run passes them (transfer.device_scalars): not a sighting
        extras = self._numbers(tensors, scalars) + ([_KEY] if self.random else [])
        try:
            # traced now for what the program's results are; compiled from this trace at the first run
            self._traced = self.program.jit(self.device_index).trace(*self.program.avals(extras))
        except Exception as exc:
            if self._is_final(exc):
                raise
            raise LoweringFailed(self.op, exc) from None
        self.output_sizes = [math.prod(r.shape) for r in self._traced.out_info]

    def run(self, tensors, storages, scalars, generator=None):
        queue = adaptive.current()
        if queue.enabled and (self.known_good or self._compiles_ahead()) or queue.capture is not None:
            return self._record(queue, tensors, storages, scalars, generator)
        if not (self.mutated_storages and queue.enabled or adaptive.threads_seen > 1):
            return self._launch(queue, tensors, storages, scalars, generator)
        # no thread may take a buffer this program donates (to read it now, or queued) until its storage holds the
        # new one; nor donate one this program has taken, before it runs
        with queue.lock:
            return self._launch(queue, tensors, storages, scalars, generator)

    def _launch(self, queue, tensors, storages, scalars, generator):
        if queue.ops and self.mutated_storages:
            queue.flush()  # the queue may read a buffer this program donates
        flat = self.program.buffers_of(storages)
        if self.mutated_storages:
            adaptive.run_readers(flat[: len(self.mutated_storages)])  # so may another thread's
        flat += self._extras(tensors, scalars, rng.next_key(self.device_index, generator) if self.random else None)
        try:
            results = events.launch(self, flat) if events.listening else self.compiled(*flat)
        except Exception as exc:
            memory.raise_if_exhausted(exc, self.device_index)
            if self.ran or self._is_final(exc):
                raise
            # the first call compiles; nothing is donated if that fails
            raise LoweringFailed(self.op, exc) from None
        if results:
            sync.last[self.device_index] = results[-1]
        return self._outputs(results, tensors, storages)

    def _compiles_ahead(self) -> bool:
        """Whether adaptive eager may queue this program though it has not run yet: its compile starts now on a
        compile thread (program.compile_ahead), beside the host's work of queueing the ops after it and the other
        new programs' compiles, where it would otherwise run (and compile) at once, one program after another. A
        compile failing then is found at the program's first run, where the CPU computes its results instead
        (`_fall_back_at_first_run`), as it would have for the op."""
        if self._compiling is None:
            if not self.may_compile_ahead or self.compiled != self._compile_and_run:
                return False
            # outputs the device cannot hold are refused at the op, as its run there (or CUDA's allocator) refuses them
            new_sizes = self.output_sizes[len(self.mutated_storages):]
            memory.check_fits(sum(size * spec[3].itemsize for size, spec in zip(new_sizes, self.fresh_specs)),
                              self.device_index)
            self._compiling = compile_ahead(self._compile, self._traced)
            if self._compiling is None:
                return False
        return True

    def _compile_and_run(self, *flat):
        """The first run compiles the program from its trace, which is then dropped (program.jit_on_device), and
        stores it on disk; or runs the executable loaded from there (traced and compiled after all if it cannot
        run). Threads reaching it together run it once: the first compiles, the others run what it compiled."""
        with self._first_run:
            if self.compiled != self._compile_and_run:
                return self.compiled(*flat)
            return self._compile_and_run_first(*flat)

    def _compile_and_run_first(self, *flat):
        stored, self._stored = self._stored, None
        loaded, self._loaded = self._loaded, None
        if self._compiling is not None:
            try:
                compiled = self._compiling.result()
                results = compiled(*flat)
            except Exception as exc:
                return self._fall_back_at_first_run(exc, flat)
            finally:
                self._compiling = self._traced = None
        elif stored is None:
            compiled = self._compile(self._traced)
            del self._traced
            results = compiled(*flat)
        else:
            def compile_afresh():
                return self._compile(self.program.jit(self.device_index).trace(*flat))

            loaded = loaded or compilation_cache.deserialized(stored, jax_device(self.device_index))
            compiled, results = compilation_cache.run_first(self._path, loaded, flat, compile_afresh)
        self.compiled = fast_call(compiled)
        self.ran = self.known_good = True
        return results

    def _fall_back_at_first_run(self, exc, flat):
        """A program queued before its first run (`_compiles_ahead`) whose compile or first run failed: its results
        from the CPU, and the op falls back from now on, as it would have at the op."""
        memory.raise_if_exhausted(exc, self.device_index)
        if self._is_final(exc) or any(isinstance(a, jax.Array) and a.is_deleted() for a in flat):
            raise exc
        fallback.note_failure(self.op, exc)
        eager_cache.put(self.cache_key, fallback.run_on_cpu)
        self.compiled = self._on_cpu
        return self._on_cpu(*flat)

    def _on_cpu(self, *flat):
        """The program's results (written storages' buffers, new outputs' buffers, passing checks) computed by the
        op's CPU kernel, from its arguments as the program takes them: buffers, then numbers (views' offsets, if it
        takes them, and scalars), then a random op's key, which the CPU's generator stands in for."""
        fallback.announce(self.op, stacklevel=2)
        n_buffers, n_specs = len(self.argument_storages), len(self.specs)
        hosts = {p: transfer.device_to_host(buffer, self.storage_dtypes[p])
                 for p, buffer in zip(self.argument_storages, flat[:n_buffers])}
        numbers = [n.item() if isinstance(n, jax.Array) else n for n in flat[n_buffers : len(flat) - self.random]]
        offsets = numbers[:n_specs] if self.traced_offsets else [spec[2] for spec in self.specs]
        scalars = numbers[n_specs:] if self.traced_offsets else numbers
        tensors = [hosts[p].as_strided(spec[0], spec[1], offset)
                   for spec, p, offset in zip(self.specs, self.pattern, offsets)]
        kwargs = {k: fill(v, tensors, scalars) for k, v in self.tkwargs}
        if "device" in kwargs:
            kwargs["device"] = "cpu"
        out = self.op(*fill(self.targs, tensors, scalars), **kwargs)
        device_index = self.device_index
        results = [transfer.host_to_device(hosts[p], device_index) for p in self.mutated_storages]
        sizes = self.output_sizes[len(results):]
        for value, spec, size in zip(_fresh_outputs(self.plan, out), self.fresh_specs, sizes):
            laid_out = torch.zeros(size, dtype=spec[3])
            laid_out.as_strided(*spec[:3]).copy_(value)
            results.append(transfer.host_to_device(laid_out, device_index))
        # the CPU kernel raised its own error for bad values: every check passes
        for size in sizes[len(self.fresh_specs):]:
            passed = np.ones((), bool) if size == 1 else np.eye(1, size, dtype=np.int64)[0]
            results.append(jax.device_put(passed, jax_device(device_index)))
        return results

    @staticmethod
    def load_stored(executables, device_index: int) -> None:
        """Loads the executables found on disk of those of `executables` that have not run yet, together: a
        warm start's first queue of a kind no earlier process fused runs its ops one by one, each loading its
        own (adaptive eager)."""
        waiting = [e for e in executables if e._stored is not None and e._loaded is None]
        loaded = compilation_cache.deserialized_together([e._stored for e in waiting], jax_device(device_index))
        for executable, its_own in zip(waiting, loaded):
            executable._loaded = its_own

    def _compile(self, traced):
        return compilation_cache.compile_and_store(self._path, traced.lower().compile,
                                                   (list(self.check_errors), self.output_sizes,
                                                    _picklable(self._outputs_plan)))

    def _path_for(self, disk_key):
        """Where the program named `disk_key` is kept on disk (None for no name: `_disk_key`)."""
        return disk_key and compilation_cache.entry_path("ops", platform_name(), jax_device(self.device_index),
                                                         disk_key)

    def _outputs_from_meta(self, op, targs, tkwargs, specs, pattern, storages, scalars):
        """The op's outputs as PyTorch's meta kernel gives them, after the CPU's argument checks (which raise
        PyTorch's errors for bad input): the arguments it writes (by number), those of them it resizes, their new
        views, the plan of its outputs, the new outputs' views."""
        rule = op.rule
        bases = {}
        meta_tensors = [views.meta_view(spec, storages[p], bases) for spec, p in zip(specs, pattern)]
        before = [_meta_spec(m) for m in meta_tensors]
        meta_args = fill(targs, meta_tensors, scalars)
        meta_kwargs = {k: fill(v, meta_tensors, scalars) for k, v in tkwargs}
        cpu_dtypes.check(rule.op, meta_args, meta_kwargs)
        if op.drop_kwargs:
            out_dtypes.check_with_meta(rule.op, rule.target, meta_args, meta_kwargs)
        argument_check = registry.argument_check(rule.op)
        if argument_check is not None:
            # the CPU's errors as written out for the op, before the CPU asked on zeros below (which may fail on
            # the zeros' values first: segment lengths that do not add up)
            argument_check(*meta_args, **meta_kwargs)
        try:
            meta_out = rule.meta(*meta_args, **meta_kwargs)
        except Exception as error:
            # a meta kernel written in Python (torch._refs) may reject bad input with another error than the
            # CPU kernel's: the user gets the CPU's
            cpu_error = fallback.cpu_error(rule.op, meta_args, meta_kwargs)
            if cpu_error is None and _lacks_meta_kernel(rule):
                # this PyTorch release has no meta kernel for the op: the CPU runs it (counted, reported)
                raise LoweringFailed(rule.op, error) from None
            raise cpu_error or error from None

        by_identity = {id(m): i for i, m in enumerate(meta_tensors)}
        written = registry.flatten(registry.written_arguments(op.func, meta_args, meta_kwargs))
        mutated = [by_identity[id(m)] for m in written if m is not None]
        resized = [i for i in mutated if _meta_spec(meta_tensors[i]) != before[i]
                   and not _keeps_its_view(op.func, meta_kwargs, meta_tensors[i], before[i])]
        _check_inplace_shapes(op.func, [(before[i][0], meta_tensors[i].shape) for i in resized])
        written_in_place = [i for i in mutated if i not in resized]
        for i in written_in_place:
            _check_no_internal_overlap(specs[i])
        if rule.refuses_partial_overlap:
            _check_no_partial_overlap(meta_tensors, pattern, written_in_place)
        fresh = []
        plan = _output_plan(meta_out, by_identity, fresh)
        self._fresh_metas = fresh
        return (mutated, resized, [_meta_spec(meta_tensors[i]) for i in resized], plan,
                [_meta_spec(m) for m in fresh])

    def _is_final(self, exc) -> bool:
        return fallback.is_final(self.rule, exc)

    def _record(self, queue, tensors, storages, scalars, generator):
        """Adaptive eager: queue this run; its results are Pending buffers, its outputs tensors as usual."""
        key = rng.next_key(self.device_index, generator) if self.random else None
        # the numbers as themselves: the queue puts each on the device once, however many ops take it
        extras = self._extras(tensors, scalars, key, on_device=False)
        return self._outputs(queue.record(self, storages, extras, generator), tensors, storages)

    def _extras(self, tensors, scalars, key, on_device=True) -> list:
        """The program's arguments after the storages' buffers: its numbers (`on_device`: as
        transfer.device_scalars gives them), then the random key (if not None)."""
        numbered = scalars or self.traced_offsets
        extras = self._numbers(tensors, scalars) if numbered else []
        if on_device and extras:
            extras = device_scalars(extras, self.device_index)
        if key is not None:
            extras.append(key)
        return extras

    def _numbers(self, tensors, scalars) -> list:
        """The views' offsets (if the program takes them), then the scalars."""
        return [t._spec[2] for t in tensors] + scalars if self.traced_offsets else scalars

    def _outputs(self, results, tensors, storages):
        if not results:
            return _build_output(self.plan, tensors, [])
        device_index = self.device_index
        n_mutated = len(self.mutated_storages)
        if n_mutated:
            for p, buffer in zip(self.mutated_storages, results):
                storages[p].buffer = buffer
            results = results[n_mutated:]
        if self.check_errors:
            n_checks = len(self.check_errors)
            pending_checks.add(device_index, self.op, results[-n_checks:], self.check_errors)
            results = results[:-n_checks]
        if self.single_output is not None:
            return new_tensor(results[0], self.single_output)
        fresh = [new_tensor(buf, spec) for buf, spec in zip(results, self.output_specs)]
        for i, buf, spec in zip(self.resized, results[len(self.fresh_specs) :], self.new_specs):
            _resize_to(tensors[i], buf, spec, device_index)
        return _build_output(self.plan, tensors, fresh)


def _resize_to(tensor, buffer, spec, device_index: int) -> None:
    """`tensor`, resized by the op to `spec`, takes the values of `buffer` (laid out as `spec` says). An empty
    one (`out=torch.empty(0)`, the usual out=) takes the buffer as its storage. Any other keeps its storage,
    grown if the new view needs more, as PyTorch's resize_ keeps it, so that its other views (the base of an
    `out=buf[::2]` of another shape) see the values as on the CPU."""
    if not tensor._storage.numel:
        views.reset_view(tensor, Storage(buffer.shape[0], spec[3], device_index, buffer), spec)
        return
    views.resize_in_storage(tensor, spec)
    tensor.copy_(new_tensor(buffer, spec + (device_index,)))


# the abstract raw key a random op's program takes (rng.next_key's result)
_KEY = jax.ShapeDtypeStruct((4,), np.uint32)


def _picklable(value):
    """`value` if it can be stored on disk, else None."""
    try:
        pickle.dumps(value)
    except Exception:  # a constant among the outputs that does not pickle
        return None
    return value


def _factory_device_index(tkwargs) -> int:
    device = dict(tkwargs).get("device")
    index = None if device is None else torch.device(device).index
    return torch.neuron.current_device() if index is None else index


def _lacks_meta_kernel(rule) -> bool:
    return (rule.meta is rule.op and not rule.checked_outputs
            and not torch._C._dispatch_has_kernel_for_dispatch_key(rule.op.name(), "Meta"))


def _check_no_internal_overlap(spec):
    """PyTorch refuses writes where several elements share one memory location (expanded tensors)."""
    sizes, stride = spec[0], spec[1]
    if any(size > 1 and st == 0 for size, st in zip(sizes, stride)):
        raise RuntimeError(shape.OVERLAPPING_WRITE)


def _check_no_partial_overlap(meta_tensors, pattern, written):
    """TensorIterator's check (pointwise ops, copy_): an input may be a tensor the op writes, or apart from it,
    but not part of it (`x[1:].add_(x[:-1])`)."""
    for i in written:
        if any(j != i and pattern[j] == pattern[i] and shape.overlap(meta_tensors[i], meta_tensors[j]) == "partial"
               for j in range(len(meta_tensors))):
            raise RuntimeError(shape.SHARED_MEMORY)


def _check_inplace_shapes(func, changes):
    """Meta kernels built from PyTorch's refs resize `self` where the CPU kernel of an in-place op refuses (our
    own meta kernels, registry.META, resize only where it does)."""
    if registry.is_out(func) or "resize" in func._schema.name or func in registry.META:
        return
    for old, new in changes:
        if tuple(old) != tuple(new):
            raise RuntimeError(f"output with shape {list(old)} doesn't match the broadcast shape {list(new)}")


def _output_plan(meta_out, by_identity, fresh):
    if isinstance(meta_out, torch.Tensor):
        i = by_identity.get(id(meta_out))
        if i is not None:
            return ("arg", i)
        fresh.append(meta_out)
        return ("new", len(fresh) - 1)
    if isinstance(meta_out, (tuple, list)):
        return (type(meta_out), [_output_plan(m, by_identity, fresh) for m in meta_out])
    return ("const", meta_out)


def _fresh_outputs(plan, out) -> list:
    """The new tensors among an op's outputs `out`, in the order `_output_plan` numbered them."""
    kind, value = plan
    if kind == "new":
        return [out]
    if kind in ("arg", "const"):
        return []
    return [t for p, o in zip(value, out) for t in _fresh_outputs(p, o)]


def _build_output(plan, tensors, fresh):
    kind, value = plan
    if kind == "arg":
        return tensors[value]
    if kind == "new":
        return fresh[value]
    if kind == "const":
        return value
    return kind(_build_output(p, tensors, fresh) for p in value)


def _materialize(value, spec):
    """A new storage buffer holding `value` laid out as the meta kernel's (shape, stride, offset) say."""
    shape, stride, offset, dtype = spec
    return layout.lay_out(jax.numpy.broadcast_to(convert_to(value, dtype), shape), shape, stride, offset)


def _disk_key(rule, key):
    """The signature `key` as the text that keys its program on disk (runtime/compilation_cache.py), or None: only
    for ops torchneuron lowers (a library lowering is its author's code, which no key hashes) and keys whose text
    names no object by its address."""
    if rule.checked_outputs:
        return None
    text = repr(key)
    return None if " at 0x" in text else text
