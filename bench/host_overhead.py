"""Host overhead: the share of a training step's time spent outside XLA executables.

    python -m bench.host_overhead            # the small GPT of bench/models.py (d256, 4 layers, T128, B8, AdamW)
    python -m bench.host_overhead --smoke    # tiny sizes: checks that it runs

Each step runs with a listener on torchneuron's events that waits for every executable it launches
(a cached eager op, a compiled graph, adaptive eager's fused queue) and adds up the time from its launch
to its results: the rest of the step is the host's (Python, dispatch, tracing nothing new). Waiting
serialises host and device, so the step is slower than unobserved; the share is what overlapping
could at best hide. Run it on an otherwise idle machine.

"host work" is the same step (every op and tensor) at sizes whose compute is negligible, unobserved: the
host's own work with the device idle. On XLA:CPU the host time between executables at full size is
larger, as the device's computations share the host's cores, caches and memory allocator.

Modes: "compiled" is what a user gets from torch.compile(model) with the defaults: the model's graphs
compiled, the loss and AdamW's foreach ops queued and fused by adaptive eager; "compiled, adaptive off"
runs those ops one executable each; "compiled+opt" compiles the optimizer step too
(`torch.compile(optimizer.step)`); "graph" replays the whole eager step captured once (torch.neuron.graph),
"compiled+graph" the step with the model compiled;
"adaptive" and "eager" leave the model uncompiled.
"""
import argparse
import time

import torch

import torchneuron  # noqa: F401
from torchneuron.runtime import events

from .models import _step_fns, gpt
from . import timing


class ExecutableTime:
    """A listener adding up the time of executables' runs (cache hits only: steady state)."""

    wants_device_time = True

    def __init__(self):
        self.seconds = 0.0

    def begin(self, kind, name, details):
        return kind, time.perf_counter()

    def end(self, token, details):
        kind, start = token
        if kind in ("launch", "flush", "graph_replay") and details.get("cache") != "miss":
            self.seconds += time.perf_counter() - start

    def instant(self, kind, name, details):
        return None


# (model, adaptive eager for the rest of the step: the optimizer's ops); the default is adaptive eager on
MODES = {"compiled": ("compiled", True), "compiled, adaptive off": ("compiled", False),
         "compiled+opt": ("compiled+opt", True), "compiled+graph": ("compiled+graph", True),
         "graph": ("graph", True),
         "adaptive": ("eager", True), "eager": ("eager", False)}


def measure(mode: str, smoke: bool, steps: int) -> dict:
    model_mode, adaptive = MODES[mode]
    with torch.neuron.adaptive_eager(adaptive):
        train, _, _ = _step_fns(lambda: gpt(smoke), "neuron", model_mode)
        for _ in range(3):  # compiles, then the steady state
            train()
        torch.neuron.synchronize()
        timing.no_compile_running("neuron")
        listener = ExecutableTime()
        events.listen(listener)
        try:
            start = time.perf_counter()
            for _ in range(steps):
                train()
            torch.neuron.synchronize()
            total = time.perf_counter() - start
        finally:
            events.stop_listening(listener)
        small_train = _step_fns(lambda: gpt(smoke, negligible=True), "neuron", model_mode)[0]
        host_work = timing.measure(small_train, "neuron", inner=1, repeats=3 * steps, warmup=3)["min"]
    return {"mode": mode, "step_ms": 1000 * total / steps, "in_executables_ms": 1000 * listener.seconds / steps,
            "host_share": 1 - listener.seconds / total, "host_work_ms": 1000 * host_work}



def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)
    print("| mode | step ms (observed) | in executables ms | host share | host work ms |")
    print("|---|---:|---:|---:|---:|")
    for mode in MODES:
        row = measure(mode, args.smoke, 2 if args.smoke else args.steps)
        print(f"| {row['mode']} | {row['step_ms']:.1f} | {row['in_executables_ms']:.1f} | {row['host_share']:.1%} "
              f"| {row['host_work_ms']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
