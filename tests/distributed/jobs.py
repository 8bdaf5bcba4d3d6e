"""What each rank runs for tests/distributed (started by launch.py; `python jobs.py JOB [ARGS]`).

Every input is a known function of the rank, so each rank computes the expected
result of a collective itself, on the CPU, from all ranks' inputs.
"""
import contextlib
import copy
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

import torchneuron  # noqa: F401

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
DEVICE = torch.device("neuron", int(os.environ["LOCAL_RANK"]))


def init(backend="neuron", seconds=60, **options):
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=seconds), **options)


def inputs(rank, dtype=torch.float32, shape=(3, 4)):
    """Rank `rank`'s input: small values so sums and products are exact in every dtype."""
    base = torch.arange(1, 1 + torch.Size(shape).numel()).reshape(shape) % 5 + rank + 1
    return base.to(dtype) if dtype != torch.bool else base % 2 == 0


def equal(actual, expected, what, **tol):
    torch.testing.assert_close(actual.cpu(), expected, msg=lambda m: f"{what}: {m}", **tol)


REDUCE = {
    "SUM": lambda xs: xs.sum(0, dtype=xs.dtype),
    "PRODUCT": lambda xs: xs.prod(0, dtype=xs.dtype),
    "MIN": lambda xs: xs.amin(0),
    "MAX": lambda xs: xs.amax(0),
    "AVG": lambda xs: (xs.sum(0) / xs.shape[0]).to(xs.dtype),
    "BAND": lambda xs: xs[0] & xs[1],
    "BOR": lambda xs: xs[0] | xs[1],
    "BXOR": lambda xs: xs[0] ^ xs[1],
}


def reduce_ops(dtype):
    if dtype == torch.bool:
        return ["SUM", "MIN", "MAX", "PRODUCT"]
    if dtype.is_floating_point:
        return ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]
    return ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]


def expected_reduction(op, dtype, shape=(3, 4)):
    stacked = torch.stack([inputs(r, dtype, shape) for r in range(WORLD)])
    if dtype == torch.bool:  # as bytes: SUM/MAX are OR, MIN/PRODUCT are AND
        return REDUCE[op](stacked.to(torch.uint8)).bool()
    return REDUCE[op](stacked)


def check_all_reduce():
    for dtype in (torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool):
        for op in reduce_ops(dtype):
            x = inputs(RANK, dtype).to(DEVICE)
            dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
            equal(x, expected_reduction(op, dtype), f"all_reduce {op} {dtype}")
    x = inputs(RANK).to(DEVICE)
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
    equal(x, expected_reduction("SUM", torch.float32) * 0.5, "all_reduce PREMUL_SUM")
    # a strided view is reduced and written back through the view; the rest of its storage is untouched
    base = torch.zeros(6, 5)
    base[:, 1::2] = inputs(RANK, shape=(6, 2)).float()
    on_device = base.to(DEVICE)
    dist.all_reduce(on_device[:, 1::2])
    expected = torch.zeros(6, 5)
    expected[:, 1::2] = expected_reduction("SUM", torch.float32, (6, 2))
    equal(on_device, expected, "all_reduce of a strided view")
    transposed = inputs(RANK, shape=(4, 3)).to(DEVICE).t()
    dist.all_reduce(transposed, op=dist.ReduceOp.MAX)
    equal(transposed, expected_reduction("MAX", torch.float32, (4, 3)).t(), "all_reduce of a transpose")
    # sparse tensors (DDP's sparse embedding gradients): every rank's entries, summed
    sparse = torch.sparse_coo_tensor(torch.tensor([[RANK, WORLD]]), torch.tensor([1.0, RANK + 1.0]), (WORLD + 1,))
    sparse = sparse.to(DEVICE)
    dist.all_reduce(sparse)
    assert sparse.is_sparse and sparse.device == DEVICE, sparse
    expected = torch.ones(WORLD + 1)
    expected[WORLD] = sum(range(1, WORLD + 1))
    equal(sparse.to_dense(), expected, "all_reduce of a sparse tensor")
    try:
        dist.broadcast(sparse, 0)
        raise AssertionError("a broadcast of a sparse tensor should raise")
    except NotImplementedError as error:
        assert "only all_reduce" in str(error), error
    try:
        dist.all_reduce(torch.ones(2, device=DEVICE), op=dist.ReduceOp.BAND)
        raise AssertionError("BAND on floats should raise")
    except RuntimeError as error:
        assert "BAND" in str(error), error


