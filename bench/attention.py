"""Fused (blockwise) scaled dot product attention against the math path on neuron, in one run.

    python -m bench.attention                 # B1 H8 D64 float32 causal, S 1024 and 2048 (minutes)
    python -m bench.attention --smoke         # tiny sizes, one repeat: checks that every variant runs
    python -m bench.attention --json FILE     # also write the rows as JSON

For each sequence length, mode (eager, compiled) and path (fused: the default; math:
`sdpa_kernel(SDPBackend.MATH)`): the best of several timings of the forward (no grad) and of the
forward+backward, and two memory figures of forward+backward: the peak of tensors allocated on the
device (`torch.neuron.max_memory_allocated()`, inputs and gradients included) and the largest
temporary memory XLA reserves inside one of the programs the step ran (buffers no tensor holds:
the fused lowering's blocks, a compiled math graph's score matrix). Each configuration starts from
empty executable caches, so its programs are compiled, and measured, afresh.
"""
import argparse
import contextlib
import json
import os

import torch
import torch.nn.functional as F
from jax._src.interpreters import pxla
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.timing import measure
from torchneuron.compile import neuron_backend
from torchneuron.runtime.cache import eager_cache

FULL = dict(batch=1, heads=8, dim=64, lengths=(1024, 2048), repeats=5)
SMOKE = dict(batch=1, heads=2, dim=16, lengths=(64,), repeats=1)
MiB = 2**20
PATHS = {"fused": SDPBackend.OVERRIDEABLE, "math": SDPBackend.MATH}


@contextlib.contextmanager
def program_temporaries():
    """Collects the temporary bytes of every XLA program compiled within the block. JAX offers no public
    hook on the programs `jit` compiles: this wraps its private compile step (checked on jax 0.10)."""
    compile_program = pxla.MeshComputation.compile
    seen = []

    def compile_and_record(self, *args, **kwargs):
        executable = compile_program(self, *args, **kwargs)
        seen.append(executable.xla_executable.get_compiled_memory_stats().temp_size_in_bytes)
        return executable

    pxla.MeshComputation.compile = compile_and_record
    try:
        yield seen
    finally:
        pxla.MeshComputation.compile = compile_program


def _fresh() -> None:
    eager_cache.clear()
    torch._dynamo.reset()


def run_config(sizes, length, mode, path) -> dict:
    shape = (sizes["batch"], sizes["heads"], length, sizes["dim"])
    q, k, v = (torch.randn(shape, device="neuron", requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, device="neuron")

    def forward(q, k, v):
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward_backward(q, k, v, grad):
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    if mode == "compiled":
        forward, forward_backward = (torch.compile(f, backend=neuron_backend) for f in (forward, forward_backward))
    with sdpa_kernel(PATHS[path]):
        _fresh()
        torch.neuron.synchronize()
        torch.neuron.reset_peak_memory_stats()
        with program_temporaries() as temporaries:
            forward_backward(q, k, v, grad)
            torch.neuron.synchronize()
        peak = torch.neuron.max_memory_allocated()
        timings = {}
        steps = {"forward": lambda: forward(q, k, v), "forward+backward": lambda: forward_backward(q, k, v, grad)}
        for name, fn in steps.items():
            timings[name] = measure(fn, "neuron", inner=1, repeats=sizes["repeats"], warmup=1)["min"]
    return {"S": length, "mode": mode, "path": path, "forward_ms": 1000 * timings["forward"],
            "forward_backward_ms": 1000 * timings["forward+backward"], "peak_tensors_mib": peak / MiB,
            "largest_program_temporaries_mib": max(temporaries, default=0) / MiB}


def table(rows) -> str:
    lines = ["| S | mode | path | forward ms | fwd+bwd ms | peak tensors MiB | largest XLA temporaries MiB |",
             "| ---: | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['S']} | {r['mode']} | {r['path']} | {r['forward_ms']:.1f} | {r['forward_backward_ms']:.1f} "
                     f"| {r['peak_tensors_mib']:.0f} | {r['largest_program_temporaries_mib']:.0f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    sizes = SMOKE if args.smoke else FULL
    os.environ["TORCHNEURON_COMPILE_CACHE"] = "0"  # a program loaded from disk is not compiled, so not measured
    rows = []
    for length in sizes["lengths"]:
        for mode in ("eager", "compiled"):
            for path in PATHS:
                rows.append(run_config(sizes, length, mode, path))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sizes": sizes, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
