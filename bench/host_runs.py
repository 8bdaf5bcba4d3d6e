"""What an op run on the host costs: the CPU fallback and host bookkeeping (eager/host_run.py).

    python -m bench.host_runs

Each figure is µs per call, the minimum over repeats of wall-clock time (a host run waits for the device to read
its inputs, which thread CPU time would not count), with the same op run on neuron (compiled, op by op) and by
PyTorch's CPU kernel for scale:

- "fallback": the op forced to the CPU (`torchneuron.library.force_cpu`), as an op without a lowering runs;
- "host bookkeeping": an int64 `cat` growing by one element per call, as generate()'s token ids do, which
  host bookkeeping keeps on the host (bench.generate measures its effect on generation).
"""
import argparse
import itertools
import warnings

import torch

import torchneuron  # noqa: F401

from .timing import measure

aten = torch.ops.aten


def fallback_cases(device: str) -> dict:
    x, y = torch.rand(64, device=device), torch.rand(64, device=device)
    out = torch.empty(64, device=device)
    rows = torch.rand(16, 16, device=device)
    index, source = torch.tensor([0, 3, 5], device=device), torch.rand(3, 16, device=device)
    return {
        "add 64": (aten.add.Tensor, lambda: torch.add(x, y)),
        "add_ 64 (in place)": (aten.add_.Tensor, lambda: x.add_(y)),
        "add 64, out=": (aten.add.out, lambda: torch.add(x, y, out=out)),
        "cat of three 64": (aten.cat.default, lambda: torch.cat([x, y, x])),
        "index_add_ on a view": (aten.index_add_.default, lambda: rows[1:].index_add_(0, index, source)),
    }


def _growing_cat(device: str):
    ids = [torch.zeros(1, 8, dtype=torch.int64, device=device)]
    token = torch.ones(1, 1, dtype=torch.int64, device=device)
    lengths = itertools.count()

    def grow():
        ids[0] = torch.cat([ids[0], token], dim=-1)
        if next(lengths) % 256 == 255:  # bounded, as a generate() call is
            ids[0] = ids[0][:, :8].clone()

    return grow


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    timing = {"inner": args.calls, "repeats": args.repeats}
    rows = []
    on_device, on_cpu = fallback_cases("neuron"), fallback_cases("cpu")
    for name, (op, fn) in on_device.items():
        with torch.neuron.adaptive_eager(False), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the fallback's, once per op
            compiled = measure(fn, "neuron", **timing)["min"]
            torchneuron.library.force_cpu(op)
            try:
                host = measure(fn, "neuron", **timing)["min"]
            finally:
                torchneuron.library.force_cpu(op, False)
        rows.append((f"fallback: {name}", host, compiled, measure(on_cpu[name][1], "cpu", **timing)["min"]))
    with torch.neuron.adaptive_eager(False):
        host = measure(_growing_cat("neuron"), "neuron", **timing)["min"]
        with torch.neuron.host_bookkeeping(False):
            # a new length each call, compiled: the growing ids' cost without host bookkeeping
            compiled = measure(_growing_cat("neuron"), "neuron", inner=20, repeats=2)["min"]
    rows.append(("host bookkeeping: growing int64 cat", host, compiled,
                 measure(_growing_cat("cpu"), "cpu", **timing)["min"]))
    print("| op | on the host, us | on neuron, us | torch cpu, us |")
    print("|---|---:|---:|---:|")
    for name, host, compiled, cpu in rows:
        print(f"| {name} | {host * 1e6:.1f} | {compiled * 1e6:.1f} | {cpu * 1e6:.1f} |")
    return rows


if __name__ == "__main__":
    main()