def check_gathers():
    source = inputs(RANK).to(DEVICE)
    outputs = [torch.empty(3, 4, device=DEVICE) for _ in range(WORLD)]
    dist.all_gather(outputs, source)
    for r, out in enumerate(outputs):
        equal(out, inputs(r).float(), f"all_gather from rank {r}")
    # outputs that are non-contiguous views of one tensor
    big = torch.zeros(4, 2 * WORLD + 1, device=DEVICE)
    columns = [big[:, 2 * r : 2 * r + 2] for r in range(WORLD)]
    dist.all_gather(columns, inputs(RANK, shape=(4, 2)).to(DEVICE))
    expected = torch.zeros(4, 2 * WORLD + 1)
    for r in range(WORLD):
        expected[:, 2 * r : 2 * r + 2] = inputs(r, shape=(4, 2)).float()
    equal(big, expected, "all_gather into column views")
    # all_gather_into_tensor into a slice of a larger storage (FSDP2's pattern): aliases see the values
    storage = torch.full((3 + 12 * WORLD,), -1.0, device=DEVICE)
    window = storage.narrow(0, 3, 12 * WORLD)
    alias = storage.view(-1)
    dist.all_gather_into_tensor(window, source)
    flat = torch.cat([inputs(r).float().reshape(-1) for r in range(WORLD)])
    equal(alias, torch.cat([torch.full((3,), -1.0), flat]), "all_gather_into_tensor into a window")
    try:
        dist.all_gather_into_tensor(torch.empty(5, device=DEVICE), source)
        raise AssertionError("a wrongly sized output should raise")
    except ValueError as error:
        assert "world_size" in str(error), error
    if RANK == 0:
        gathered = [torch.zeros(3, 4, device=DEVICE) for _ in range(WORLD)]
        dist.gather(source, gathered, dst=0)
        for r, out in enumerate(gathered):
            equal(out, inputs(r).float(), f"gather from rank {r}")
    else:
        dist.gather(source, dst=0)


def check_reduce_scatter_broadcast():
    chunks = [inputs(RANK, shape=(2, 3)).float() + 10 * r for r in range(WORLD)]
    out = torch.empty(2, 3, device=DEVICE)
    dist.reduce_scatter(out, [c.to(DEVICE) for c in chunks], op=dist.ReduceOp.MAX)
    expected = torch.stack([inputs(r, shape=(2, 3)).float() + 10 * RANK for r in range(WORLD)]).amax(0)
    equal(out, expected, "reduce_scatter MAX")
    whole = torch.cat([inputs(RANK, shape=(2, 3)).float() + 10 * r for r in range(WORLD)]).to(DEVICE)
    out = torch.empty(2, 3, device=DEVICE)
    dist.reduce_scatter_tensor(out, whole)
    expected = sum(inputs(r, shape=(2, 3)).float() + 10 * RANK for r in range(WORLD))
    equal(out, expected, "reduce_scatter_tensor SUM")
    # broadcast is exact: -0.0, nan and inf survive
    special = torch.tensor([-0.0, float("nan"), float("inf"), 1.5]) * (1 if RANK == 1 else 0)
    x = special.to(DEVICE)
    dist.broadcast(x, src=1)
    got = x.cpu()
    assert torch.equal(got.isnan(), torch.tensor([False, True, False, False])), got
    assert torch.signbit(got[0]) and got[2] == float("inf") and got[3] == 1.5, got
    x = inputs(RANK, torch.int64).to(DEVICE)
    dist.reduce(x, dst=1, op=dist.ReduceOp.PRODUCT)
    equal(x, expected_reduction("PRODUCT", torch.int64) if RANK == 1 else inputs(RANK, torch.int64), "reduce to rank 1")
    out = torch.zeros(3, device=DEVICE)
    parts = [torch.full((3,), 7.0 + r, device=DEVICE) for r in range(WORLD)] if RANK == 0 else None
    dist.scatter(out, parts, src=0)
    equal(out, torch.full((3,), 7.0 + RANK), "scatter")


def check_all_to_all():
    source = torch.arange(4 * WORLD, dtype=torch.float32).reshape(2 * WORLD, 2) + 100 * RANK
    out = torch.empty_like(source, device=DEVICE)
    dist.all_to_all_single(out, source.to(DEVICE))
    expected = torch.cat([(torch.arange(4 * WORLD, dtype=torch.float32).reshape(2 * WORLD, 2) + 100 * r)[2 * RANK : 2 * RANK + 2] for r in range(WORLD)])
    equal(out, expected, "all_to_all_single even")
    # uneven: rank r sends j + r + 1 rows to rank j
    sends = [j + RANK + 1 for j in range(WORLD)]
    receives = [RANK + r + 1 for r in range(WORLD)]
    rows = lambda r: torch.arange(sum(j + r + 1 for j in range(WORLD)) * 3, dtype=torch.float32).reshape(-1, 3) + 1000 * r  # noqa: E731
    out = torch.empty(sum(receives), 3, device=DEVICE)
    dist.all_to_all_single(out, rows(RANK).to(DEVICE), receives, sends)
    pieces = []
    for r in range(WORLD):
        start = sum(j + r + 1 for j in range(RANK))
        pieces.append(rows(r)[start : start + RANK + r + 1])
    equal(out, torch.cat(pieces), "all_to_all_single uneven")
    outs = [torch.empty(RANK + r + 1, device=DEVICE, dtype=torch.int64) for r in range(WORLD)]
    ins = [torch.full((j + RANK + 1,), 10 * RANK + j, device=DEVICE, dtype=torch.int64) for j in range(WORLD)]
    dist.all_to_all(outs, ins)
    for r, o in enumerate(outs):
        equal(o, torch.full((RANK + r + 1,), 10 * r + RANK, dtype=torch.int64), f"all_to_all from {r}")


