"""The `neuron` c10d backend: a Python ProcessGroup whose collectives are XLA programs.

Results are written into the caller's tensors as soon as the program is
enqueued (PJRT runs it asynchronously and every later op on those tensors waits
for it), so `async_op=True` returns at once and `Work.wait()` only has to wait,
with the group's timeout, when the caller wants the host to. CPU tensors go to
a gloo group made alongside, so `"cpu:gloo,neuron:neuron"` and object
collectives work.
"""
import concurrent.futures
import datetime
import os
import socket

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import AllgatherOptions  # not in torch.distributed before torch 2.13

from ..eager import adaptive
from ..runtime import platform
from ..runtime.dtypes import to_jax
from . import buffers, captured, programs

_waiter = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="neuron-collective-wait")


def _await(arrays, timeout: datetime.timedelta, what: str) -> None:
    """Block until `arrays` are computed, or raise PyTorch's DistBackendError after `timeout`."""
    pending = [a for a in arrays if not a.is_ready()]
    if not pending:
        return
    future = _waiter.submit(lambda: [a.block_until_ready() for a in pending])
    try:
        future.result(timeout=timeout.total_seconds())
    except concurrent.futures.TimeoutError:
        raise dist.DistBackendError(
            f"neuron: {what} did not complete within {timeout}: a peer rank died, raised, or issued "
            "a different collective (every rank must issue the same collectives in the same order)"
        ) from None
    except Exception as error:
        raise dist.DistBackendError(f"neuron: {what} failed: {error}") from error


class Work(dist._Work):
    """A collective in flight: its outputs are already the caller's tensors; `arrays` say when it is done,
    with the works it is made of (`parts`: those a coalescing manager gathered)."""

    def __init__(self, outputs, arrays, timeout, what: str, parts=()):
        super().__init__()
        self._outputs = outputs
        self._arrays = arrays
        self._timeout = timeout
        self._what = what
        self._parts = parts

    def is_completed(self) -> bool:
        return all(p.is_completed() for p in self._parts) and all(a.is_ready() for a in self._arrays)

    def wait(self, timeout=datetime.timedelta(0)) -> bool:
        for part in self._parts:
            part.wait(timeout)
        _await(self._arrays, timeout if timeout else self._timeout, self._what)
        return True

    def synchronize(self) -> None:
        self.wait()

    def result(self):
        self.wait()
        return self._outputs

    def get_future(self) -> torch.futures.Future:
        if self._parts:
            return torch.futures.collect_all([p.get_future() for p in self._parts]).then(lambda _: self._outputs)
        # later ops on the outputs wait for the program on the device; the value is ready to use now
        future = torch.futures.Future()
        future.set_result(self._outputs)
        return future


class _HostWork(Work):
    """A send or receive through the group's gloo transport, on a host copy; a receive writes what
    arrived into the caller's tensor when it completes."""

    def __init__(self, outputs, host_work, timeout, what: str, received=None):
        super().__init__(outputs, [], timeout, what)
        self._host_work = host_work
        self._received = received  # (tensor, host copy) pairs still to write

    def _finish(self) -> None:
        received, self._received = self._received, None
        with torch.no_grad():
            for tensor, host in received or ():
                tensor.copy_(host)

    def is_completed(self) -> bool:
        if not self._host_work.is_completed():
            return False
        self._finish()
        return True

    def wait(self, timeout=datetime.timedelta(0)) -> bool:
        try:
            self._host_work.wait(timeout if timeout else self._timeout)
        except dist.DistBackendError:
            raise
        except RuntimeError as error:
            raise dist.DistBackendError(f"neuron: {self._what} failed: {error}") from error
        self._finish()
        return True

    def get_future(self) -> torch.futures.Future:
        return self._host_work.get_future().then(lambda _: (self._finish(), self._outputs)[1])


