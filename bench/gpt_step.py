"""The small GPT training step (bench/models.py `gpt`: d256, 4 layers, T128, B8, AdamW) in one run:
PyTorch CPU eager against neuron compiled, adaptive eager and eager: min and median of 6 steps (`--steps`) after 3
warm-up steps.
"neuron compiled" is torch.compile(model) with the defaults: the loss and AdamW's foreach ops, outside the
compiled graphs, are queued and fused by adaptive eager; "neuron compiled+opt" compiles the optimizer step
too (`torch.compile(optimizer.step)`); "neuron graph" captures the whole eager step once (torch.neuron.graph,
AdamW capturable) and replays it, "neuron compiled+graph" the step with the model compiled; "neuron eager"
runs every op on its own.

    python -m bench.gpt_step              # the step
    python -m bench.gpt_step --products   # its matrix products alone: torch against a bare jax.jit

`--products` times the step's kinds of matrix product at its sizes (attention's, batched over batch x heads,
and the layers' two-dimensional ones with their weight gradients) in PyTorch and as a bare `jax.jit`
(what XLA does with the product alone). Run it on an otherwise idle machine.
"""
import argparse

import jax
import jax.numpy as jnp
import torch

import torchneuron  # noqa: F401

from .models import _step_fns, adaptive_for, gpt
from .timing import measure

CONFIGS = [("cpu", "eager"), ("neuron", "compiled"), ("neuron", "compiled+opt"), ("neuron", "compiled+graph"),
           ("neuron", "graph"), ("neuron", "adaptive"), ("neuron", "eager")]


def step_ms(train, device: str, steps: int) -> tuple:
    """(min, median) ms of `steps` steps after 3 warm-up steps."""
    timing = measure(train, device, inner=1, repeats=steps, warmup=3)
    return 1000 * timing["min"], 1000 * timing["median"]


# (name, product, its operands' shapes): the GPT's B8 x H4 heads of T128 x D64, and its d256 layers over B*T rows
PRODUCTS = [
    ("attention scores q @ k^T", lambda a, b: a @ b.mT, (32, 128, 64), (32, 128, 64)),
    ("attention output p @ v", lambda a, b: a @ b, (32, 128, 128), (32, 128, 64)),
    ("attention gradient p^T @ dO", lambda a, b: a.mT @ b, (32, 128, 128), (32, 128, 64)),
    ("the scores' FLOPs as one 2-D product", lambda a, b: a @ b, (4096, 64), (64, 128)),
    ("linear x @ W^T", lambda a, b: a @ b.mT, (1024, 256), (256, 256)),
    ("MLP up x @ W^T", lambda a, b: a @ b.mT, (1024, 256), (1024, 256)),
    ("linear weight gradient dY^T @ x", lambda a, b: a.mT @ b, (1024, 256), (1024, 256)),
    ("MLP down weight gradient dY^T @ x", lambda a, b: a.mT @ b, (1024, 256), (1024, 1024)),
]


def products(calls: int = 50) -> None:
    print("| product | shapes | torch ms | bare jax.jit ms | jax / torch |\n|---|---|---:|---:|---:|")
    for name, product, a_shape, b_shape in PRODUCTS:
        a, b = torch.randn(a_shape), torch.randn(b_shape)
        ja, jb = jnp.asarray(a.numpy()), jnp.asarray(b.numpy())
        jitted = jax.jit(product)
        t = measure(lambda: product(a, b), "cpu", inner=1, repeats=calls, warmup=3)["min"]
        j = measure(lambda: jitted(ja, jb), "cpu", inner=1, repeats=calls, warmup=3, wait=jax.block_until_ready)["min"]
        print(f"| {name} | {list(a_shape)} {list(b_shape)} | {1000 * t:.3f} | {1000 * j:.3f} | {j / t:.2f}x |",
              flush=True)


def steps(count: int) -> None:
    results = {}
    print("| step | min ms | vs CPU eager | median ms | vs CPU eager |\n|---|---:|---:|---:|---:|")
    for device, mode in CONFIGS:
        with torch.neuron.adaptive_eager(adaptive_for(mode)):
            train, _, _ = _step_fns(lambda: gpt(False), device, mode)
            results[device, mode] = best, median = step_ms(train, device, count)
        cpu_best, cpu_median = results["cpu", "eager"]
        print(f"| {device} {mode} | {best:.1f} | {best / cpu_best:.2f}x | {median:.1f} | {median / cpu_median:.2f}x |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--products", action="store_true", help="the step's matrix products alone")
    # on XLA:CPU a step's programs take from 0.8x to 2x their best time from one step to the next (the CPU's own
    # eager step varies far less): the median of many steps says as much as the minimum
    parser.add_argument("--steps", type=int, default=6, help="steps timed per configuration (min and median)")
    args = parser.parse_args()
    if args.products:
        products()
    else:
        steps(args.steps)


if __name__ == "__main__":
    main()
