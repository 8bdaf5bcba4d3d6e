"""A loop writing a cache at a new position each iteration (`cache[:, i] = new * 2`, then a read of
that position), as hand-written decoding loops do: mean ms per iteration over positions never seen,
on neuron (eager and adaptive) against the CPU, in one run.

    python -m bench.position_writes [--positions 64]

Each position is a view at a new storage offset; the signature's second offset builds one program
that takes offsets as arguments, so later positions compile nothing. Run it on an otherwise idle machine,
with an empty cache (TORCHNEURON_CACHE_DIR=$(mktemp -d)) for a cold start's figures. On the 2-core
machine, 64 positions, cold: neuron eager 8.1 ms and adaptive 5.7 ms per position (160 and 171 ms
before offsets were arguments: a compile per position), CPU 0.02 ms.
"""
import argparse
import time

import torch

import torchneuron  # noqa: F401


def ms_per_position(device: str, positions: int, width: int) -> float:
    cache = torch.zeros(8, positions, width, device=device)
    new = torch.randn(positions, 8, width, device=device)
    total = torch.zeros((), device=device)
    start = time.perf_counter()
    for i in range(positions):
        cache[:, i] = new[i] * 2
        total += cache[:, i].sum()
    total.item()
    return 1000 * (time.perf_counter() - start) / positions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--positions", type=int, default=64)
    args = parser.parse_args()
    print("| loop | ms per new position |\n|---|---:|")
    # each configuration its own width: its signatures are new, as in a fresh process
    for width, (device, adaptive) in enumerate([("cpu", False), ("neuron", False), ("neuron", True)], 16):
        with torch.neuron.adaptive_eager(adaptive):
            ms = ms_per_position(device, args.positions, width)
        print(f"| {device}{' adaptive' if adaptive else ''} | {ms:.2f} |", flush=True)


if __name__ == "__main__":
    main()
