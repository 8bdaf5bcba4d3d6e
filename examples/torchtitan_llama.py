"""TorchTitan's llama3 debug model trained on neuron with its own trainer, offline.

    .venv/bin/torchrun --nproc-per-node 2 examples/torchtitan_llama.py            # FSDP2 on 2 ranks
    .venv/bin/torchrun --nproc-per-node 2 examples/torchtitan_llama.py \
        --parallelism.tensor_parallel_degree 2                                   # TP (FSDP2 + TP needs 4)

Arguments are TorchTitan's own command-line overrides of `--module llama3 --config
llama3_debugmodel`. Nothing can be downloaded here, so the script first writes what the stock
config reads from disk: a byte-level BPE tokenizer trained on generated text (`tokenizer.json`,
`tokenizer_config.json`) and a JSON-lines text dataset in the layout of TorchTitan's `c4_test`.
`TORCHTITAN_ASSETS` chooses where (default: a folder under the system temp directory).
"""
import json
import os
import random
import sys
import tempfile
from pathlib import Path

WORDS = ("the model trains on neuron with fully sharded data parallel and tensor parallel layers while "
         "gradients reduce across ranks every step attention heads rotate queries keys values").split()
VOCAB_SIZE = 2048  # the debug model's embedding size; the tokenizer must not exceed it
DOCUMENTS = 400


def _write(path: Path, text: str) -> None:
    """Every rank writes the same bytes; the rename makes a half-written file invisible."""
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def _documents() -> list:
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 200))) for _ in range(DOCUMENTS)]


def prepare_assets(root: Path) -> tuple:
    """(tokenizer folder, dataset folder) under root, written once."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer_dir, dataset_dir = root / "tokenizer", root / "c4_test"
    if (tokenizer_dir / "tokenizer_config.json").exists() and (dataset_dir / "c4.json").exists():
        return tokenizer_dir, dataset_dir
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    dataset_dir.mkdir(parents=True, exist_ok=True)
    documents = _documents()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>"]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(documents, trainer)
    _write(tokenizer_dir / "tokenizer.json", tokenizer.to_str())
    _write(tokenizer_dir / "tokenizer_config.json", json.dumps(
        {"bos_token": special[0], "eos_token": special[1], "add_bos_token": True, "add_eos_token": True}))
    _write(dataset_dir / "c4.json", "".join(json.dumps({"text": d}) + "\n" for d in documents))
    return tokenizer_dir, dataset_dir


def titan_arguments(tokenizer_dir: Path, dataset_dir: Path, dump_folder: Path, overrides: list) -> list:
    """The stock debug config, made small enough for a CPU-backed device and kept offline."""
    return [
        "--module", "llama3", "--config", "llama3_debugmodel",
        "--hf_assets_path", str(tokenizer_dir),
        "--dataloader.dataset_path", str(dataset_dir),
        "--dump_folder", str(dump_folder),
        "--training.local_batch_size", "2", "--training.seq_len", "64", "--training.steps", "10",
        "--training.mixed_precision_param", "float32",
        "--validator.no-enable", "--checkpoint.no-enable", "--debug.seed", "0",
        # TorchTitan's default "spmd_types" path needs a newer fully_shard than torch 2.13's (docs/parallelism.md)
        "--parallelism.spmd_backend", "partial_dtensor",
        *overrides,
    ]


def main() -> None:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = Path(os.environ.get("TORCHTITAN_ASSETS", Path(tempfile.gettempdir()) / "torchneuron-torchtitan"))
    tokenizer_dir, dataset_dir = prepare_assets(root)
    sys.argv = [sys.argv[0], *titan_arguments(tokenizer_dir, dataset_dir, root / "outputs", sys.argv[1:])]
    import torch.distributed as dist

    if not hasattr(dist, "set_timeout"):
        # TorchTitan 0.3.0 calls this after its first step; torch 2.13 has it only under its older name
        dist.set_timeout = dist.distributed_c10d._set_pg_timeout
    from torchtitan.train import main as titan_main

    titan_main()


if __name__ == "__main__":
    main()
