"""Greedy generation with Hugging Face's default (growing) cache and its static cache, cold and warm.

    python -m bench.generate              # a 2-layer GPT-2 (d64), 8 prompt tokens, 100 new tokens
    python -m bench.generate --tokens 4   # a quick check that every variant runs
    python -m bench.generate --calls 4    # generate() called four times in each process


An XLA device compiles a program for every new shape. The default cache grows by one position at each
token, so each token's attention ops are new signatures; the static cache (`cache_implementation=
"static"`) keeps the shapes of the longest sequence and writes each token in place. Each neuron figure
is a fresh process: "cold" with an empty TORCHNEURON_CACHE_DIR, "warm" with the cache the cold one left
(the programs read from disk). PyTorch CPU eager for scale. With `--calls N`, each process calls generate()
N times with the same lengths and the table gives the later calls' seconds too: adaptive eager fuses a queue
once its structure recurs (docs/adaptive_eager.md). With the static cache the tokens' queues are alike and fuse
within the first call; with the default cache each token's queue is a structure of its own, recurring once a
call, so the second call starts their compiles on compile threads and the third waits for them.
"""
import argparse
import json
import tempfile
import time

from .timing import in_own_process


def _generate(device: str, cache: str, tokens: int, calls: int) -> dict:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from torchneuron.runtime.cache import eager_cache

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=1024, bos_token_id=0,
                        eos_token_id=0, pad_token_id=0)
    model = GPT2LMHeadModel(config).eval().to(device)
    prompt = torch.randint(1, 128, (1, 8)).to(device)
    options = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                   cache_implementation=None if cache == "dynamic" else cache)
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompt, **options)
        seconds.append(time.perf_counter() - start)
    return {"seconds": seconds[0], "later": seconds[1:], "tokens": out.shape[1] - prompt.shape[1],
            "programs": len(eager_cache.entries)}


def _in_own_process(device: str, cache: str, tokens: int, calls: int, cache_dir: str) -> dict:
    return in_own_process("bench.generate", ["--one", device, cache, "--tokens", tokens, "--calls", calls],
                          TORCHNEURON_CACHE_DIR=cache_dir)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("--one", nargs=2, metavar=("DEVICE", "CACHE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(_generate(*args.one, args.tokens, args.calls)))
        return {}
    rows = {}
    for cache in ("dynamic", "static"):
        with tempfile.TemporaryDirectory() as cache_dir:
            for start in ("cold", "warm"):
                rows[f"neuron, {cache} cache, {start}"] = _in_own_process("neuron", cache, args.tokens, args.calls,
                                                                          cache_dir)
            rows[f"cpu, {cache} cache"] = _in_own_process("cpu", cache, args.tokens, args.calls, cache_dir)
    later = " | later calls, s" if args.calls > 1 else ""
    print(f"| {args.tokens} new tokens | s | ms per token | programs compiled or loaded{later} |\n"
          f"|---|---:|---:|---:|{'---|' if later else ''}")
    for name, row in rows.items():
        programs = row["programs"] if name.startswith("neuron") else "-"
        calls = " | " + " ".join(f"{s:.2f}" for s in row["later"]) if later else ""
        print(f"| {name} | {row['seconds']:.2f} | {row['seconds'] / row['tokens'] * 1e3:.1f} | {programs}{calls} |")
    return rows


if __name__ == "__main__":
    main()
