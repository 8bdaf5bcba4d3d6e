"""Big-op throughput: matmul GFLOP/s (fp32, bf16) and elementwise memory bandwidth."""
import jax
import jax.numpy as jnp
import torch

from .timing import measure


def _matmul_rows(device, baseline, n, repeats):
    rows = []
    flops = 2 * n**3
    for dtype in (torch.float32, torch.bfloat16):
        row = {"benchmark": f"matmul {n}x{n} {str(dtype).replace('torch.', '')}", "unit": "GFLOP/s"}
        for target in (device, baseline):
            a = torch.randn(n, n, dtype=dtype, device=target)
            label = f"torch {baseline}" if target == baseline else target
            row[label] = flops / measure(lambda: a @ a, target, inner=2, repeats=repeats)["median"] / 1e9
        x = jnp.ones((n, n), jnp.float32 if dtype == torch.float32 else jnp.bfloat16)
        matmul = jax.jit(jnp.matmul)
        row["bare jax.jit (peak proxy)"] = flops / measure(
            lambda: matmul(x, x), "cpu", inner=2, repeats=repeats, wait=lambda r: r.block_until_ready())["median"] / 1e9
        rows.append(row)
    return rows


def _bandwidth_row(device, baseline, numel, repeats):
    row = {"benchmark": f"elementwise x*2+1 over {numel * 4 // 2**20} MiB fp32", "unit": "GB/s"}
    moved = 2 * numel * 4  # read once, write once
    for target in (device, baseline):
        a = torch.randn(numel, device=target)
        label = f"torch {baseline}" if target == baseline else target
        row[label] = moved / measure(lambda: a * 2 + 1, target, inner=3, repeats=repeats)["median"] / 1e9
    return row


def run(device: str, smoke: bool, baseline: str = "cpu") -> list:
    n, numel, repeats = (128, 2**16, 2) if smoke else (2048, 2**25, 5)
    return _matmul_rows(device, baseline, n, repeats) + [_bandwidth_row(device, baseline, numel, repeats)]
