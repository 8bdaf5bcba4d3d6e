"""What the profiler hooks cost per op: nothing listening, the doctor listening, torch.profiler running.

    python -m bench.profiler_overhead

A small op passes 4 hook sites when nothing listens (dispatch, the executable's launch, its output
storage's allocation, and a freed storage): each is `if events.listening:`. The first line measures
those 4 checks as thread CPU time (min over repeats, robust to a busy machine) against the same
function without them; the budget is 0.3 us per op. The rest is µs per `a + b` (16x16) as
bench.fixed_cost measures it, for scale.
"""
import argparse

import torch

import torchneuron  # noqa: F401
from torchneuron.profiler.collector import Collector
from torchneuron.runtime import events

from .timing import thread_time_per_call

SITES_PER_OP = 4
BUDGET_US = 0.3


def _guarded():
    if events.listening:
        pass
    if events.listening:
        pass
    if events.listening:
        pass
    if events.listening:
        pass


def _bare():
    pass


def guard_cost_us(calls: int, repeats: int) -> float:
    """The 4 checks an op passes, in µs: the difference of two functions that differ only by them."""
    return max(0.0, thread_time_per_call(_guarded, calls, repeats) - thread_time_per_call(_bare, calls, repeats))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    a = torch.randn(16, 16, device="neuron")
    b = torch.randn(16, 16, device="neuron")

    def add():
        return a + b

    add()
    rows = {"hook checks per op (nothing listening)": guard_cost_us(args.calls * 50, args.repeats)}
    rows["a + b, nothing listening"] = thread_time_per_call(add, args.calls, args.repeats)
    with Collector():
        rows["a + b, doctor listening (device time waited for)"] = thread_time_per_call(add, args.calls, args.repeats)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        rows["a + b, torch.profiler (CPU activity)"] = thread_time_per_call(add, args.calls // 4, args.repeats)
    print("| case | us per op |\n|---|---:|")
    for name, us in rows.items():
        print(f"| {name} | {us:.3f} |")
    within = rows["hook checks per op (nothing listening)"] <= BUDGET_US
    print(f"hook cost {'within' if within else 'OVER'} the {BUDGET_US} us budget")
    return rows


if __name__ == "__main__":
    main()
