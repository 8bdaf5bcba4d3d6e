"""Fixed cost per small op as CPU time of the calling thread, robust to a busy machine.

    python -m bench.fixed_cost

Wall-clock medians (bench.run's micro section) move with whatever else runs on the machine; the
minimum thread CPU time over many repeats does much less, so it is how before/after comparisons of
the eager fast path are made. Each figure is µs per call, min over `--repeats` runs of `--calls`
calls; ratios are within this one run. "neuron graph" replays the op captured in a graph (torch.neuron.graph):
the host cost of one program launch from a graph, for ops that take no new number at each call.
"""
import argparse

import torch

import torchneuron  # noqa: F401

from .micro import jax_cases, torch_cases
from .timing import thread_time_per_call


# the micro benchmark's ops whose fixed cost the fast-path work is judged by
OPS = ("add 16x16", "mul 16x16", "in-place add_", "add_(b, alpha=new number)")


# the ops a graph replays as they are: a new number at each call would be a constant of the captured graph
CAPTURED = ("add 16x16", "mul 16x16", "in-place add_")


def _captured(fn):
    """`fn`'s op captured in a graph (torch.neuron.graph): each call replays it."""
    graph = torch.neuron.NeuronGraph()
    with torch.neuron.graph(graph):
        fn()
    graph.replay()
    return graph.replay


def _cases(all_cases: dict) -> dict:
    return {name: all_cases[name] for name in OPS}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    columns = {
        "neuron": _cases(torch_cases("neuron")),
        "bare jax.jit": _cases(jax_cases()),
        "torch cpu": _cases(torch_cases("cpu")),
    }
    rows = {name: {} for name in columns["neuron"]}
    with torch.neuron.adaptive_eager(False):
        for column, cases in columns.items():
            for name, fn in cases.items():
                rows[name][column] = thread_time_per_call(fn, args.calls, args.repeats)
    with torch.neuron.adaptive_eager():
        for name, fn in _cases(torch_cases("neuron")).items():
            rows[name]["neuron adaptive"] = thread_time_per_call(fn, args.calls, args.repeats)
        torch.neuron.synchronize()
    for name, fn in _cases(torch_cases("neuron")).items():
        if name in CAPTURED:
            rows[name]["neuron graph"] = thread_time_per_call(_captured(fn), args.calls, args.repeats)
    torch.neuron.synchronize()
    order = ["neuron", "neuron adaptive", "neuron graph", "bare jax.jit", "torch cpu"]
    print("| op | " + " | ".join(order) + " | neuron / bare jax.jit | adaptive / bare jax.jit | graph / bare jax.jit |")
    print("|---" * (len(order) + 4) + "|")
    for name, row in rows.items():
        cells = [f"{row[c]:.2f}" if c in row else "n/a" for c in order]
        ratios = [f"{row[c] / row['bare jax.jit']:.2f}" if c in row else "n/a"
                  for c in ("neuron", "neuron adaptive", "neuron graph")]
        print(f"| {name} | " + " | ".join(cells + ratios) + " |")
    return rows


if __name__ == "__main__":
    main()
