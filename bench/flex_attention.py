"""flex_attention on neuron, eager (PyTorch's dense implementation, op by op) against compiled (lowered into
the graph's program), forward and forward+backward, in one run.

    python -m bench.flex_attention            # B4 H8 S256 D64, causal block mask and a relative-position score_mod
    python -m bench.flex_attention --smoke    # tiny sizes, one repeat: checks that both modes run

Each figure is the fastest of several steps (ms), after warm-up steps that compile. Eager is also what a
compiled graph ran before flex attention's ops were lowered: the graph split around them.
"""
import argparse

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from bench.timing import measure
from torchneuron.compile import neuron_backend

FULL = dict(batch=4, heads=8, length=256, dim=64, block=128, repeats=10)
SMOKE = dict(batch=1, heads=2, length=32, dim=8, block=16, repeats=1)


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _relative(score, b, h, q_idx, kv_idx):
    return score + 0.01 * (kv_idx - q_idx)


def run(sizes) -> list:
    shape = (sizes["batch"], sizes["heads"], sizes["length"], sizes["dim"])
    q, k, v = (torch.randn(shape, device="neuron", requires_grad=True) for _ in range(3))
    block_mask = create_block_mask(_causal, sizes["batch"], None, sizes["length"], sizes["length"], device="neuron",
                                   BLOCK_SIZE=sizes["block"])
    rows = []
    compiled = torch.compile(flex_attention, backend=neuron_backend)
    for mode, attention in (("eager", flex_attention), ("compiled", compiled)):
        def forward():
            with torch.no_grad():
                return attention(q, k, v, score_mod=_relative, block_mask=block_mask)

        def forward_backward():
            attention(q, k, v, score_mod=_relative, block_mask=block_mask).sum().backward()

        row = {"mode": mode}
        for name, fn in (("forward ms", forward), ("fwd+bwd ms", forward_backward)):
            row[name] = 1000 * measure(fn, "neuron", inner=1, repeats=sizes["repeats"], warmup=2)["min"]
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat")
    sizes = SMOKE if parser.parse_args().smoke else FULL
    rows = run(sizes)
    print(f"flex_attention B{sizes['batch']} H{sizes['heads']} S{sizes['length']} D{sizes['dim']}, causal block mask, "
          "relative-position score_mod")
    print("| mode | forward ms | fwd+bwd ms |\n| --- | ---: | ---: |")
    for r in rows:
        print(f"| {r['mode']} | {r['forward ms']:.1f} | {r['fwd+bwd ms']:.1f} |")


if __name__ == "__main__":
    main()