def check_point_to_point():
    peer = 1 - RANK
    if RANK == 0:
        dist.send(torch.arange(5.0, device=DEVICE), 1)
    else:
        got = torch.zeros(5, device=DEVICE)
        dist.recv(got, 0)
        equal(got, torch.arange(5.0), "send/recv")
    # both directions at once, each rank posting its send first (a ring exchange)
    mine = torch.full((4,), float(RANK), device=DEVICE)
    theirs = torch.zeros(2, 2, device=DEVICE).t()  # a non-contiguous receive buffer
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)])
    for w in works:
        w.wait()
    equal(theirs, torch.full((2, 2), float(peer)), "batch_isend_irecv exchange")
    send = dist.isend(mine * 3, peer)
    recv_buffer = torch.zeros(4, device=DEVICE)
    recv = dist.irecv(recv_buffer, peer)
    recv.wait()
    send.wait()
    equal(recv_buffer, torch.full((4,), 3.0 * peer), "isend/irecv")


def check_work_and_overlap():
    x = torch.ones(1 << 22, device=DEVICE)  # 16 MiB
    dist.all_reduce(x)
    torch.neuron.synchronize()
    start = time.perf_counter()
    work = dist.all_reduce(x, async_op=True)
    issued = time.perf_counter() - start
    future = work.get_future()
    work.wait()
    torch.neuron.synchronize()
    total = time.perf_counter() - start
    assert work.is_completed()
    assert issued < total, (issued, total)
    value = future.wait()
    assert value[0] is x, value
    equal(x[:3], torch.full((3,), float(WORLD) ** 2), "async all_reduce")
    print(f"overlap: issue {issued * 1e3:.2f} ms, complete {total * 1e3:.2f} ms")
    # coalesced collectives
    a, b = inputs(RANK).to(DEVICE), inputs(RANK, shape=(5,)).to(DEVICE)
    dist.all_reduce_coalesced([a, b])
    equal(a, expected_reduction("SUM", torch.float32), "all_reduce_coalesced a")
    equal(b, expected_reduction("SUM", torch.float32, (5,)), "all_reduce_coalesced b")
    outs = [torch.empty(12 * WORLD, device=DEVICE), torch.empty(5 * WORLD, device=DEVICE, dtype=torch.float64)]
    with dist._coalescing_manager(device=DEVICE, async_ops=True) as manager:
        dist.all_gather_into_tensor(outs[0], inputs(RANK).to(DEVICE).reshape(-1))
        dist.all_gather_into_tensor(outs[1], inputs(RANK, torch.float64, (5,)).to(DEVICE))
    manager.wait()
    equal(outs[1], torch.cat([inputs(r, torch.float64, (5,)) for r in range(WORLD)]), "coalesced all_gather_into_tensor")
    dist.barrier()


def check_groups_and_objects():
    everyone = dist.new_group(list(range(WORLD)))
    x = inputs(RANK).to(DEVICE)
    dist.all_reduce(x, group=everyone, op=dist.ReduceOp.MIN)
    equal(x, expected_reduction("MIN", torch.float32), "all_reduce on a new_group")
    alone = [dist.new_group([r]) for r in range(WORLD)]  # every rank takes part in every new_group
    x = inputs(RANK).to(DEVICE)
    dist.all_reduce(x, group=alone[RANK])
    equal(x, inputs(RANK).float(), "all_reduce on a group of one")
    objects = [None] * WORLD
    dist.all_gather_object(objects, {"rank": RANK})
    assert objects == [{"rank": r} for r in range(WORLD)], objects
    assert dist.get_backend() == "neuron"
    # functional collectives (the _c10d_functional ops), by group and by device mesh
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("neuron", (WORLD,))
    t = inputs(RANK).to(DEVICE)
    equal(funcol.all_reduce(t, "sum", mesh), expected_reduction("SUM", torch.float32), "funcol.all_reduce")
    equal(funcol.all_gather_tensor(t, 0, dist.group.WORLD), torch.cat([inputs(r).float() for r in range(WORLD)]), "funcol.all_gather_tensor")
    scattered = funcol.reduce_scatter_tensor(torch.cat([t] * WORLD), "sum", 0, mesh)
    equal(scattered, expected_reduction("SUM", torch.float32), "funcol.reduce_scatter_tensor")
    # in a compiled graph the collective runs between the graph's XLA programs
    compiled = torch.compile(lambda x: funcol.all_reduce(x * 2, "max", mesh) + 1, backend="neuron")
    equal(compiled(t), expected_reduction("MAX", torch.float32) * 2 + 1, "funcol.all_reduce under torch.compile")


def check_sparse_embedding_ddp():
    """DDP over nn.Embedding(sparse=True): its sparse gradients are averaged and stepped on the device, as one
    process training on every rank's batch."""
    torch.manual_seed(0)
    reference = torch.nn.Embedding(10, 4, sparse=True)
    model = DDP(copy.deepcopy(reference).to(DEVICE))
    batches = torch.arange(WORLD * 3).view(WORLD, 3) // 2  # ranks share some rows
    model(batches[RANK].to(DEVICE)).sum().backward()
    assert model.module.weight.grad.is_sparse
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    reference(batches).sum().div(WORLD).backward()
    torch.optim.SGD(reference.parameters(), lr=0.5).step()
    equal(model.module.weight.detach(), reference.weight.detach(), "DDP with sparse embedding gradients")