def _op_name(op) -> tuple:
    """(name, PREMUL_SUM factor) of a c10d ReduceOp or RedOpType."""
    kind = op.op if isinstance(op, dist.ReduceOp) and hasattr(op, "op") else op
    name = dist.ReduceOp.RedOpType(int(kind)).name if not isinstance(kind, dist.ReduceOp.RedOpType) else kind.name
    factor = None
    if name == "PREMUL_SUM":
        # its pickled state, (type, factor): torch 2.11 has no `factor` attribute
        factor = op.__getstate__()[1]
        factor = float(factor.item() if isinstance(factor, torch.Tensor) else factor)
    return name, factor


def _check_op(name: str, dtype: torch.dtype) -> None:
    if name in ("BAND", "BOR", "BXOR") and (dtype.is_floating_point or dtype.is_complex):
        raise RuntimeError(f"neuron: ReduceOp.{name} needs an integer or bool tensor, got {dtype}")
    if name in ("AVG", "PREMUL_SUM") and not (dtype.is_floating_point or dtype.is_complex):
        raise RuntimeError(f"neuron: ReduceOp.{name} needs a floating-point or complex tensor, got {dtype}")
    if name in ("MIN", "MAX") and dtype.is_complex:
        raise RuntimeError(f"neuron: ReduceOp.{name} is not defined for complex tensors ({dtype})")


