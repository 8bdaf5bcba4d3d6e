"""vLLM serving a tiny random Llama (2 layers, d128, head_dim 32, GQA) on neuron against vLLM's own CPU
platform, in one run: output tokens/s at batch 1 and 8 (prompts of 32 tokens, 32 new tokens each, greedy),
and time to first token (one 32-token prompt, one new token); best of 3 runs with new prompts each (no
prefix-cache hits), after one run of the same shapes (compiles). Each platform runs in its own process
(vLLM picks its platform once per process).

    /work/vllm-venv/bin/python -m bench.vllm_serving [--smoke]

Needs vLLM (docs/vllm.md). Run it on an otherwise idle machine.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# platform name -> environment of its process (VLLM_PLUGINS names no plugin: vLLM's CPU platform)
PLATFORMS = {"cpu": {"VLLM_PLUGINS": "none"},
             "neuron eager": {"VLLM_PLUGINS": "neuron", "TORCHNEURON_ADAPTIVE_EAGER": "0"},
             "neuron adaptive": {"VLLM_PLUGINS": "neuron", "TORCHNEURON_ADAPTIVE_EAGER": "1"},
             "neuron compiled": {"VLLM_PLUGINS": "neuron", "TORCHNEURON_ADAPTIVE_EAGER": "0",
                                 "TORCHNEURON_VLLM_COMPILE": "1"}}


REPEATS = 3  # the best of


def make_model(path: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256)
    LlamaForCausalLM(config).save_pretrained(path)


def measure(model: str, new_tokens: int, batches: list) -> dict:
    """Runs in the platform's process."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, skip_tokenizer_init=True, max_model_len=256, max_num_seqs=max(batches),
              kv_cache_memory_bytes=1 << 22, seed=0)

    def run(batch, tokens, seed):
        # new prompts each run: none is served from vLLM's prefix cache
        prompts = [{"prompt_token_ids": [(7 * b + 13 * seed + i) % 500 + 3 for i in range(32)]} for b in range(batch)]
        params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start, sum(len(o.outputs[0].token_ids) for o in outputs)

    runs = iter(range(1000))

    def timed(batch, tokens):
        run(batch, tokens, next(runs))  # compiles this batch's shapes
        return min(run(batch, tokens, next(runs)) for _ in range(REPEATS))

    result = {f"tokens/s, batch {b}": (lambda s, n: n / s)(*timed(b, new_tokens)) for b in batches}
    result["time to first token, ms"] = 1000 * timed(1, 1)[0]
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="4 new tokens, batch 1 and 2")
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "TOKENS", "BATCHES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        model, tokens, batches = args.child
        print("RESULT " + json.dumps(measure(model, int(tokens), json.loads(batches))), flush=True)
        return
    tokens, batches = (4, [1, 2]) if args.smoke else (32, [1, 8])
    with tempfile.TemporaryDirectory() as model:
        make_model(model)
        results = {}
        for name, env in PLATFORMS.items():
            run = subprocess.run([sys.executable, "-m", "bench.vllm_serving", "--child", model, str(tokens),
                                  json.dumps(batches)], capture_output=True, text=True,
                                 env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **env})
            lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
            if not lines:
                sys.exit(f"{name} failed:\n{run.stderr[-4000:]}")
            results[name] = json.loads(lines[0][len("RESULT "):])
    columns = list(results["cpu"])
    print("| platform | " + " | ".join(columns) + " |\n|---|" + "---:|" * len(columns))
    for name, values in results.items():
        print(f"| {name} | " + " | ".join(f"{values[c]:.1f}" for c in columns) + " |")


if __name__ == "__main__":
    main()
