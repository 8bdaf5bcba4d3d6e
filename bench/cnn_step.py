"""The small CNN training step (bench/models.py `cnn`: two conv/BN/ReLU/pool blocks and a linear layer, batch 32,
3x32x32, AdamW): PyTorch CPU eager against neuron compiled, in one run, and its convolutions alone.
Neuron runs with the defaults: the model compiled, the loss and AdamW's ops fused by adaptive eager.

    python -m bench.cnn_step               # the step: rounds of interleaved steps, min per round
    python -m bench.cnn_step --one-thread  # the same with one thread each (PyTorch's and XLA:CPU's)
    python -m bench.cnn_step --convs       # the convolutions: torch against a bare jax.jit
    python -m bench.cnn_step --ops         # the compiled step's XLA ops, by time (jax.profiler)

Each round runs each variant's steps in a row and keeps its fastest step, as wall-clock and as
process CPU time (all threads): CPU time stays steady when other processes share the cores, wall-clock
does not. With --one-thread both sides compute on one core, so the CPU-time ratio is the work ratio.
`--convs` times each convolution of the step (forward, input gradient, weight gradient) in torch and as
a bare `jax.jit` of `lax.conv_general_dilated` and its vjp (what XLA:CPU does with the op alone), and the
weight gradient as the lowering computes it on XLA:CPU. `--ops` lists the compiled step's XLA ops (fusions, by
their names in XLA's optimized HLO: `XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text` writes it), each
with its fastest time over the profiled steps. Run it on an otherwise idle machine.
"""
import argparse
import collections
import glob
import os
import sys
import tempfile
import time

ONE_THREAD = "--one-thread" in sys.argv
if ONE_THREAD:  # before JAX and PyTorch start their thread pools
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
    os.environ["OMP_NUM_THREADS"] = "1"

import jax  # noqa: E402
import torch  # noqa: E402
from jax import lax  # noqa: E402

from torchneuron.ops import nn as lowerings  # noqa: E402

from .models import _step_fns, cnn  # noqa: E402

VARIANTS = [("cpu", "eager"), ("neuron", "compiled")]
CONVS = [((32, 3, 32, 32), (32, 3, 3, 3)), ((32, 32, 16, 16), (64, 32, 3, 3))]  # the step's, stride 1, padding 1


def fastest(fns: dict, calls: int, wait) -> dict:
    """Each function's fastest of `calls` calls in a row (ms), as (wall-clock, process CPU time)."""
    best = {name: (float("inf"), float("inf")) for name in fns}
    for name, fn in fns.items():
        for _ in range(calls):
            wall, cpu = time.perf_counter(), time.process_time()
            wait(fn())
            wall, cpu = 1000 * (time.perf_counter() - wall), 1000 * (time.process_time() - cpu)
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return best


def steps(rounds: int, per_round: int) -> None:
    fns = {f"{device} {mode}": _step_fns(cnn, device, mode)[0] for device, mode in VARIANTS}
    fastest(fns, 3, lambda _: torch.neuron.synchronize())  # compiles, then warms up
    print("| round | CPU eager ms (CPU time) | neuron compiled ms (CPU time) | ratio wall | ratio CPU time |")
    print("|---|---:|---:|---:|---:|")
    for r in range(rounds):
        best = fastest(fns, per_round, lambda _: torch.neuron.synchronize())
        (cw, cc), (nw, nc) = best["cpu eager"], best["neuron compiled"]
        print(f"| {r + 1} | {cw:.1f} ({cc:.1f}) | {nw:.1f} ({nc:.1f}) | {nw / cw:.2f}x | {nc / cc:.2f}x |", flush=True)


def convs(calls: int) -> None:
    print("| convolution | torch ms | bare jax.jit ms | ratio | lowering on XLA:CPU ms | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for x_shape, w_shape in CONVS:
        x, w = torch.randn(x_shape), torch.randn(w_shape)
        grad = torch.randn(x_shape[0], w_shape[0], *x_shape[2:])
        jx, jw, jgrad = (jax.numpy.asarray(t.numpy()) for t in (x, w, grad))
        args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)

        def conv(a, b):
            return lax.conv_general_dilated(a, b, (1, 1), [(1, 1), (1, 1)], dimension_numbers=("NCHW", "OIHW", "NCHW"))

        def backward(mask):
            return lambda: torch.ops.aten.convolution_backward(grad, x, w, [w_shape[0]], *args, mask)

        rows = {
            "forward": (lambda: torch.nn.functional.conv2d(x, w, padding=1), jax.jit(conv), None),
            "input grad": (backward([True, False, False]),
                           jax.jit(lambda a, b, g: jax.vjp(lambda a: conv(a, b), a)[1](g)[0]), None),
            "weight grad": (backward([False, True, False]),
                            jax.jit(lambda a, b, g: jax.vjp(lambda b: conv(a, b), b)[1](g)[0]),
                            jax.jit(lambda a, b, g: lowerings._weight_grad(g, a, b, args))),
        }
        for name, (torch_fn, jax_fn, lowered) in rows.items():
            inputs = (jx, jw) if name == "forward" else (jx, jw, jgrad)
            fns = {"torch": torch_fn, "jax": lambda f=jax_fn: f(*inputs)}
            if lowered is not None:
                fns["lowered"] = lambda f=lowered: f(*inputs)
            best = fastest(fns, calls, jax.block_until_ready)
            key = 1 if ONE_THREAD else 0
            t, j = best["torch"][key], best["jax"][key]
            low = f"{best['lowered'][key]:.2f} | {best['lowered'][key] / t:.2f}x" if lowered is not None else "| "
            print(f"| {name} x{list(x_shape)} w{list(w_shape)} | {t:.2f} | {j:.2f} | {j / t:.2f}x | {low} |", flush=True)


def ops(steps: int, top: int = 25) -> None:
    train = _step_fns(cnn, "neuron", "compiled")[0]
    for _ in range(3):
        train()
    torch.neuron.synchronize()
    directory = tempfile.mkdtemp(prefix="cnn_step_trace_")
    jax.profiler.start_trace(directory)
    for _ in range(steps):
        train()
        torch.neuron.synchronize()
    jax.profiler.stop_trace()
    trace = glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True)[0]
    runs = collections.defaultdict(lambda: collections.defaultdict(float))  # (program, op) -> run -> ms
    for plane in jax.profiler.ProfileData.from_file(trace).planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if "hlo_op" in stats:
                    runs[stats["program_id"], stats["hlo_op"]][stats["run_id"]] += event.duration_ns / 1e6
    fastest_ms = {key: min(by_run.values()) for key, by_run in runs.items() if len(by_run) >= steps}
    per_program = collections.Counter()
    for (program, _), ms in fastest_ms.items():
        per_program[program] += ms
    for program, ms in per_program.most_common():
        if ms < 0.1:  # the optimizer's and the loss's eager ops
            break
        print(f"program {program}: {ms:.2f} ms (sum of its ops' fastest runs)")
    for (program, op), ms in sorted(fastest_ms.items(), key=lambda item: -item[1])[:top]:
        print(f"  {ms:6.2f} ms  program {program}  {op}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--one-thread", action="store_true", help="PyTorch and XLA:CPU on one thread each")
    parser.add_argument("--convs", action="store_true", help="the step's convolutions alone")
    parser.add_argument("--ops", action="store_true", help="the compiled step's XLA ops, by time")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if ONE_THREAD:
        torch.set_num_threads(1)
    if args.convs:
        convs(calls=30)
    elif args.ops:
        ops(steps=10)
    else:
        steps(args.rounds, per_round=8)


if __name__ == "__main__":
    main()