def job_collectives():
    init()
    assert torch.neuron.current_device() == DEVICE.index
    for check in (check_all_reduce, check_gathers, check_reduce_scatter_broadcast, check_all_to_all,
                  check_point_to_point, check_work_and_overlap, check_groups_and_objects, check_sparse_embedding_ddp):
        check()
        print("passed", check.__name__, flush=True)
    dist.destroy_process_group()
    # a second process group in the same process, device-mapped: CPU tensors go to gloo. Its store gets
    # a port of its own: on the first one, a fast rank could reach the store rank 0 is still shutting down
    os.environ["MASTER_PORT"] = os.environ["REINIT_PORT"]
    # bound to this rank's device, as CUDA code binds NCCL's (which connects at once and splits later groups
    # from it): the neuron group makes its groups, and DeviceMesh's, as unbound
    init("cpu:gloo,neuron:neuron", device_id=DEVICE)
    assert {d.type for d in dist.distributed_c10d._get_default_group()._device_types} == {"cpu", "neuron"}
    cpu, neuron = inputs(RANK), inputs(RANK).to(DEVICE)
    dist.all_reduce(cpu)
    dist.all_reduce(neuron, group=dist.new_group(list(range(WORLD)), device_id=DEVICE))
    equal(neuron, expected_reduction("SUM", torch.float32), "all_reduce after re-initialising")
    equal(cpu.to(DEVICE), expected_reduction("SUM", torch.float32), "gloo all_reduce of CPU tensors")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("neuron", (WORLD,))
    equal(funcol.all_reduce(inputs(RANK).to(DEVICE), "sum", mesh), expected_reduction("SUM", torch.float32),
          "funcol.all_reduce over a mesh of a bound group")
    dist.destroy_process_group()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


class _WithUnused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = _model()
        self.unused = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.body(x)


def _train(variant: str, steps: int = 20):
    """Losses of DDP on this rank's half of each batch (averaged over ranks) and of one process on the
    full batch; DDP averages gradients, so the two runs are the same run."""
    torch.manual_seed(1)
    data = [(torch.randn(8, 8), torch.randn(8, 4)) for _ in range(steps)]
    extra = (torch.randn(8, 8), torch.randn(8, 4))  # "join": uneven inputs, rank 0's one batch more
    reference = _WithUnused() if variant == "find_unused" else _model()
    model = copy.deepcopy(reference).to(DEVICE)
    # several buckets for this small model; compiled, the default (Dynamo's DDP optimizer refuses buckets
    # smaller than c10d's 1 MB first bucket)
    options = {} if variant == "compiled" else {"bucket_cap_mb": 0.0005}
    if variant == "find_unused":
        options["find_unused_parameters"] = True
    if variant == "static_graph":
        options["static_graph"] = True
    ddp = DDP(model, **options)
    if variant in ("fp16", "bf16"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        # bf16_compress_hook itself refuses devices other than CUDA and XPU; the hook is its compression
        dtype = torch.float16 if variant == "fp16" else torch.bfloat16

        def compress(state, bucket):
            return default_hooks._compress_hook(dtype, state, bucket)

        ddp.register_comm_hook(None, compress)
    if variant == "post_local_sgd":
        from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as local_sgd

        # from step 5 each machine's ranks average among themselves: the default subgroup (made at the hook's
        # first call) is this machine's devices, which here are every rank, so the training stays the single
        # process's
        local_sgd_state = local_sgd.PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=5)
        ddp.register_comm_hook(local_sgd_state, local_sgd.post_localSGD_hook)
    if variant == "zero":  # the optimizer's state sharded over the ranks, parameters broadcast after each step
        optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    else:
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    if variant == "compiled":
        # Dynamo's DDP optimizer splits the graph at bucket boundaries so each bucket's all-reduce overlaps
        ddp = torch.compile(ddp, backend="neuron")
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    losses, reference_losses = [], []
    with Join([ddp]) if variant == "join" else contextlib.nullcontext():
        _steps(variant, data, ddp, optimizer, reference, reference_optimizer, losses, reference_losses)
        if variant == "join":
            # rank 1 has joined: it shadows rank 0's all-reduce with zeros, so the gradient is half of rank 0's
            # (averaged over both ranks), and at the end Join gives it rank 0's parameters
            x, y = extra
            if RANK == 0:
                F.mse_loss(ddp(x[:4].to(DEVICE)), y[:4].to(DEVICE)).backward()
                optimizer.step()
            (0.5 * F.mse_loss(reference(x[:4]), y[:4])).backward()
            reference_optimizer.step()
    if variant == "post_local_sgd":
        assert local_sgd_state.subgroup.size() == torch.neuron.device_count() == WORLD
    params = [p.detach().cpu() for p in model.parameters()]
    return losses, reference_losses, params, list(reference.parameters())


def _steps(variant, data, ddp, optimizer, reference, reference_optimizer, losses, reference_losses):
    for step, (x, y) in enumerate(data):
        mine = slice(RANK * 8 // WORLD, (RANK + 1) * 8 // WORLD)
        if variant == "no_sync" and step % 2 == 0:
            # accumulate two half-batches locally, then synchronise on the second
            with ddp.no_sync():
                F.mse_loss(ddp(x[mine][:2].to(DEVICE)), y[mine][:2].to(DEVICE)).backward()
            loss = F.mse_loss(ddp(x[mine][2:].to(DEVICE)), y[mine][2:].to(DEVICE))
            loss.backward()
            for reference_part in (slice(0, 2), slice(2, 4)):
                parts = torch.cat([x[r * 4 : r * 4 + 4][reference_part] for r in range(WORLD)])
                targets = torch.cat([y[r * 4 : r * 4 + 4][reference_part] for r in range(WORLD)])
                F.mse_loss(reference(parts), targets).backward()
            reference_loss = loss.detach().new_tensor(0.0)  # the compared values are the parameters
        else:
            loss = F.mse_loss(ddp(x[mine].to(DEVICE)), y[mine].to(DEVICE))
            loss.backward()
            reference_loss = F.mse_loss(reference(x), y)
            reference_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss, op=dist.ReduceOp.AVG)
        if not (variant == "no_sync" and step % 2 == 0):
            losses.append(global_loss.item())
            reference_losses.append(reference_loss.item())


