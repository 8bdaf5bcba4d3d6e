"""Hugging Face Trainer on neuron, one process, against the same run on the CPU.

accelerate and transformers recognise a `neuron` device only when AWS's `torch_neuronx` package is
importable; without it, `ACCELERATE_TORCH_DEVICE=neuron` is their documented way to name the device
(docs/distributed.md, "Hugging Face Trainer", says what this leaves out).
"""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("accelerate")

TRAIN = """
import json, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
                                   bos_token_id=0, eos_token_id=0,
                                   # dropout draws from each device's own generator, whose streams differ
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
args = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=4, max_steps=3, logging_steps=1,
                         report_to=[], save_strategy="no", seed=0, dataloader_pin_memory=False,
                         disable_tqdm=True, use_cpu=sys.argv[2] == "cpu")
trainer = Trainer(model=model, args=args, train_dataset=Tokens())
trainer.train()
print(json.dumps({"device": str(next(trainer.model.parameters()).device),
                  "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h]}))
"""


def _train(tmp_path, device):
    env = dict(os.environ, ACCELERATE_TORCH_DEVICE=device, TORCHNEURON_FALLBACK="error")
    done = subprocess.run([sys.executable, "-c", TRAIN, str(tmp_path / device), device], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_trainer_trains_on_neuron_as_on_the_cpu(tmp_path):
    neuron, cpu = _train(tmp_path, "neuron"), _train(tmp_path, "cpu")
    assert neuron["device"] == "neuron:0" and cpu["device"] == "cpu"
    assert len(neuron["losses"]) == 3
    assert neuron["losses"] == pytest.approx(cpu["losses"], rel=1e-4)
