"""Fixed cost per op for small tensors: neuron eager vs PyTorch eager vs a bare jax.jit call."""
import itertools

import jax
import jax.numpy as jnp
import torch

from .timing import measure


def torch_cases(device):
    a = torch.randn(16, 16, device=device)
    b = torch.randn(16, 16, device=device)
    chain = [a]
    calls = itertools.count()

    def two_ops():  # each result feeds the next call, as in real code
        chain[0] = chain[0] * 0.5 + b

    return {
        "add 16x16": lambda: a + b,
        "mul 16x16": lambda: a * b,
        "matmul 16x16": lambda: a @ b,
        "view (transpose)": lambda: a.t(),
        "in-place add_": lambda: a.add_(1.0),
        # an optimizer's step size or bias correction: a number never seen before
        "add_(b, alpha=new number)": lambda: a.add_(b, alpha=_new_number(calls)),
        "y = y * 0.5 + b (2 ops)": two_ops,
    }


def _new_number(calls) -> float:
    return 1e-3 / (1 + next(calls))


def jax_cases():
    a = jnp.ones((16, 16), jnp.float32)
    b = jnp.ones((16, 16), jnp.float32)
    add, mul, matmul = jax.jit(jnp.add), jax.jit(jnp.multiply), jax.jit(jnp.matmul)
    transpose = jax.jit(jnp.transpose)
    add_scaled = jax.jit(lambda x, y, alpha: x + alpha * y)
    chain = [a]
    calls = itertools.count()

    def two_ops():
        chain[0] = add(mul(chain[0], 0.5), b)
        return chain[0]

    return {
        "add 16x16": lambda: add(a, b),
        "mul 16x16": lambda: mul(a, b),
        "matmul 16x16": lambda: matmul(a, b),
        "view (transpose)": lambda: transpose(a),
        "in-place add_": lambda: add(a, 1.0),
        "add_(b, alpha=new number)": lambda: add_scaled(a, b, _new_number(calls)),
        "y = y * 0.5 + b (2 ops)": two_ops,
    }


def _transfer_cases(device, size_bytes):
    host = torch.randn(size_bytes // 4)
    on_device = host.to(device)
    return {
        f"to({device}) {_human(size_bytes)}": (lambda: host.to(device), device),
        f".cpu() {_human(size_bytes)}": (lambda: on_device.cpu(), device),
    }


def _human(n):
    return f"{n // 2**20} MiB" if n >= 2**20 else f"{n} B"


def run(device: str, smoke: bool, baseline: str = "cpu") -> list:
    inner, repeats = (20, 3) if smoke else (2000, 7)
    rows = []
    reference = torch_cases(baseline)
    ours = torch_cases(device)
    bare = jax_cases()
    for name in ours:
        row = {"benchmark": name, "unit": "us/op"}
        with torch.neuron.adaptive_eager(False):  # op by op
            row[device] = measure(ours[name], device, inner=inner, repeats=repeats)["median"] * 1e6
        with torch.neuron.adaptive_eager():  # the same calls queued and run as fused executables
            row[f"{device} adaptive"] = measure(ours[name], device, inner=inner, repeats=repeats)["median"] * 1e6
        row[f"torch {baseline}"] = measure(reference[name], baseline, inner=inner, repeats=repeats)["median"] * 1e6
        row["bare jax.jit"] = measure(bare[name], "cpu", inner=inner, repeats=repeats,
                                      wait=lambda result: result.block_until_ready())["median"] * 1e6
        rows.append(row)
    for size in (64, 64 * 2**20):
        transfers_inner = max(1, inner // 100) if size > 2**20 else inner // 4
        for name, (fn, dev) in _transfer_cases(device, size if not smoke else min(size, 2**20)).items():
            stats = measure(fn, dev, inner=max(1, transfers_inner), repeats=repeats)
            rows.append({"benchmark": name, "unit": "us/op", device: stats["median"] * 1e6})
    return rows
