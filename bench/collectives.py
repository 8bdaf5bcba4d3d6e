"""Collective bus bandwidth: the `neuron` backend on neuron tensors against torch's gloo on CPU tensors.

    python bench/collectives.py [--sizes-mib 1,4,16,64,256] [--iters 5] [--world 2]

Starts `--world` ranks (subprocesses, torchrun's environment) that run all-reduce, all-gather and
reduce-scatter at each size through both backends in the same processes, alternating, and prints a
markdown table from rank 0: median time per call and bus bandwidth as nccl-tests defines it
(all-reduce moves 2(n-1)/n of the buffer per rank, all-gather and reduce-scatter (n-1)/n of the
whole). Small-message latency is the 4 KiB row. Run it on an otherwise idle machine.
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time

KIB, MIB = 1 << 10, 1 << 20


def _bus_factor(op: str, world: int) -> float:
    return 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world


def _call(dist, op: str, buffers, group):
    big, small = buffers
    if op == "all_reduce":
        return dist.all_reduce(big, group=group, async_op=True)
    if op == "all_gather":
        return dist.all_gather_into_tensor(big, small, group=group, async_op=True)
    return dist.reduce_scatter_tensor(small, big, group=group, async_op=True)


def _time(dist, op, buffers, group, iters: int, finish) -> float:
    """Median seconds per call, each call issued after a barrier and timed until its result is ready
    (`Work.wait()` blocks until the outputs are computed, on both backends)."""
    _call(dist, op, buffers, group).wait()
    finish()
    times = []
    for _ in range(iters):
        dist.barrier(group=group)
        start = time.perf_counter()
        _call(dist, op, buffers, group).wait()
        finish()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rank_main(sizes, iters: int) -> None:
    import torch
    import torch.distributed as dist

    import torchneuron  # noqa: F401

    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=600))
    gloo = dist.new_group(backend="gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    rows = []
    for nbytes in sizes:
        numel = max(world, nbytes // 4 // world * world)
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            result = {}
            for name, where, group, finish in (
                ("neuron", device, None, lambda: None),
                ("gloo", torch.device("cpu"), gloo, lambda: None),
            ):
                buffers = (torch.ones(numel, device=where), torch.ones(numel // world, device=where))
                result[name] = _time(dist, op, buffers, group, iters, finish)
                del buffers
            busbw = {k: numel * 4 * _bus_factor(op, world) / t / 1e9 for k, t in result.items()}
            rows.append((op, nbytes, result, busbw))
    if rank == 0:
        print("| op | size | neuron ms | gloo ms | neuron busbw GB/s | gloo busbw GB/s | neuron / gloo |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for op, nbytes, t, bw in rows:
            size = f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"
            print(f"| {op} | {size} | {t['neuron'] * 1e3:.2f} | {t['gloo'] * 1e3:.2f} | {bw['neuron']:.2f} | "
                  f"{bw['gloo']:.2f} | {bw['neuron'] / bw['gloo']:.2f}x |", flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mib", default="1,4,16,64,256")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [4 * KIB] + [int(float(s) * MIB) for s in args.sizes_mib.split(",")]
    if args.rank is not None:
        rank_main(sizes, args.iters)
        return
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    procs = []
    for rank in range(args.world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(args.world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(args.world))
        procs.append(subprocess.Popen([sys.executable, __file__, "--sizes-mib", args.sizes_mib,
                                       "--iters", str(args.iters), "--rank", str(rank)], env=env,
                                      stderr=subprocess.DEVNULL if rank else None))
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
