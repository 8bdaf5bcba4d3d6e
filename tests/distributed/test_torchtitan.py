"""TorchTitan's own trainer (llama3 debug model, FSDP2 on 2 ranks) on neuron, through examples/torchtitan_llama.py."""
import re
from pathlib import Path

import pytest

from . import launch

pytest.importorskip("torchtitan", reason="TorchTitan is optional: pip install torchneuron[torchtitan]")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchtitan_llama.py"
STEP = re.compile(r"step:\s+(\d+)\s+\S*\s*loss:\s+([0-9.]+)")


def losses(output: str) -> dict:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)
    return {int(step): float(loss) for step, loss in STEP.findall(plain)}


@pytest.mark.slow
def test_torchtitan_llama_debug_model_trains_with_fsdp2_on_two_ranks(tmp_path):
    """10 steps of the stock debug config (flex attention, selective activation checkpointing, AdamW with
    warm-up) on generated offline assets: every step runs, both ranks log the same loss (FSDP2 reduces
    it over the mesh), and it falls as the model learns the generated text."""
    # TorchTitan makes neuron tensors before it initialises the process group: the ranks must agree on the
    # runtime's coordinator first, as torchrun's agent store lets them. No op may fall back to the CPU.
    env = {"TORCHTITAN_ASSETS": str(tmp_path),
           "TORCHNEURON_COORDINATOR": f"127.0.0.1:{launch.free_port()}"}
    results = launch.run("--training.steps", "10", jobs=EXAMPLE, timeout=480, env=env)
    launch.check(results)
    per_rank = [losses(output) for _, output in results]
    assert sorted(per_rank[0]) == list(range(1, 11)), per_rank[0]
    assert per_rank[0] == pytest.approx(per_rank[1], rel=1e-6)
    assert per_rank[0][10] < 0.8 * per_rank[0][1], per_rank[0]
