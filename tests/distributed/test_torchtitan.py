"""TorchTitan's own trainer (llama3 debug model) on neuron, through examples/torchtitan_llama.py, against the
same run on the CPU over gloo (torchtitan_cpu.py)."""
import re
from pathlib import Path

import pytest

from . import launch

pytest.importorskip("torchtitan", reason="TorchTitan is optional: pip install torchneuron[torchtitan]")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchtitan_llama.py"
ON_CPU = Path(__file__).with_name("torchtitan_cpu.py")
STEP = re.compile(r"step:\s+(\d+)\s+\S*\s*loss:\s+([0-9.]+)")
STEPS = 10


def losses(output: str) -> dict:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)
    return {int(step): float(loss) for step, loss in STEP.findall(plain)}


def train(assets, *arguments, world=2, jobs=EXAMPLE):
    """Both ranks' loss per step. TorchTitan makes neuron tensors before it initialises the process group:
    the ranks agree on the runtime's coordinator first (as torchrun's agent store lets them). No op may
    fall back to the CPU (the launcher's TORCHNEURON_FALLBACK=error)."""
    env = {"TORCHTITAN_ASSETS": str(assets), "TORCHNEURON_COORDINATOR": f"127.0.0.1:{launch.free_port()}"}
    results = launch.run("--training.steps", str(STEPS), *arguments, world=world, jobs=jobs, timeout=480, env=env)
    launch.check(results)
    return [losses(output) for _, output in results]


@pytest.mark.slow
def test_torchtitan_fsdp2_matches_the_cpu_and_replicated_data_parallel_from_one_seed_checkpoint(tmp_path):
    """10 steps of the stock debug config (flex attention, selective activation checkpointing, AdamW with
    warm-up) on generated offline assets, from one seed checkpoint (TorchTitan's way to start every
    parallelism from the same weights). FSDP2 over 2 neuron ranks has the loss curve of FSDP2 over 2 CPU
    processes on gloo (1e-3 relative, as the issue asks); plain replicated data parallelism over the same
    2 neuron ranks sees the same global batches, so it agrees too (1e-4: the reductions differ in order);
    and the loss falls."""
    seed = tmp_path / "seed"
    train(tmp_path, "--checkpoint.enable", "--checkpoint.create_seed_checkpoint",
          "--parallelism.data_parallel_shard_degree", "1", "--dump_folder", str(seed), world=1)
    start = ["--checkpoint.enable", "--checkpoint.interval", "100",
             "--checkpoint.initial_load_path", str(seed / "checkpoint" / "step-0")]
    fsdp = train(tmp_path, *start, "--dump_folder", str(tmp_path / "fsdp"))
    on_cpu = train(tmp_path, *start, "--dump_folder", str(tmp_path / "cpu"), jobs=ON_CPU)
    replicated = train(tmp_path, *start, "--dump_folder", str(tmp_path / "replicated"),
                       "--parallelism.data_parallel_replicate_degree", "2",
                       "--parallelism.data_parallel_shard_degree", "1")
    print("neuron FSDP2", fsdp[0], "\ncpu/gloo FSDP2", on_cpu[0], "\nneuron replicated", replicated[0])
    assert sorted(fsdp[0]) == list(range(1, STEPS + 1)), fsdp[0]
    assert fsdp[0] == pytest.approx(fsdp[1], rel=1e-6)
    assert on_cpu[0] == pytest.approx(fsdp[0], rel=1e-3)
    assert replicated[0] == pytest.approx(fsdp[0], rel=1e-4)
    assert fsdp[0][STEPS] < 0.8 * fsdp[0][1], fsdp[0]
