"""The small GPT training step (bench/models.py `gpt`: d256, 4 layers, T128, B8, AdamW) in one run:
PyTorch CPU eager against neuron compiled, adaptive eager and eager, min of 6 steps after 3 warm-up steps.
"neuron compiled" is torch.compile(model) with the defaults: the loss and AdamW's foreach ops, outside the
compiled graphs, are queued and fused by adaptive eager; "neuron compiled+opt" compiles the optimizer step
too (`torch.compile(optimizer.step)`); "neuron eager" runs every op on its own.

    python -m bench.gpt_step

Run it on an otherwise idle machine.
"""

import torch

import torchneuron  # noqa: F401

from .models import _step_fns, adaptive_for, gpt
from .timing import measure

CONFIGS = [("cpu", "eager"), ("neuron", "compiled"), ("neuron", "compiled+opt"), ("neuron", "adaptive"),
           ("neuron", "eager")]


def best_ms(train, device: str, steps: int = 6) -> float:
    return 1000 * measure(train, device, inner=1, repeats=steps, warmup=3)["min"]


def main() -> None:
    results = {}
    print("| step | ms | vs CPU eager |\n|---|---:|---:|")
    for device, mode in CONFIGS:
        with torch.neuron.adaptive_eager(adaptive_for(mode)):
            train, _, _ = _step_fns(lambda: gpt(False), device, mode)
            results[device, mode] = ms = best_ms(train, device)
        print(f"| {device} {mode} | {ms:.1f} | {ms / results['cpu', 'eager']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
