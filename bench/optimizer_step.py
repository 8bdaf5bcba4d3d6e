"""Host cost of an optimizer step: AdamW over many small parameters, as CPU time of the calling thread.

    python -m bench.optimizer_step                  # 52 parameters of 8x8, as the small GPT's AdamW at negligible sizes
    python -m bench.optimizer_step --parameters 200

A user of `torch.compile(model)` runs the optimizer step eagerly (adaptive eager queues and fuses its foreach
ops): it is most of the host work left outside the compiled graphs (bench.host_overhead). Small parameters keep
the device's part negligible, so the figure is the host's: PyTorch's optimizer code, each foreach op's dispatch
over every parameter, and the queue's run. Min over repeats, µs per step; PyTorch CPU eager for scale.
"""
import argparse

import torch

import torchneuron  # noqa: F401

from .timing import no_compile_running, thread_time_per_call


def _step(device: str, parameters: int, **options):
    torch.manual_seed(0)
    params = [torch.randn(8, 8, device=device, requires_grad=True) for _ in range(parameters)]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-3, **options)

    def step():
        optimizer.step()
        if device == "neuron":
            torch.neuron.synchronize()

    return step


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parameters", type=int, default=52)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    rows = {}
    for implementation, options in (("foreach", {"foreach": True}), ("fused", {"fused": True})):
        for column, device, adaptive in (("neuron adaptive", "neuron", True), ("neuron eager", "neuron", False),
                                         ("torch cpu", "cpu", False)):
            with torch.neuron.adaptive_eager(adaptive):
                step = _step(device, args.parameters, **options)
                for _ in range(5):  # compiles, then the fused queue's steady state
                    step()
                no_compile_running(device)
                rows.setdefault(implementation, {})[column] = thread_time_per_call(step, args.calls, args.repeats)
    columns = ["neuron adaptive", "neuron eager", "torch cpu"]
    print(f"| AdamW, {args.parameters} parameters of 8x8 | " + " | ".join(columns) + " | adaptive / cpu |")
    print("|---" * (len(columns) + 2) + "|")
    for name, row in rows.items():
        cells = [f"{row[c]:.0f}" for c in columns]
        print(f"| {name} | " + " | ".join(cells) + f" | {row['neuron adaptive'] / row['torch cpu']:.2f} |")
    return rows


if __name__ == "__main__":
    main()