def _sync_batch_norm():
    """SyncBatchNorm under DDP, each rank holding half of each batch, computes what one BatchNorm computes
    on the whole batch: outputs, input gradients, parameters after each step, running statistics; then the
    same in eval mode."""
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                    torch.nn.Conv2d(4, 2, 1))
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(reference)).to(DEVICE)
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    mine = slice(RANK * 4, RANK * 4 + 4)
    tolerance = dict(rtol=1e-4, atol=1e-5)
    for step in range(3):
        batch = torch.randn(8, 3, 6, 6, generator=generator)
        x, whole = batch[mine].to(DEVICE).requires_grad_(), batch.clone().requires_grad_()
        out, expected = ddp(x), reference(whole)
        out.square().mean().backward()
        expected.square().mean().backward()
        equal(out, expected[mine].detach(), f"step {step} output", **tolerance)
        # each rank's loss is the mean over its half: the batch statistics carry both ranks' losses back
        equal(x.grad, 2 * whole.grad[mine], f"step {step} input gradient", **tolerance)
        optimizer.step()
        reference_optimizer.step()
        optimizer.zero_grad()
        reference_optimizer.zero_grad()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            equal(p.detach(), q.detach(), f"step {step} {name}", **tolerance)
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            equal(getattr(model[1], name), getattr(reference[1], name), f"step {step} {name}", **tolerance)
    ddp.eval()
    reference.eval()
    equal(ddp(batch[mine].to(DEVICE)).detach(), reference(batch)[mine].detach(), "eval output", **tolerance)


def job_ddp(variants: str):
    init()
    for variant in variants.split(","):
        if variant == "sync_batch_norm":
            _sync_batch_norm()
            print("passed ddp sync_batch_norm", flush=True)
            continue
        losses, reference_losses, params, reference_params = _train(variant)
        tolerance = dict(rtol=2e-2, atol=2e-3) if variant in ("fp16", "bf16") else dict(rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses), **tolerance)
        for p, q in zip(params, reference_params):
            torch.testing.assert_close(p, q.detach(), **tolerance)
        print(f"passed ddp {variant}: final loss {losses[-1]:.6f} (single process {reference_losses[-1]:.6f})", flush=True)
    dist.destroy_process_group()


def _compiled_step(x, w, group):
    total = funcol.all_reduce(x, "sum", group)
    y = torch.tanh(total @ w) * 2
    gathered = funcol.all_gather_tensor(y, 0, group)
    biggest = funcol.all_reduce(gathered.amax(0), "max", group)
    return gathered.sum(0) + biggest, funcol.reduce_scatter_tensor(gathered, "avg", 0, group)


def _compiled_misc(x, n, group):
    swapped = funcol.all_to_all_single(x, None, None, group)
    count = funcol.all_reduce(n, "bxor", group) + funcol.all_reduce(n, "product", group)
    return funcol.broadcast(swapped * 3, 1, group), count


