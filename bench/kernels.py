"""The kernel library against the eager compositions it replaces: time per call and peak device memory.

    python -m bench.kernels                         # XLA:CPU (here)
    python -m bench.kernels --platform cuda         # on a machine with an NVIDIA GPU (XLA:GPU)
    python -m bench.kernels --platform cuda --lowering pallas   # the kernels through Pallas (Triton)
    python -m bench.kernels --smoke                 # tiny shapes: checks that every case runs
    python -m bench.kernels --smoke --lowering pallas --case rms_norm   # Pallas' interpreter, on the CPU

Each case runs forward and backward (paged decode and AdamW: the step alone) on the neuron device, once
with the library kernel and once with the eager composition, in eager mode; memory is
torch.neuron.max_memory_allocated over one call, inputs included. `--lowering` picks how the kernels
lower (docs/kernels.md): with `pallas`, a case with a kernel Pallas does not lower runs with `auto`
instead (Pallas for the kernels it lowers on a GPU, the JAX lowering elsewhere), and its row says so.
Writes a markdown table to stdout and, with --out, JSON.
"""
import argparse
import json
import os
import sys


def cases(size):
    import torch
    import torch.nn.functional as F

    from torchneuron.kernels import lib

    s = dict(smoke=1, small=4, medium=16)[size]  # scales the shapes
    dev = "neuron"

    def randn(*shape, grad=True, scale=1.0):
        return (torch.randn(*shape, device=dev) * scale).requires_grad_(grad)

    def fwd_bwd(fn):
        def step(*args):
            out = fn(*args)
            out.float().square().mean().backward()
            return out
        return step

    def eager_rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    x, w = randn(256 * s, 1024), randn(1024)
    yield "rms_norm", fwd_bwd(lib.rms_norm), fwd_bwd(eager_rms), (x, w)

    r, b = randn(256 * s, 1024), randn(1024)
    yield ("layer_norm + residual", fwd_bwd(lambda x, w, b, r: lib.layer_norm(x, w, b, residual=r)[0]),
           fwd_bwd(lambda x, w, b, r: F.layer_norm(x + r, (1024,), w, b)), (x, w, b, r))

    def rotate_half(t):
        a, c = t.chunk(2, -1)
        return torch.cat((-c, a), -1)

    q, cos, sin = randn(1, 8, 64 * s, 64), randn(64 * s, 64, grad=False), randn(64 * s, 64, grad=False)
    yield ("rope", fwd_bwd(lib.rope), fwd_bwd(lambda q, c, n: q * c + rotate_half(q) * n), (q, cos, sin))

    x, wg, wu, wd = randn(128 * s, 512), randn(512, 1408, scale=0.04), randn(512, 1408, scale=0.04), \
        randn(1408, 512, scale=0.03)
    yield ("swiglu", fwd_bwd(lib.swiglu), fwd_bwd(lambda x, g, u, d: (F.silu(x @ g) * (x @ u)) @ d), (x, wg, wu, wd))

    q, k, v = randn(1, 8, 64 * s, 64), randn(1, 8, 64 * s, 64), randn(1, 8, 64 * s, 64)

    def eager_attention(q, k, v):
        scores = (q @ k.transpose(-1, -2)) / 8
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=dev).tril()
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v
    yield ("flash_attention causal", fwd_bwd(lambda q, k, v: lib.flash_attention(q, k, v, causal=True)),
           fwd_bwd(eager_attention), (q, k, v))

    h, wv, target = randn(128 * s, 512), randn(8000 * max(1, s // 4), 512, scale=0.04), \
        torch.randint(0, 8000 * max(1, s // 4), (128 * s,), device=dev)

    def ce_step(fn):
        def step(h, w, t):
            loss = fn(h, w, t)
            loss.backward()
            return loss
        return step
    yield ("linear_cross_entropy", ce_step(lib.linear_cross_entropy), ce_step(lambda h, w, t: F.cross_entropy(h @ w.t(), t)),
           (h, wv, target))

    params = [torch.randn(64 * s, 1024, device=dev) for _ in range(8)]
    grads = [torch.randn_like(p) for p in params]
    moments = [[torch.zeros_like(p) for p in params] for _ in range(2)]
    eager_params = [p.clone().requires_grad_() for p in params]
    for p, g in zip(eager_params, grads):
        p.grad = g
    optimizer = torch.optim.AdamW(eager_params, lr=1e-3, foreach=True)
    yield ("adamw over 8 tensors", lambda: lib.adamw_step(params, grads, *moments, step=1, lr=1e-3),
           optimizer.step, ())

    torch.manual_seed(0)
    layer = lib.MoE(256, 512, experts=8, k=2).to(dev)
    tokens = randn(64 * s, 256)

    def eager_moe(x):
        logits = layer.router(x)
        top = logits.topk(2).indices
        weight = torch.softmax(logits, -1).gather(1, top)
        weight = weight / weight.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(8):
            routed = ((top == e).float() * weight).sum(-1, keepdim=True)
            out = out + routed * (F.silu(x @ layer.w1[e]) @ layer.w2[e])
        return out
    yield "moe layer (8 experts, top 2)", fwd_bwd(layer), fwd_bwd(eager_moe), (tokens,)

    blocks, block_size, kv_heads, heads, dim, batch = 64 * s, 16, 8, 32, 128, 8
    kc, vc = randn(blocks, block_size, kv_heads, dim, grad=False), randn(blocks, block_size, kv_heads, dim, grad=False)
    table = torch.randperm(blocks, device="cpu").reshape(batch, -1).to(torch.int32).to(dev)
    lens = torch.full((batch,), blocks // batch * block_size, dtype=torch.int32, device=dev)
    qd = randn(batch, heads, dim, grad=False)

    def eager_decode(q, kc, vc, table, lens):
        rows = (table.long()[:, :, None] * block_size + torch.arange(block_size, device=dev)).reshape(batch, -1)
        k = kc.reshape(-1, kv_heads, dim)[rows].permute(0, 2, 1, 3).repeat_interleave(heads // kv_heads, 1)
        v = vc.reshape(-1, kv_heads, dim)[rows].permute(0, 2, 1, 3).repeat_interleave(heads // kv_heads, 1)
        return F.scaled_dot_product_attention(q[:, :, None], k, v)[:, :, 0]
    yield "paged decode", lib.paged_attention_decode, eager_decode, (qd, kc, vc, table, lens)


def run(size, repeats, lowering="auto", only=()):
    import torch

    from torchneuron.kernels.context import LOWERING_ENV

    from .timing import measure

    rows = []
    for name, kernel, eager, args in cases(size):
        if only and name not in only:
            continue
        row = {"case": name, "lowering": lowering}
        os.environ[LOWERING_ENV] = lowering  # read where the ops are traced, whichever thread traces them
        try:
            kernel(*args)
        except NotImplementedError as e:
            row["lowering"], row["fallback"] = "auto", str(e)
            os.environ[LOWERING_ENV] = "auto"
        for label, fn in (("kernel", kernel), ("eager", eager)):
            call = (lambda fn=fn: fn(*args))
            call()  # compile
            torch.neuron.synchronize()
            torch.neuron.reset_peak_memory_stats()
            base = torch.neuron.memory_allocated()
            call()
            torch.neuron.synchronize()
            row[f"{label} peak MiB"] = (torch.neuron.max_memory_allocated() - base) / 2 ** 20
            row[f"{label} ms"] = measure(call, "neuron", inner=1, repeats=repeats, warmup=1)["median"] * 1e3
        rows.append(row)
        print(f"| {name} | {row['lowering']} | {row['kernel ms']:.2f} | {row['eager ms']:.2f} | "
              f"{row['kernel peak MiB']:.1f} | {row['eager peak MiB']:.1f} |", flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", default="cpu", help="JAX platform: cpu, cuda, ... (TORCHNEURON_PLATFORM)")
    parser.add_argument("--size", default="small", choices=["smoke", "small", "medium"])
    parser.add_argument("--smoke", action="store_true", help="--size smoke, one repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lowering", default="auto", choices=["auto", "jax", "pallas"],
                        help="how kernels lower (TORCHNEURON_KERNEL_LOWERING)")
    parser.add_argument("--case", action="append", default=[], help="run only this case (repeatable)")
    parser.add_argument("--out", help="JSON file for the results")
    args = parser.parse_args(argv)
    os.environ["TORCHNEURON_PLATFORM"] = args.platform
    size, repeats = ("smoke", 1) if args.smoke else (args.size, args.repeats)
    import torch
    import torchneuron  # noqa: F401

    print(f"platform {args.platform}, size {size}, lowering {args.lowering}, {torch.neuron.device_count()} "
          "device(s)\n")
    print("| case | lowering | kernel ms | eager ms | kernel peak MiB | eager peak MiB |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    rows = run(size, repeats, args.lowering, args.case)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"platform": args.platform, "size": size, "lowering": args.lowering, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    sys.exit(main())
