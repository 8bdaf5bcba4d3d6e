"""Per-step time of a small transformer training step, and compiled-graph start-up from a cold and a warm cache.

    python bench/compile_step.py            # full run (minutes; run it on a quiet machine)
    python bench/compile_step.py --smoke    # tiny sizes, two steps: checks that every variant runs
    python bench/compile_step.py --startup  # only the cold and warm start-up
    python bench/compile_step.py --startup --breakdown  # and where the warm start-up's time goes

Variants: neuron compiled (backend="neuron"), neuron eager, CPU eager, CPU torch.compile (Inductor).
Start-up: a fresh process builds the model and runs one compiled step, first with an empty
TORCHNEURON_CACHE_DIR (cold: XLA compiles every graph), then again with the cache it left (warm).
The same again with the model's forward precompiled (`torch.compile(...).aot_compile`): the cold
process compiles it ahead of its step and saves it, the warm one loads it and traces nothing.
"""
import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn

# the function rather than backend="neuron": works before `pip install -e .` refreshes the entry points
from torchneuron.compile import neuron_backend

FULL = dict(batch=8, seq=64, d=128, heads=4, layers=2, warmup=3, steps=20)
SMOKE = dict(batch=2, seq=8, d=16, heads=2, layers=1, warmup=1, steps=2)


def make_model(sizes):
    layer = nn.TransformerEncoderLayer(sizes["d"], sizes["heads"], 4 * sizes["d"], dropout=0.1,
                                       activation="gelu", batch_first=True, norm_first=True)
    return nn.Sequential(nn.TransformerEncoder(layer, sizes["layers"], enable_nested_tensor=False),
                         nn.Linear(sizes["d"], sizes["d"]))


def _forward(model, x):
    return model(x)


def precompiled(model, x, path):
    """The model's forward as a precompiled function: loaded from `path`, else compiled ahead of time and
    saved there."""
    if os.path.exists(path):
        with open(path, "rb") as f:
            forward = torch.compiler.load_compiled_function(f)
    else:
        torch._dynamo.config.enable_aot_compile = True  # off by default in older PyTorch releases
        forward = torch.compile(_forward, backend=neuron_backend, fullgraph=True).aot_compile(((model, x), {}))
        forward.save_compiled_function(path)
    return functools.partial(forward, model)


def make_step(device, compiled, sizes, precompiled_path=None):
    torch.manual_seed(0)
    model = make_model(sizes).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(sizes["batch"], sizes["seq"], sizes["d"]).to(device)
    target = torch.randn(sizes["batch"], sizes["seq"], sizes["d"]).to(device)
    if precompiled_path is not None:
        forward = precompiled(model, x, precompiled_path)
    elif compiled:
        forward = torch.compile(model, backend=neuron_backend if device == "neuron" else "inductor")
    else:
        forward = model

    def step():
        loss = nn.functional.mse_loss(forward(x), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()  # waits for the device

    return step


def time_steps(step, sizes) -> dict:
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    for _ in range(sizes["warmup"]):
        step()
    start = time.perf_counter()
    for _ in range(sizes["steps"]):
        step()
    return {"first_step_s": first, "step_ms": 1000 * (time.perf_counter() - start) / sizes["steps"]}


def _timers() -> dict:
    """Wrap the start-up's stages in timers (seconds, summed over calls): Dynamo contains the backend, the backend
    AOTAutograd and the table; JAX lowering and XLA are parts of the graph and eager op programs."""
    import jax._src.compiler
    import jax._src.stages
    import torch._dynamo.convert_frame

    from torchneuron.compile import backend, executable
    from torchneuron.eager import executable as eager_executable

    seconds = {}
    stages = [
        (torch._dynamo.convert_frame, "_compile", "Dynamo (PyTorch): tracing the frame, backend inside"),
        (sys.modules[__name__], "neuron_backend", "our backend: AOTAutograd and the decomposition table"),
        (backend, "aot_module_simplified", "AOTAutograd (PyTorch)"),
        (backend, "decompositions", "core-ATen decomposition table (PyTorch's, filtered)"),
        (executable._Program, "__init__", "graph programs (at their first run): cache lookup, lower, compile"),
        (eager_executable.Executable, "__init__", "eager op programs: meta, trace"),
        (jax._src.stages.Traced, "lower", "JAX lowering (graphs and eager ops)"),
        (jax._src.compiler, "compile_or_get_cached", "XLA: compile, or load from JAX's persistent cache"),
    ]
    for owner, name, label in stages:
        def timed(*args, _fn=getattr(owner, name), _label=label, **kwargs):
            start = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                seconds[_label] = seconds.get(_label, 0.0) + time.perf_counter() - start
        setattr(owner, name, timed)
    return seconds


def startup(sizes, breakdown=False, precompiled_path=None) -> dict:
    """Run in a child process: build the model and time one compiled step."""
    seconds = _timers() if breakdown else {}
    start = time.perf_counter()
    loss = make_step("neuron", True, sizes, precompiled_path)()
    from torchneuron.compile import report

    return {"startup_s": time.perf_counter() - start, "loss": loss, **report(), "breakdown_s": seconds}


def child_startup(args, cache_dir, precompiled_path=None) -> dict:
    env = dict(os.environ, TORCHNEURON_CACHE_DIR=cache_dir)
    command = [sys.executable, __file__, "--child-startup"] + (["--smoke"] if args.smoke else []) + (
        ["--breakdown"] if args.breakdown else []) + (["--precompiled", precompiled_path] if precompiled_path else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and two steps")
    parser.add_argument("--startup", action="store_true", help="only the cold and warm start-up")
    parser.add_argument("--breakdown", action="store_true", help="time the start-up's stages")
    parser.add_argument("--child-startup", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--precompiled", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = SMOKE if args.smoke else FULL
    if args.child_startup:
        print(json.dumps(startup(sizes, args.breakdown, args.precompiled)))
        return
    results = {"sizes": sizes}
    variants = [("neuron compiled", "neuron", True), ("neuron eager", "neuron", False),
                ("cpu eager", "cpu", False), ("cpu inductor", "cpu", True)]
    for name, device, compiled in [] if args.startup else variants:
        results[name] = time_steps(make_step(device, compiled, sizes), sizes)
        print(f"{name:16s} step {results[name]['step_ms']:9.2f} ms   first step {results[name]['first_step_s']:7.2f} s",
              flush=True)
    for kind in ("", "precompiled, "):
        with tempfile.TemporaryDirectory() as cache_dir:
            path = os.path.join(cache_dir, "forward.bin") if kind else None
            for name in (f"{kind}cold cache", f"{kind}warm cache"):
                results[name] = child_startup(args, cache_dir, path)
                r = results[name]
                print(f"{name:29s} start-up {r['startup_s']:7.2f} s   dynamo_graphs {r['dynamo_graphs']}   "
                      f"xla_compiles {r['xla_compiles']}   disk_cache_hits {r['disk_cache_hits']}", flush=True)
                for stage, seconds in r["breakdown_s"].items():
                    print(f"    {stage:55s} {seconds:6.2f} s")
    cold = results["cold cache"]["startup_s"]
    print(f"warm / cold start-up {results['warm cache']['startup_s'] / cold:.2f}; precompiled: loaded / cold "
          f"{results['precompiled, warm cache']['startup_s'] / cold:.2f} (/ its own cold start-up "
          f"{results['precompiled, warm cache']['startup_s'] / results['precompiled, cold cache']['startup_s']:.2f})")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
