"""Tokens/s of a small GPT under FSDP2 and DDP on 2 ranks and on 1 rank: neuron against CPU/gloo.

    python bench/parallel.py [--steps 5] [--width 256] [--layers 4]

Each configuration starts its ranks (subprocesses with torchrun's environment); every rank trains the
same model on neuron (the `neuron` backend) and then on the CPU (gloo), in the same processes, and
rank 0 prints one markdown row per configuration and device: tokens/s over all ranks (median step; "neuron
graph": the step captured whole in a graph, with its collectives, and replayed) and,
for FSDP2, the fraction of step time spent in its all-gathers and reduce-scatters. To attribute that
time each collective is waited for where it is issued, which removes FSDP2's overlap of communication
with compute: the fraction is an upper bound. Run it on an otherwise idle machine.
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIGS = {"fsdp2": 2, "ddp": 2, "single": 1}
GLOO = None
VOCAB, CONTEXT, BATCH = 512, 128, 8  # batch: sequences per rank


class CollectiveClock:
    """Wall time spent in FSDP2's collectives (torch.distributed's functions, looked up at call time)."""

    NAMES = ("all_gather_single", "reduce_scatter_single", "all_reduce")

    def __init__(self, dist):
        self.seconds, self.dist = 0.0, dist
        for name in self.NAMES:
            setattr(dist, name, self._timed(getattr(dist, name)))

    def _timed(self, collective):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            work = collective(*args, **kwargs)
            if work is not None:
                work.wait()
            self.seconds += time.perf_counter() - start
            return work
        return timed


def _model(config, device, world):
    import torch
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from examples.demo import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(VOCAB, width=ARGS.width, heads=4, layers=ARGS.layers, context=CONTEXT).to(device)
    if config == "fsdp2":
        mesh = (init_device_mesh("neuron", (world,)) if device.type == "neuron"
                else DeviceMesh.from_group(GLOO, "cpu"))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif config == "ddp":
        on_neuron = device.type == "neuron"
        model = DistributedDataParallel(model, device_ids=[device] if on_neuron else None,
                                        process_group=None if on_neuron else GLOO)
    return model


def _steps(config, device, world, clock, captured=False):
    """Median seconds per step, and the median fraction of it spent in collectives; `captured`: the step captured
    whole in a graph (torch.neuron.graph) after the warm-up steps, each step a replay (no fraction)."""
    import torch
    import torch.nn.functional as F

    model = _model(config, device, world)
    # a captured step keeps AdamW's step count and learning rate on the device, as CUDA graphs need
    opt = (torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3), capturable=True) if captured
           else torch.optim.AdamW(model.parameters(), lr=1e-3))
    g = torch.Generator().manual_seed(int(os.environ["RANK"]))
    tokens = torch.randint(0, VOCAB, (BATCH, CONTEXT + 1), generator=g).to(device)

    def train():
        opt.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        return loss

    times, fractions = [], []
    for step in range(ARGS.warmup + ARGS.steps):
        if captured and step == ARGS.warmup:
            graph = torch.neuron.NeuronGraph()
            with torch.neuron.graph(graph):
                captured_loss = train()
            train = lambda: (graph.replay(), captured_loss)[1]  # noqa: E731
        clock.seconds = 0.0
        start = time.perf_counter()
        train().item()  # waits for the device
        if step >= ARGS.warmup:
            times.append(time.perf_counter() - start)
            fractions.append(clock.seconds / times[-1])
    return statistics.median(times), None if captured else statistics.median(fractions)


def rank_main(config: str) -> None:
    import torch
    import torch.distributed as dist

    import torchneuron  # noqa: F401

    world = int(os.environ["WORLD_SIZE"])
    global GLOO
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=600))
    GLOO = dist.new_group(backend="gloo")  # the CPU runs on torch's own gloo, not through the neuron backend
    clock = CollectiveClock(dist)
    rows = []
    neuron = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    for name, device, captured in (("neuron", neuron, False), ("neuron graph", neuron, True),
                                   ("cpu/gloo", torch.device("cpu"), False)):
        rows.append((name, *_steps(config, device, world, clock, captured)))
    if dist.get_rank() == 0:
        for name, seconds, fraction in rows:
            share = f"{fraction:.0%}" if config == "fsdp2" and fraction is not None else "-"
            print(f"| {config} | {world} | {name} | {seconds * 1e3:.0f} | {world * BATCH * CONTEXT / seconds:.0f} | "
                  f"{share} |", flush=True)
    dist.destroy_process_group()


def launch(config: str) -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    world = CONFIGS[config]
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
        procs.append(subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--config", config], env=env,
                                      stderr=subprocess.DEVNULL if rank else None))
    return max(p.wait() for p in procs)


def main() -> None:
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--config", help=argparse.SUPPRESS)
    ARGS = parser.parse_args()
    if ARGS.config is not None:
        rank_main(ARGS.config)
        return
    print(f"TinyGPT width {ARGS.width}, {ARGS.layers} layers, {BATCH}x{CONTEXT} tokens per rank and step")
    print("| config | ranks | device | step ms | tokens/s | in collectives |")
    print("| --- | ---: | --- | ---: | ---: | ---: |", flush=True)
    sys.exit(max(launch(config) for config in ARGS.configs.split(",")))


if __name__ == "__main__":
    main()