def job_compiled():
    """Functional collectives in one compiled program: equal to eager and to the CPU, no graph split."""
    import torchneuron.compile

    init()
    group = dist.group.WORLD
    xs = [inputs(r, shape=(4, 3)) / 7 for r in range(WORLD)]
    w = torch.linspace(-1, 1, 6).reshape(3, 2)
    # the CPU's answer from every rank's input
    y = torch.tanh(sum(xs) @ w) * 2
    gathered = torch.cat([y] * WORLD)
    expected = (gathered.sum(0) + gathered.amax(0), gathered.chunk(WORLD)[RANK])
    eager = _compiled_step(xs[RANK].to(DEVICE), w.to(DEVICE), group)
    torch._dynamo.reset()
    torchneuron.compile.reset()
    compiled = torch.compile(_compiled_step, backend="neuron", fullgraph=True)
    for attempt in range(2):
        outputs = compiled(xs[RANK].to(DEVICE), w.to(DEVICE), group)
        for out, e, want in zip(outputs, eager, expected):
            equal(out, e.cpu(), f"compiled step (call {attempt}) against eager")
            equal(out, want, f"compiled step (call {attempt}) against the CPU")
    report = torchneuron.compile.report()
    assert report["graphs"] == 1 and report["specialisations"] == 1 and not report["eager_ops"], report
    # an even all_to_all_single, broadcast, and integer reductions
    rows = [torch.arange(8, dtype=torch.float32).reshape(4, 2) + 10 * r for r in range(WORLD)]
    ns = [torch.tensor([3 + r, 6 * r + 1]) for r in range(WORLD)]
    swapped = torch.cat([rows[r].chunk(WORLD)[1] for r in range(WORLD)])
    count = (ns[0] ^ ns[1]) + ns[0] * ns[1]
    torchneuron.compile.reset()
    misc = torch.compile(_compiled_misc, backend="neuron", fullgraph=True)
    out, n = misc(rows[RANK].to(DEVICE), ns[RANK].to(DEVICE), group)
    equal(out, swapped * 3, "compiled all_to_all_single + broadcast")
    equal(n, count, "compiled BXOR and PRODUCT all_reduce of int64")
    report = torchneuron.compile.report()
    assert report["graphs"] == 1 and not report["eager_ops"], report
    # uneven splits make each rank's program different: that collective runs eagerly, still exactly
    ins = [[1 + r, 3 - r] for r in range(WORLD)]
    outs = [[ins[src][r] for src in range(WORLD)] for r in range(WORLD)]
    uneven = torch.compile(lambda x: funcol.all_to_all_single(x * 2, outs[RANK], ins[RANK], group) + 1, backend="neuron")
    received = torch.cat([rows[src].split(ins[src])[RANK] for src in range(WORLD)])
    equal(uneven(rows[RANK].to(DEVICE)), received * 2 + 1, "compiled all_to_all_single with uneven splits")
    assert "_c10d_functional.all_to_all_single.default" in torchneuron.compile.report()["eager_ops"]
    # a training step: the gradient all-reduce lives in the backward graph's program
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to(DEVICE)

    def train_step(x):
        loss = model(x).square().mean()
        loss.backward()
        return [funcol.all_reduce(p.grad, "avg", group) for p in model.parameters()]

    grads = torch.compile(train_step, backend="neuron")(xs[RANK].to(DEVICE))
    reference = copy.deepcopy(model).cpu()
    reference.zero_grad(set_to_none=True)
    reference(torch.cat(xs)).square().mean().backward()
    for g, p in zip(grads, reference.parameters()):
        equal(g, p.grad, "compiled all_reduce of gradients", atol=1e-5, rtol=1e-5)
    print("passed compiled collectives", torchneuron.compile.report(), flush=True)
    check_adaptive_eager()
    print("passed adaptive eager", flush=True)
    # ranks compiling the graph for different shapes get an error, not mismatched collectives
    uneven = torch.compile(lambda x: funcol.all_reduce(x, "sum", group) * 2, backend="neuron", dynamic=False)
    try:
        uneven(torch.ones(3 + RANK, device=DEVICE))
    except RuntimeError as error:
        assert "ranks disagree on a collective" in str(error) and "compiled graph" in str(error), error
    else:
        raise AssertionError("ranks compiling different programs were not stopped")
    dist.destroy_process_group()


def check_adaptive_eager():
    """Under adaptive eager a collective is a sync point: the ops queued before it run (fused) first, it
    reduces their result, and ops after it queue again on its output."""
    from torchneuron.eager import adaptive

    x = inputs(RANK).to(DEVICE)

    def step():
        y = (x * 2 + 1).relu()
        assert adaptive.stats()["queued"] > 0 or not adaptive.is_enabled(), adaptive.stats()
        dist.all_reduce(y, async_op=True)
        assert adaptive.stats()["queued"] == 0, "the queue runs before the collective reads its input"
        return (y - 3) * 0.5

    with torch.neuron.adaptive_eager(False):
        eager = step().cpu()  # every op's executable runs once: adaptive eager queues only known-good ops
    with torch.neuron.adaptive_eager():
        flushes = adaptive.stats()["flushes"]
        fused = step()
        assert adaptive.stats()["queued"] > 0, "ops after the collective queue on its output"
        equal(fused, eager, "adaptive eager around an all_reduce")
        assert adaptive.stats()["flushes"] >= flushes + 2, adaptive.stats()
    stacked = torch.stack([(inputs(r) * 2 + 1).relu() for r in range(WORLD)]).sum(0)
    equal(eager, (stacked - 3) * 0.5, "all_reduce between queued ops against the CPU")


def _captured(step):
    """`step` captured in a graph (torch.neuron.graph) and what the capture returned: each replay runs it."""
    graph = torch.neuron.NeuronGraph()
    with torch.neuron.graph(graph):
        outputs = step()
    return graph, outputs


def _check_captured_training(parallel: str):
    """A data-parallel training step captured whole (forward, backward, the gradients' collectives, AdamW with its
    step count on the device, as CUDA graphs need) and replayed on each rank's batch: the parameters of one CPU
    process training on every rank's batch. The gradients are averaged by an all_reduce each, by DDP's
    buckets, or by FSDP2's reduce-scatters (whose all-gathered parameters it frees between uses)."""
    torch.manual_seed(1)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model = copy.deepcopy(reference).to(DEVICE)
    if parallel == "DDP":
        model = DDP(model)
    elif parallel == "FSDP2":
        from torch.distributed.fsdp import fully_shard

        for layer in (model[0], model[2], model):
            fully_shard(layer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.01), capturable=True)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=0.01)
    batch = torch.zeros(3, 4, device=DEVICE)

    def train():
        optimizer.zero_grad(set_to_none=True)
        model(batch).square().mean().backward()
        if parallel == "all_reduce":
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        optimizer.step()

    def step(seed, run):
        batches = [torch.randn(3, 4, generator=torch.Generator().manual_seed(seed + r)) for r in range(WORLD)]
        batch.copy_(batches[RANK].to(DEVICE))
        run()
        reference_optimizer.zero_grad()
        reference(torch.cat(batches)).square().mean().backward()
        reference_optimizer.step()

    for seed in (0, 5):  # as with CUDA graphs, steps run before the capture: DDP rebuilds its buckets at the second
        step(seed, train)
    graph, _ = _captured(train)
    for seed in (10, 20, 30):
        step(seed, graph.replay)
        for p, q in zip(model.parameters(), reference.parameters()):
            p = p.full_tensor() if parallel == "FSDP2" else p
            equal(p, q.detach(), f"captured {parallel} training step, batch {seed}", atol=1e-5, rtol=1e-5)


