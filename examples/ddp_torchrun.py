"""Data-parallel training on neuron devices with torchrun.

    torchrun --nproc-per-node 2 examples/ddp_torchrun.py

Each process trains on `neuron:LOCAL_RANK` (one device per process; see docs/distributed.md for
the device mapping and multi-node launches).
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def main(steps: int = 20) -> None:
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    torch.neuron.set_device(device)  # under torchrun this is already the process's own device
    dist.init_process_group("neuron", device_id=device)  # as CUDA code binds its group to the device
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1)).to(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1234)
    for step in range(steps):
        x = torch.randn(16 * world, 32, generator=generator)
        y = x.sum(dim=1, keepdim=True).sin()
        mine = slice(rank * 16, (rank + 1) * 16)  # each rank its share of the global batch
        loss = F.mse_loss(model(x[mine].to(device)), y[mine].to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        dist.all_reduce(loss := loss.detach(), op=dist.ReduceOp.AVG)
        if rank == 0 and (step % 5 == 0 or step == steps - 1):
            print(f"step {step:2d}  loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
