"""TorchTitan's own trainer (llama3 debug model) on neuron, through examples/torchtitan_llama.py."""
import re
from pathlib import Path

import pytest

from . import launch

pytest.importorskip("torchtitan", reason="TorchTitan is optional: pip install torchneuron[torchtitan]")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchtitan_llama.py"
STEP = re.compile(r"step:\s+(\d+)\s+\S*\s*loss:\s+([0-9.]+)")
STEPS = 10


def losses(output: str) -> dict:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)
    return {int(step): float(loss) for step, loss in STEP.findall(plain)}


def train(assets, *arguments, world=2):
    """Both ranks' loss per step. TorchTitan makes neuron tensors before it initialises the process group:
    the ranks agree on the runtime's coordinator first (as torchrun's agent store lets them). No op may
    fall back to the CPU (the launcher's TORCHNEURON_FALLBACK=error)."""
    env = {"TORCHTITAN_ASSETS": str(assets), "TORCHNEURON_COORDINATOR": f"127.0.0.1:{launch.free_port()}"}
    results = launch.run("--training.steps", str(STEPS), *arguments, world=world, jobs=EXAMPLE, timeout=480, env=env)
    launch.check(results)
    return [losses(output) for _, output in results]


@pytest.mark.slow
def test_torchtitan_fsdp2_matches_replicated_data_parallel_from_one_seed_checkpoint(tmp_path):
    """10 steps of the stock debug config (flex attention, selective activation checkpointing, AdamW with
    warm-up) on generated offline assets, from one seed checkpoint (TorchTitan's way to start every
    parallelism from the same weights): FSDP2 over 2 ranks and plain replicated data parallelism over the
    same 2 ranks see the same global batches, so their loss curves agree (1e-4 relative: the reductions
    differ in order), and the loss falls."""
    seed = tmp_path / "seed"
    train(tmp_path, "--checkpoint.enable", "--checkpoint.create_seed_checkpoint",
          "--parallelism.data_parallel_shard_degree", "1", "--dump_folder", str(seed), world=1)
    start = ["--checkpoint.enable", "--checkpoint.interval", "100",
             "--checkpoint.initial_load_path", str(seed / "checkpoint" / "step-0")]
    fsdp = train(tmp_path, *start, "--dump_folder", str(tmp_path / "fsdp"))
    replicated = train(tmp_path, *start, "--dump_folder", str(tmp_path / "replicated"),
                       "--parallelism.data_parallel_replicate_degree", "2",
                       "--parallelism.data_parallel_shard_degree", "1")
    assert sorted(fsdp[0]) == list(range(1, STEPS + 1)), fsdp[0]
    assert fsdp[0] == pytest.approx(fsdp[1], rel=1e-6)
    assert replicated[0] == pytest.approx(fsdp[0], rel=1e-4)
    assert fsdp[0][STEPS] < 0.8 * fsdp[0][1], fsdp[0]