def _check_captured_tensor_parallel():
    """A module made tensor-parallel by DTensor (ColwiseParallel, RowwiseParallel): its forward and its training
    step captured and replayed equal the unsplit module on the CPU."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))
    mesh = init_device_mesh("neuron", (WORLD,))
    model = parallelize_module(copy.deepcopy(reference).to(DEVICE), mesh,
                               {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.zeros(4, 8, device=DEVICE)
    with torch.no_grad():
        graph, out = _captured(lambda: model(x) * 1)  # `* 1` waits for the row-parallel layer's all_reduce
        for seed in (1, 2):
            data = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))
            x.copy_(data.to(DEVICE))
            graph.replay()
            equal(out, reference(data), f"captured tensor-parallel forward, input {seed}", atol=1e-5, rtol=1e-5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)

    def train():
        optimizer.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        optimizer.step()

    graph, _ = _captured(train)
    for seed in (3, 4):
        data = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))
        x.copy_(data.to(DEVICE))
        graph.replay()
        reference_optimizer.zero_grad()
        reference(data).square().mean().backward()
        reference_optimizer.step()
        for p, q in zip(model.parameters(), reference.parameters()):
            equal(p.full_tensor(), q.detach(), f"captured tensor-parallel training step {seed}", atol=1e-5, rtol=1e-5)


def _check_device_checks_with_a_collective(group):
    """An embedding lookup beside an all_reduce, compiled into one program and captured in a graph: an index out
    of range raises at the next synchronisation, as in one process."""
    table = torch.arange(12.0).reshape(6, 2).to(DEVICE)
    index = torch.tensor([1, 3], device=DEVICE)

    def lookup():
        return funcol.all_reduce(F.embedding(index, table), "sum", group)

    compiled = torch.compile(lookup, backend="neuron", fullgraph=True)
    graph, captured = _captured(lookup)
    expected = table.cpu()[[1, 3]] * WORLD
    for run in (compiled, lambda: (graph.replay(), captured)[1]):
        index.copy_(torch.tensor([1, 3]))
        equal(run(), expected, "embedding beside an all_reduce")
        index.copy_(torch.tensor([2, 6]))
        run()
        try:
            torch.neuron.synchronize()
        except IndexError as error:
            assert "index out of range" in str(error), error
        else:
            raise AssertionError("an index out of range beside a collective was not raised")


def _check_random_ops_with_a_collective(group):
    """Dropout beside an all_reduce, compiled into one program and captured in a graph: each call or replay draws
    new numbers (a random op's key is a host array, put on the device for the program of all ranks)."""
    ones = torch.ones(64, device=DEVICE)

    def step():
        return funcol.all_reduce(F.dropout(ones, 0.5), "sum", group)

    compiled = torch.compile(step, backend="neuron", fullgraph=True)
    graph, captured = _captured(step)
    draws = []
    for run in (compiled, compiled, lambda: (graph.replay(), captured)[1], lambda: (graph.replay(), captured)[1]):
        values = run().cpu()
        assert set(values.unique().tolist()) <= {0.0, 2.0, 4.0} and values.std() > 0, values
        draws.append(values)
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[2], draws[3]), draws


