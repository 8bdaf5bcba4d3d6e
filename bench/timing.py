"""Timing helpers: repeats with min/median, device-honest synchronisation, fresh processes."""
import json
import os
import statistics
import subprocess
import sys
import time

import torch


def sync(device: str) -> None:
    kind = torch.device(device).type
    if kind == "neuron":
        torch.neuron.synchronize()
    elif kind == "cuda":
        torch.cuda.synchronize()


def no_compile_running(device: str) -> None:
    """After warm-up: on neuron, no compile left running beside the timed calls (adaptive eager runs a recurring
    queue fused from its third sighting, its program compiled ahead on a compile thread from the second).
    Imported here: a process timing without torchneuron (bench.dispatch_floor's plain tensor) must not load it."""
    if torch.device(device).type == "neuron":
        from torchneuron.runtime.program import wait_for_compiles

        wait_for_compiles()


def measure(fn, device: str, *, inner: int, repeats: int, warmup: int = 2, wait=None) -> dict:
    """Per-call seconds of `fn` (called `inner` times per repeat, synchronised at the end of each repeat).

    `wait(last_result)` replaces the device synchronisation (for bare JAX calls)."""
    finish = wait or (lambda _: sync(device))
    for _ in range(warmup):
        result = fn()
    finish(result)
    no_compile_running(device)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            result = fn()
        finish(result)
        samples.append((time.perf_counter() - start) / inner)
    return {"min": min(samples), "median": statistics.median(samples), "repeats": repeats, "inner": inner}


def thread_time_per_call(fn, calls: int, repeats: int) -> float:
    """µs of the calling thread's CPU time per call of `fn`, min over `repeats` runs of `calls` calls."""
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - start) / calls)
    return best * 1e6


def in_own_process(module: str, args, **env):
    """What `python -m module *args` prints last, as JSON, run in a fresh process whose environment adds `env`."""
    done = subprocess.run([sys.executable, "-m", module, *map(str, args)], env={**os.environ, **env},
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])
