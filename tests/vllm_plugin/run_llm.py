"""Runs vllm.LLM on a model and prints what the vLLM tests check, as JSON (a separate process: vLLM's platform
is chosen once per process). Usage: python run_llm.py MODEL PROMPTS_JSON MAX_TOKENS"""
import json
import sys

from vllm import LLM, SamplingParams


def describe(worker):
    runner = worker.model_runner
    caches = {name: ctx.kv_cache for name, ctx in runner.compilation_config.static_forward_context.items()
              if hasattr(ctx, "kv_cache")}
    return {"weights": sorted({str(p.device) for p in runner.model.parameters()}),
            "kv_caches": sorted({str(c.device) for c in caches.values()}),
            "attention": sorted({type(ctx.impl).__name__ for ctx in
                                 runner.compilation_config.static_forward_context.values() if hasattr(ctx, "impl")})}


def main(model, prompts, max_tokens):
    from vllm.platforms import current_platform

    llm = LLM(model=model, skip_tokenizer_init=True, max_model_len=256, max_num_seqs=8,
              kv_cache_memory_bytes=1 << 22, seed=0)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    greedy_params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    greedy = llm.generate(inputs, greedy_params)
    # again: prompts of a full block or more now start from cached blocks (prefill over cached context)
    cached = llm.generate(inputs, greedy_params)
    sampled = [llm.generate(inputs, SamplingParams(temperature=1.0, top_p=0.9, max_tokens=max_tokens, seed=7,
                                                   ignore_eos=True)) for _ in range(2)]
    print("RESULT " + json.dumps({
        "platform": type(current_platform).__name__,
        "greedy": [list(o.outputs[0].token_ids) for o in greedy],
        "greedy_cached": [list(o.outputs[0].token_ids) for o in cached],
        "cached_tokens": [o.num_cached_tokens for o in cached],
        "sampled": [[list(o.outputs[0].token_ids) for o in run] for run in sampled],
        **llm.collective_rpc(describe)[0]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]))
