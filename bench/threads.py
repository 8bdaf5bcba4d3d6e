"""Threads running eager inference loops of their own, on neuron (adaptive eager) and on the CPU.

    python -m bench.threads                # 2 threads x 300 steps of a small MLP, and the same steps in one thread
    python -m bench.threads --steps 20     # a quick check

Each thread runs its own model, a step each iteration, without reading a value until the end: what a
server answering requests in threads does. Adaptive eager keeps a queue per thread; the figures say how
often the queues ran and how many ops ran fused. Each configuration runs twice to compile and is timed on
its third run (wall clock: the threads overlap).
"""
import argparse
import json
import threading
import time

import torch
import torch.nn as nn


def _loop(device: str, steps: int, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32)).to(device)
    x = torch.randn(8, 32, device=device)
    with torch.no_grad():
        for _ in range(steps):
            x = model(x).tanh()
    return x.cpu()


def _run(device: str, threads: int, steps: int) -> float:
    """Seconds for `threads` threads of `steps` steps each (threads == 0: the same work in the calling thread)."""
    start = time.perf_counter()
    if threads == 0:
        for seed in range(2):
            _loop(device, steps, seed)
    else:
        workers = [threading.Thread(target=_loop, args=(device, steps, seed)) for seed in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    from torchneuron.eager import adaptive

    rows = []
    for device in ("neuron", "cpu"):
        for threads in (0, 2):
            for _ in range(2):  # a queue's structure runs op by op when first seen, and compiles when seen again
                _run(device, threads, args.steps)
            before = adaptive.stats()
            seconds = _run(device, threads, args.steps)
            after = adaptive.stats()
            row = {"device": device, "threads": threads or "1 (both loops)", "seconds": round(seconds, 3)}
            if device == "neuron":
                row |= {k: after[k] - before[k] for k in ("flushes", "ops_fused", "first_sightings")}
            rows.append(row)
            print(row, flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