def job_captured():
    """Collectives captured in a graph with the ops around them, as NCCL's in a CUDA graph: each replay runs
    them again on what it computed; equal to the CPU, from every rank's inputs."""
    import torchneuron.compile

    init()
    group = dist.group.WORLD
    torch.manual_seed(0)
    # a tensor-parallel MLP: columns of the first weight and rows of the second per rank, partial sums all-reduced
    w1, w2 = torch.randn(8, 6), torch.randn(6, 8)
    x = torch.zeros(4, 8, device=DEVICE)
    w1_shard, w2_shard = w1.chunk(WORLD, 1)[RANK].to(DEVICE), w2.chunk(WORLD, 0)[RANK].to(DEVICE)

    def mlp():
        partial = torch.relu(x @ w1_shard) @ w2_shard
        dist.all_reduce(partial)
        return partial * 0.5 + 1

    graph, out = _captured(mlp)
    _check_random_ops_with_a_collective(group)
    _check_device_checks_with_a_collective(group)
    for step in range(3):
        data = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))  # the same on every rank
        x.copy_(data.to(DEVICE))
        graph.replay()
        equal(out, (torch.relu(data @ w1) @ w2) * 0.5 + 1, f"captured tensor-parallel MLP, replay {step}",
              atol=1e-5, rtol=1e-5)
    # gathers, reduce-scatter, broadcast, all-to-all, a strided view reduced in place and a functional
    # collective in one graph
    a = torch.zeros(3, 4, device=DEVICE)

    def collectives():
        gathered = torch.empty(WORLD * 3, 4, device=DEVICE)
        dist.all_gather_into_tensor(gathered, a * 2)
        scattered = torch.empty(12 // WORLD, device=DEVICE)
        dist.reduce_scatter_tensor(scattered, a.reshape(-1) + 1, op=dist.ReduceOp.MAX)
        broadcast = a - 1
        dist.broadcast(broadcast, src=1)
        swapped = torch.empty(12, device=DEVICE)
        dist.all_to_all_single(swapped, a.reshape(-1) * 3)
        strided = a.clone()
        dist.all_reduce(strided[:, 1], op=dist.ReduceOp.SUM)
        listed = [torch.empty(3, 4, device=DEVICE) for _ in range(WORLD)]
        dist.all_gather(listed, a + 5)
        rows = torch.empty(WORLD, 3, 4, device=DEVICE)  # views of one storage, written one after the other
        dist.all_gather(list(rows.unbind(0)), a * 4)
        summed = torch.empty(3, device=DEVICE)
        dist.reduce_scatter(summed, list((a * 5).unbind(1)[:WORLD]))
        exchanged = [torch.empty(6, device=DEVICE) for _ in range(WORLD)]
        dist.all_to_all(exchanged, list(a.reshape(-1).add(7).chunk(WORLD)))
        reduced = a * 3
        dist.reduce(reduced, dst=1, op=dist.ReduceOp.MAX)
        return (gathered, scattered, broadcast, swapped, strided, funcol.all_reduce(a, "avg", group) + 0,
                torch.cat(listed), rows.reshape(-1, 4), summed, torch.cat(exchanged), reduced)

    graph, outs = _captured(collectives)
    for step in range(2):
        values = [inputs(r) * (step + 1) for r in range(WORLD)]
        a.copy_(values[RANK].to(DEVICE))
        graph.replay()
        strided = values[RANK].clone()
        strided[:, 1] = sum(v[:, 1] for v in values)
        expected = (torch.cat([v * 2 for v in values]),
                    torch.stack([v.reshape(-1) + 1 for v in values]).amax(0).chunk(WORLD)[RANK],
                    values[1] - 1,
                    torch.cat([(v.reshape(-1) * 3).chunk(WORLD)[RANK] for v in values]),
                    strided,
                    sum(values) / WORLD,
                    torch.cat([v + 5 for v in values]),
                    torch.cat([v * 4 for v in values]),
                    sum(v[:, RANK] * 5 for v in values),
                    torch.cat([(v.reshape(-1) + 7).chunk(WORLD)[RANK] for v in values]),
                    torch.stack([v * 3 for v in values]).amax(0) if RANK == 1 else values[RANK] * 3)
        for name, got, want in zip(("all_gather", "reduce_scatter", "broadcast", "all_to_all", "strided all_reduce",
                                    "functional all_reduce", "all_gather into a list", "all_gather into views",
                                    "reduce_scatter of a list", "all_to_all of lists", "reduce"), outs, expected):
            equal(got, want, f"captured {name}, replay {step}")
    for parallel in ("all_reduce", "DDP", "FSDP2"):
        _check_captured_training(parallel)
    _check_captured_tensor_parallel()
    # a compiled graph whose collectives are in its program, captured with eager ops around it
    torchneuron.compile.reset()
    compiled = torch.compile(lambda v: funcol.all_reduce(torch.tanh(v), "sum", group) * 2, backend="neuron",
                             fullgraph=True)
    v = torch.zeros(5, device=DEVICE)
    compiled(v)
    graph, result = _captured(lambda: compiled(v + 1) - 1)
    values = [torch.linspace(-1, 1, 5) * (r + 1) for r in range(WORLD)]
    v.copy_(values[RANK].to(DEVICE))
    graph.replay()
    equal(result, sum(torch.tanh(t + 1) for t in values) * 2 - 1, "captured compiled graph with a collective")
    # ranks that captured different collectives are stopped at the first replay, before any runs
    graph, _ = _captured(lambda: dist.all_reduce(a, op=dist.ReduceOp.SUM if RANK == 0 else dist.ReduceOp.MAX))
    try:
        graph.replay()
    except RuntimeError as error:
        assert "ranks disagree" in str(error) and "captured graph" in str(error), error
    else:
        raise AssertionError("ranks replaying different collectives were not stopped")
    # the collectives of two process groups over different ranks cannot share one program
    singles = [dist.new_group([r]) for r in range(WORLD)]
    try:
        with torch.neuron.graph(torch.neuron.NeuronGraph()):
            dist.all_reduce(a)
            dist.all_reduce(a, group=singles[RANK])
    except RuntimeError as error:
        assert "captures the collectives of one process group" in str(error), error
    else:
        raise AssertionError("a capture over two process groups was not refused")
    dist.barrier()
    dist.destroy_process_group()
    print("passed captured collectives", flush=True)


def job_fault(kind: str):
    init(seconds=10)
    x = torch.ones(4 + (RANK if kind == "shape" else 0), device=DEVICE)
    if kind == "raise" and RANK == 1:
        raise RuntimeError("rank 1 fails before the collective")
    if kind == "die" and RANK == 1:
        os._exit(3)
    start = time.perf_counter()
    try:
        dist.all_reduce(x)
        x.cpu()
    except Exception as error:
        print(f"rank {RANK} failed after {time.perf_counter() - start:.1f}s: {type(error).__name__}: {error}", flush=True)
        raise
    print(f"rank {RANK} unexpectedly completed: {x.cpu()}", flush=True)


if __name__ == "__main__":
    globals()[f"job_{sys.argv[1]}"](*sys.argv[2:])