class NeuronProcessGroup(dist.ProcessGroup):
    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta, ranks: tuple, name: str):
        super().__init__(rank, size)
        self._timeout = timeout
        self._ranks = ranks
        self._group_name = name
        self._group_desc = ""
        self._cpu = dist.ProcessGroupGloo(dist.PrefixStore("cpu/", store), rank, size, timeout)
        self._store = store
        self._calls = {}  # participants -> programs run: the same count on every rank while they agree
        self._coalesced = None  # works issued inside a coalescing manager
        self._in_flight = []  # sends and receives not known complete: gloo cancels one whose work is freed
        # PyTorch reads a group's devices from the C++ backends registered on it (the device of object
        # collectives and of a full state dict's broadcast, whether distributed checkpoint's async save has a
        # CPU backend); this group's collectives are its own Python methods, for CPU tensors (through its gloo
        # group) and neuron tensors alike, so the device types are registered without a C++ backend
        kinds = dist.ProcessGroup.BackendType
        for device, kind in (("cpu", kinds.GLOO), ("neuron", kinds.CUSTOM)):
            self._register_backend(torch.device(device), kind, None)

    # --- names: functional collectives look groups up by name ------------------------------------------

    def getBackendName(self) -> str:
        return "neuron"

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def supports_splitting(self) -> bool:
        return False

    def _get_backend(self, device):
        """What runs the collectives of `device`'s tensors: for CPU tensors gloo, for neuron tensors this group,
        which does not split (so `init_process_group(device_id=neuron:i)` and `new_group(device_id=...)`, which
        ask, make their groups as without it; it raised "No backend type associated with device type neuron")."""
        kind = torch.device(device).type
        if kind == "cpu" and self._cpu is not None:
            return self._cpu
        return self if kind == "neuron" else super()._get_backend(device)

    # --- plumbing ---------------------------------------------------------------------------------------

    def _mesh(self, tensor):
        return self._mesh_at(tensor._spec[4])

    def _mesh_at(self, device_index: int, ranks=None):
        return programs.group(ranks or self._ranks, _slot(device_index))

    def _on_cpu(self, tensors) -> bool:
        devices = {t.device.type for t in tensors}
        if devices == {"cpu"}:
            return True
        for t in tensors:
            buffers.check_neuron(t)
        return False

    def _work(self, outputs, written, what, arrays=()) -> Work:
        if adaptive.capturing():
            return self._issued(Work(outputs, [], self._timeout, what))  # nothing ran: each replay runs it
        arrays = list(arrays) + [t._storage.buffer for t in written]
        return self._issued(Work(outputs, arrays, self._timeout, what))

    def _issued(self, work: Work) -> Work:
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def _agreement(self, participants) -> "_Agreement":
        call = self._calls[participants] = self._calls.get(participants, 0) + 1
        return _Agreement(self, participants, call)

    def _run(self, kind, grp, flat, *statics):
        adaptive.refuse_while_capturing(f"the collective {kind}")
        participants = tuple(self._ranks.index(r) for r in grp.ranks)
        return programs.run(self._agreement(participants), kind, grp, flat, *statics)

    def _into(self, kind, sources, destinations, *statics) -> None:
        """The collective `kind` of the `sources`' values, one after the other, written in order into the
        `destinations` (the same tensors for an in-place collective): run now, or recorded in the graph being
        captured (captured.py)."""
        grp = self._mesh(destinations[0])
        if adaptive.capturing():
            captured.record(kind, grp, sources, destinations, statics, self._agree)
            return
        flat = buffers.flat(sources[0]) if len(sources) == 1 else jnp.concatenate([buffers.flat(t) for t in sources])
        values = self._run(kind, grp, flat, *statics)
        if len(destinations) == 1:
            buffers.write(destinations[0], values)
            return
        for out, piece in zip(destinations, _split(values, [t.numel() for t in destinations])):
            buffers.write(out, piece)

    def _agree(self, what: str) -> None:
        """Check that every rank of the group is about to run `what` (a compiled graph's program)."""
        self._agreement(tuple(range(self.size())))(what)

    def _start_coalescing(self, device) -> None:
        self._coalesced = []

    def _end_coalescing(self, device) -> Work:
        works, self._coalesced = self._coalesced or [], None
        return Work([t for w in works for t in w._outputs], [], self._timeout, "coalesced collectives", works)

    def _reduce_each(self, tensors, op, kind: str, what: str) -> Work:
        name, factor = _op_name(op)
        for t in tensors:
            _check_op(name, t.dtype)
        for t in tensors:
            self._into(kind, [t], [t], name, factor)
        return self._work(tensors, tensors, what)

    # --- collectives ----------------------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        if any(t.is_sparse for t in tensors):
            return self._allreduce_sparse(tensors, opts)
        if self._on_cpu(tensors):
            return self._cpu.allreduce(tensors, opts)
        return self._reduce_each(tensors, opts.reduceOp, "all_reduce", "all_reduce")

    def _allreduce_sparse(self, tensors, opts) -> Work:
        """Sparse tensors (DDP's sparse embedding gradients) reduce through gloo's sparse all-reduce, on host copies
        (it gathers every rank's indices and values), as CPU tensors do; the sums come back into them."""
        on_host = [t.cpu() for t in tensors]
        self._cpu.allreduce(on_host, opts).wait()
        for tensor, total in zip(tensors, on_host):
            tensor.copy_(total)
        return self._work(tensors, [], "all_reduce of sparse tensors")

    def allreduce_coalesced(self, tensors, opts=None):
        if self._on_cpu(tensors):
            return self._cpu.allreduce_coalesced(tensors, opts or dist.AllreduceCoalescedOptions())
        return self._reduce_each(tensors, (opts or dist.AllreduceCoalescedOptions()).reduceOp, "all_reduce", "all_reduce_coalesced")

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        if self._on_cpu(tensors):
            return self._cpu.broadcast(tensors, opts)
        for t in tensors:
            self._into("broadcast", [t], [t], opts.rootRank)
        return self._work(tensors, tensors, "broadcast")

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        if self._on_cpu(tensors):
            return self._cpu.reduce(tensors, opts)
        name, factor = _op_name(opts.reduceOp)
        for t in tensors:
            _check_op(name, t.dtype)
        for t in tensors:
            self._into("reduce", [t], [t], name, factor, opts.rootRank)
        return self._work(tensors, tensors, "reduce")

    def _check_count(self, tensors, what: str) -> None:
        if len(tensors) != self.size():
            raise ValueError(f"{what}: expected {self.size()} tensors (the group's size), got {len(tensors)}")

    def _check_numel(self, tensor, numel: int, what: str) -> None:
        if tensor.numel() != numel:
            raise ValueError(f"{what}: tensor of {tensor.numel()} elements where {numel} are expected")

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts or AllgatherOptions()
        if self._on_cpu(input_tensors + [t for ts in output_tensors for t in ts]):
            return self._cpu.allgather(output_tensors, input_tensors, opts)
        for outputs, source in zip(output_tensors, input_tensors):
            self._check_count(outputs, "all_gather")
            for out in outputs:
                self._check_numel(out, source.numel(), "all_gather")
            self._into("all_gather", [source], outputs)
        return self._work(output_tensors, [t for ts in output_tensors for t in ts], "all_gather")

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        return self.allgather(output_lists, input_list, opts)

    def all_gather_single(self, output, input, opts=None):
        return self.all_gather_single_coalesced([output], [input], opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or AllgatherOptions()
        if self._on_cpu(outputs + inputs):
            return self._cpu.allgather_into_tensor_coalesced(outputs, inputs, opts)
        for out, source in zip(outputs, inputs):
            if out.numel() != source.numel() * self.size():
                raise ValueError("output tensor size must be equal to world_size times input tensor size")
            if out.dtype != source.dtype:
                raise TypeError("output tensor must have the same type as input tensor")
            self._into("all_gather", [source], [out])
        return self._work(outputs, outputs, "all_gather_into_tensor")

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.GatherOptions()
        if self._on_cpu(input_tensors + [t for ts in output_tensors for t in ts]):
            return self._cpu.gather(output_tensors, input_tensors, opts)
        (source,) = input_tensors
        gathered = self._run("all_gather", self._mesh(source), buffers.flat(source))
        written = []
        if self.rank() == opts.rootRank:
            (outputs,) = output_tensors
            self._check_count(outputs, "gather")
            n = source.numel()
            for i, out in enumerate(outputs):
                self._check_numel(out, n, "gather")
                buffers.write(out, gathered[i * n : (i + 1) * n])
            written = outputs
        return self._work(output_tensors, written, "gather", [gathered])

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        if self._on_cpu(output_tensors + [t for ts in input_tensors for t in ts]):
            return self._cpu.reduce_scatter(output_tensors, input_tensors, opts)
        name, factor = _op_name(opts.reduceOp)
        for out, inputs in zip(output_tensors, input_tensors):
            _check_op(name, out.dtype)
            self._check_count(inputs, "reduce_scatter")
            for t in inputs:
                self._check_numel(t, out.numel(), "reduce_scatter")
            self._into("reduce_scatter", inputs, [out], name, factor)
        return self._work(output_tensors, output_tensors, "reduce_scatter")

    def reduce_scatter_single(self, output, input, opts=None):
        return self.reduce_scatter_single_coalesced([output], [input], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        if self._on_cpu(outputs + inputs):
            return self._cpu.reduce_scatter_tensor_coalesced(outputs, inputs, opts)
        name, factor = _op_name(opts.reduceOp)
        for out, source in zip(outputs, inputs):
            _check_op(name, out.dtype)
            if source.numel() != out.numel() * self.size():
                raise ValueError("input tensor must be the same size as output size times world size")
            if out.dtype != source.dtype:
                raise TypeError("input tensor must be the same type as the output tensor.")
            self._into("reduce_scatter", [source], [out], name, factor)
        return self._work(outputs, outputs, "reduce_scatter_tensor")

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ScatterOptions()
        if self._on_cpu(output_tensors + [t for ts in input_tensors for t in ts]):
            return self._cpu.scatter(output_tensors, input_tensors, opts)
        (out,) = output_tensors
        if self.rank() == opts.rootRank:
            (inputs,) = input_tensors
            self._check_count(inputs, "scatter")
            for t in inputs:
                self._check_numel(t, out.numel(), "scatter")
            stacked = jnp.concatenate([buffers.flat(t) for t in inputs])
        else:
            stacked = _zeros(out, out.numel() * self.size())
        buffers.write(out, self._run("scatter", self._mesh(out), stacked, opts.rootRank))
        return self._work(output_tensors, output_tensors, "scatter")

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts or dist.AllToAllOptions()
        if self._on_cpu([output, input]):
            return self._cpu.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)
        size = self.size()
        if not input_split_sizes and not output_split_sizes:
            if input.numel() % size or output.numel() != input.numel():
                raise ValueError(f"all_to_all_single: tensors of {input.numel()} and {output.numel()} elements do not split evenly {size} ways")
            self._into("all_to_all", [input], [output])
            return self._work([output], [output], "all_to_all_single")
        row = input.numel() // max(input.shape[0], 1) if input.dim() else 1
        ins = list(input_split_sizes) or [input.shape[0] // size] * size
        outs = list(output_split_sizes) or [output.shape[0] // size] * size
        source = buffers.flat(input)
        chunks = _split(source, [s * row for s in ins])
        results = self._exchange_uneven(chunks, [s * row for s in outs], input)
        buffers.write(output, jnp.concatenate(results) if results else source[:0])
        return self._work([output], [output], "all_to_all_single")

    # torch 2.11's ProcessGroup looks this override up by its older name only (2.13 tries the new name
    # first); without it, its C++ method ran and found no backend for neuron
    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.AllToAllOptions()
        if self._on_cpu(output_tensors + input_tensors):
            return self._cpu.alltoall(output_tensors, input_tensors, opts)
        self._check_count(input_tensors, "all_to_all")
        self._check_count(output_tensors, "all_to_all")
        if adaptive.capturing():
            # eagerly, every rank takes the uneven path: whether its own sizes are even says nothing of its peers'
            if len({t.numel() for t in input_tensors + output_tensors}) != 1:
                adaptive.refuse_while_capturing("all_to_all of uneven sizes")
            self._into("all_to_all", input_tensors, output_tensors)
            return self._work(output_tensors, output_tensors, "all_to_all")
        results = self._exchange_uneven([buffers.flat(t) for t in input_tensors], [t.numel() for t in output_tensors], input_tensors[0])
        for out, values in zip(output_tensors, results):
            buffers.write(out, values)
        return self._work(output_tensors, output_tensors, "all_to_all")

    def _exchange_uneven(self, chunks, received_sizes, like):
        """All-to-all of chunks of any sizes: padded to the largest chunk any rank sends (agreed by a
        MAX all-reduce of one number), exchanged in one program, then cut to the sizes received."""
        mesh = self._mesh(like)
        local_max = max([c.shape[0] for c in chunks] + list(received_sizes))
        agreed = self._run("all_reduce", mesh, _scalar(like, local_max), "MAX", None)
        width = int(agreed[0])
        padded = jnp.concatenate([jnp.pad(c, (0, width - c.shape[0])) for c in chunks])
        exchanged = self._run("all_to_all", mesh, padded)
        return [exchanged[i * width : i * width + n] for i, n in enumerate(received_sizes)]

    def barrier(self, opts=None):
        index = torch.neuron.current_device()
        done = self._run("all_reduce", self._mesh_at(index), _scalar_on(platform.jax_device(index), 0), "SUM", None)
        work = Work([], [done], self._timeout, "barrier")
        work.wait()
        return work

    # --- point to point ---------------------------------------------------------------------------------

    def send(self, tensors, dst: int, tag: int = 0):
        if self._on_cpu(tensors):
            return self._cpu.send(tensors, dst, tag)
        self._check_peer(dst, "destination")
        # a host copy taken now: later writes to the tensors (or donation of their buffers) cannot reach it
        host = [t.detach().to("cpu", copy=True).contiguous() for t in tensors]
        return self._p2p(_HostWork(tensors, self._cpu.send(host, dst, tag), self._timeout, "send"))

    def recv(self, tensors, src: int, tag: int = 0):
        if self._on_cpu(tensors):
            return self._cpu.recv(tensors, src, tag)
        self._check_peer(src, "source")
        host = [torch.empty(t.shape, dtype=t.dtype) for t in tensors]
        work = self._cpu.recv(host, src, tag)
        return self._p2p(_HostWork(tensors, work, self._timeout, "recv", list(zip(tensors, host))))

    def _p2p(self, work: "_HostWork") -> "_HostWork":
        # held until complete: a send the caller drops (isend without wait) still happens, as on NCCL
        self._in_flight = [w for w in self._in_flight if not w._host_work.is_completed()] + [work]
        return self._issued(work)

    def recv_anysource(self, tensors, tag: int = 0):
        raise RuntimeError("neuron: recv from any source is not supported; pass src")

    def _check_peer(self, peer: int, what: str) -> None:
        if peer == self.rank() or not 0 <= peer < self.size():
            raise ValueError(f"Invalid {what} rank {peer} for a group of size {self.size()} (this rank is {self.rank()})")

    # --- lifetime -------------------------------------------------------------------------------------------

    def shutdown(self) -> None:
        self._release()

    def abort(self) -> None:
        self._release()

    def _release(self) -> None:
        # a destroyed group can outlive destroy_process_group (a DeviceMesh held by a compiled graph's
        # guards): let go of its store, or the next init_process_group may reach this one's TCPStore
        if self._cpu is not None:
            self._cpu.shutdown()
        self._cpu = self._store = None


class _Agreement:
    """Checks, through the group's store, that the participants of one program call all run the same
    program; `always` under TORCH_DISTRIBUTED_DEBUG=DETAIL, else when a rank first compiles it."""

    def __init__(self, group, participants, call):
        self.group, self.participants, self.call = group, participants, call
        self.always = dist.get_debug_level() == dist.DebugLevel.DETAIL

    def __call__(self, what: str) -> None:
        store, me = self.group._store, self.group.rank()
        prefix = f"torchneuron/agree/{'-'.join(map(str, self.participants))}/{self.call}/"
        store.set(prefix + str(me), what)
        others = [r for r in self.participants if r != me]
        try:
            store.wait([prefix + str(r) for r in others], self.group._timeout)
        except Exception:
            raise dist.DistBackendError(
                f"neuron: rank {me} is running {what}, but rank(s) {others} did not issue a matching collective "
                f"within {self.group._timeout} (every rank must issue the same collectives in the same order)"
            ) from None
        for r in others:
            theirs = store.get(prefix + str(r)).decode()
            if theirs != what:
                raise RuntimeError(
                    f"neuron: ranks disagree on a collective: rank {me} runs {what} but rank {r} runs {theirs} "
                    "(every rank must pass tensors of the same shape and dtype)"
                )


def _slot(device_index: int) -> int:
    """Which of this process's devices `neuron:device_index` is (the same slot on every rank)."""
    return [d for d in platform.devices() if d is not None].index(platform.jax_device(device_index))


def _split(flat, sizes):
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [flat[s : s + n] for s, n in zip(starts, sizes)]


def _zeros(like, numel):
    return jnp.zeros((numel,), to_jax(like.dtype), device=platform.jax_device(like._spec[4]))


def _scalar(like, value):
    return _scalar_on(platform.jax_device(like._spec[4]), value)


def _scalar_on(device, value):
    return jax.device_put(np.array([value], np.int64), device)


def _coordinator_host(store) -> str:
    """Where peers reach process 0: the launcher's MASTER_ADDR, else the TCPStore's host (rank 0 usually
    serves it), else this host's name."""
    if os.environ.get("MASTER_ADDR"):
        return os.environ["MASTER_ADDR"]
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store.host if isinstance(store, dist.TCPStore) else socket.gethostname()


def _join(store, rank: int, size: int, timeout: datetime.timedelta) -> None:
    """Join the world's processes into one JAX runtime, agreeing on the coordinator through the store."""
    if platform.joined is not None:
        platform.join(platform.joined.coordinator, size, rank, platform.joined.local_rank, platform.joined.local_count)
        return
    key = "torchneuron/coordinator"
    if rank == 0:
        store.set(key, platform.free_coordinator_address(_coordinator_host(store)))
    coordinator = store.get(key).decode()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    platform.join(coordinator, size, rank, local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")), int(timeout.total_seconds()))
    own = next(i for i, d in enumerate(platform.devices()) if d is not None)
    if platform.devices()[torch.neuron.current_device()] is None:
        torch.neuron.set_device(own)


def create(options, backend_options=None) -> NeuronProcessGroup:
    """The backend factory (`extended_api`): PyTorch passes the group's store, ranks and timeout."""
    ranks = tuple(options.global_ranks_in_group) or tuple(range(options.group_size))
    if not dist.is_initialized():  # the default group: every rank is here
        _join(options.store, options.group_rank, options.group_size, options.timeout)
    return NeuronProcessGroup(options.store, options.group_rank, options.group_size, options.timeout, ranks, options.group_id)
