"""Single ops at working sizes: neuron eager (each call waited on) against PyTorch CPU eager, in one run.

    python -m bench.ops            # 1024x1024 float32 and friends (about a minute)
    python -m bench.ops --smoke    # tiny sizes, one repeat: checks that every op runs

The ops whose lowering chooses a formulation for speed (order statistics, running sums and extremes,
arg-extremes, sampling, counting, GELU) and the data-dependent ones: each row is the fastest of a few calls, in ms. Run it on an
otherwise idle machine.
"""
import argparse
import itertools

import torch
import torch.nn.functional as F

import torchneuron  # noqa: F401

from .timing import measure


def cases(rows: int, columns: int, vocab: int) -> dict:
    """name -> (op, its inputs on the CPU)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, columns, generator=generator)
    probabilities = torch.softmax(torch.randn(64, vocab, generator=generator), -1)
    thresholds = itertools.count(1.0, 0.001)
    return {
        "sort along rows": (lambda t: t.sort(1), x),
        "topk k=8 along rows": (lambda t: t.topk(8, 1), x),
        "topk k=50 of logits": (lambda t: t.topk(50, 1), probabilities),
        "kthvalue k=3 along rows": (lambda t: t.kthvalue(3, 1), x),
        "median along rows": (lambda t: t.median(1), x),
        "cumsum along rows": (lambda t: t.cumsum(1), x),
        "cumsum along columns": (lambda t: t.cumsum(0), x),
        "cumprod along rows": (lambda t: t.cumprod(1), x),
        "cummax along rows": (lambda t: t.cummax(1), x),
        "argmax along rows": (lambda t: t.argmax(1), x),
        "max with indices along rows": (lambda t: t.max(1), x),
        "multinomial, 1 draw per row": (lambda t: torch.multinomial(t, 1), probabilities),
        "multinomial, 8 draws with replacement": (lambda t: torch.multinomial(t, 8, replacement=True), probabilities),
        "nonzero": (lambda t: (t > 1).nonzero(), x),
        "masked_select": (lambda t: t[t > 1], x),
        # a mask of another count at every call, as in a training loop (the same mask again is the rows above)
        "nonzero, a new count each call": (lambda t: (t > next(thresholds)).nonzero(), x),
        "boolean index, a new count each call": (lambda t: t[t > next(thresholds)], x),
        "boolean index_put of 0, a new count each call": (lambda t: t.clone().index_put_(
            (t > next(thresholds),), torch.tensor(0.0, device=t.device)), x),
        "repeat_interleave, a new total each call": (lambda t: torch.repeat_interleave((t[0] > next(thresholds)).long()), x),
        "unique, a new count each call": (lambda t: torch.unique(torch.where(t > next(thresholds), t, 0)), x),
        "gelu": (F.gelu, x),
    }


def run(smoke: bool) -> list:
    rows, columns, vocab, repeats = (8, 40, 64, 1) if smoke else (1024, 1024, 32000, 5)
    results = []
    with torch.neuron.adaptive_eager(False):
        for name, (op, cpu_input) in cases(rows, columns, vocab).items():
            device_input = cpu_input.to("neuron")
            cpu_ms = 1000 * measure(lambda: op(cpu_input), "cpu", inner=1, repeats=repeats, warmup=1)["min"]
            neuron_ms = 1000 * measure(lambda: op(device_input), "neuron", inner=1, repeats=repeats, warmup=1)["min"]
            results.append({"op": name, "torch cpu ms": cpu_ms, "neuron ms": neuron_ms})
    return results


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true")
    results = run(parser.parse_args(argv).smoke)
    print("| op | torch cpu ms | neuron ms | neuron / cpu |\n|---|---:|---:|---:|")
    for r in results:
        print(f"| {r['op']} | {r['torch cpu ms']:.3f} | {r['neuron ms']:.3f} | {r['neuron ms'] / r['torch cpu ms']:.2f}x |")
    return results


if __name__ == "__main__":
    main()
