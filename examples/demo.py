"""TorchNeuron demo: train a small character-level GPT on `neuron` and on the CPU, side by side.

The model and training loop are plain PyTorch; only the device string differs.
Run with `bash scripts/demo.sh` (sets everything up first) or `python examples/demo.py`.
"""
import argparse
import pathlib
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

CORPUS = pathlib.Path(__file__).parent / "data" / "corpus.txt"


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, width: int = 64, heads: int = 4, layers: int = 2, context: int = 64):
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(layers)])
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied, as in GPT-2
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.position.weight, std=0.02)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.head(self.norm(self.blocks(self.embed(tokens) + self.position(positions))))


def batches(data: torch.Tensor, steps: int, batch: int, context: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - context - 1, (batch,), generator=generator)
        rows = torch.stack([data[s : s + context + 1] for s in starts])
        yield rows[:, :-1], rows[:, 1:]


def progress(label: str, step: int, steps: int, loss: float, step_ms: float) -> None:
    done = int(30 * step / steps)
    bar = "#" * done + "-" * (30 - done)
    sys.stdout.write(f"\r{label:>7} [{bar}] {step:4d}/{steps}  loss {loss:6.3f}  {step_ms:7.2f} ms/step")
    sys.stdout.flush()


def train(device: str, data, vocab: int, args) -> dict:
    torch.manual_seed(args.seed)
    model = TinyGPT(vocab, context=args.context).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, times = [], []
    for step, (inputs, targets) in enumerate(batches(data, args.steps, args.batch, args.context, args.seed), 1):
        start = time.perf_counter()
        inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # .item() waits for the device, so the step time is honest
        times.append((time.perf_counter() - start) * 1000)
        progress(device, step, args.steps, losses[-1], times[-1])
    print()
    warm = sorted(times[len(times) // 4 :])
    return {"first": losses[0], "last": sum(losses[-10:]) / min(10, len(losses)), "median_ms": warm[len(warm) // 2],
            "first_step_ms": times[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    text = CORPUS.read_text()
    alphabet = sorted(set(text))
    data = torch.tensor([alphabet.index(c) for c in text])
    print(f"TinyGPT on {len(text)} characters ({len(alphabet)} symbols), {args.steps} AdamW steps, "
          f"batch {args.batch} x {args.context}; device {torch.neuron.get_device_name()}")
    results = {device: train(device, data, len(alphabet), args) for device in ("neuron", "cpu")}

    import torchneuron

    print(f"\n{'':8}{'loss first':>12}{'loss last':>12}{'ms/step':>10}{'1st step ms':>13}")
    for device, r in results.items():
        print(f"{device:8}{r['first']:12.3f}{r['last']:12.3f}{r['median_ms']:10.2f}{r['first_step_ms']:13.1f}")
    fallbacks = torchneuron.fallback_report()
    print(f"\nops that fell back to the CPU on neuron: {fallbacks or 'none'}")
    print(f"eager executable cache: {torch.neuron.cache_stats()}")


if __name__ == "__main__":
    main()
