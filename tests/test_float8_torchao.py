"""torchao's float8 training (convert_to_float8_training) on neuron, eager and compiled, against the CPU."""
import re
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.nn as nn

from torchneuron import compile as neuron_compile
from torchneuron.eager import adaptive, fallback

pytest.importorskip("torchao", reason="torchao is not installed (pip install torchneuron[fp8])")
from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # noqa: E402
from torchao.float8.float8_linear import Float8Linear  # noqa: E402

# torchao's test/float8/test_compile.py compares float8 outputs within these
TORCHAO_TOLERANCE = dict(atol=9.5e-2, rtol=9.5e-2)
STEPS = 3
ROOT = Path(__file__).resolve().parents[1]


def _train(device, recipe, compiled=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32)).to(torch.bfloat16)
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe))
    assert all(isinstance(model[i], Float8Linear) for i in (0, 2))
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(32, 64, dtype=torch.bfloat16, generator=generator).to(device)
    target = torch.randn(32, 32, generator=generator).to(device)

    def loss_of(x):
        return nn.functional.mse_loss(model(x).float(), target)

    if compiled:
        loss_of = torch.compile(loss_of, backend="neuron", fullgraph=True)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = loss_of(x)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return torch.tensor(losses), model[0].weight.detach().cpu()


@pytest.mark.parametrize(
    "recipe, mode",
    [("tensorwise", "eager"), ("tensorwise", "adaptive"), ("tensorwise", "compiled"), ("rowwise", "compiled")],
    ids=["tensorwise-eager", "tensorwise-adaptive", "tensorwise-compiled", "rowwise-compiled"],
)
def test_float8_training_matches_the_cpu(recipe, mode):
    expected_losses, expected_weight = _train("cpu", recipe)
    neuron_compile.reset()
    compiled = mode == "compiled"
    torch.neuron.synchronize()  # earlier queued work runs now, not counted below (tests/kernels/test_custom_op.py)
    fused_before = adaptive.stats()["ops_fused"]
    with fallback.as_error(), mock.patch("torch._scaled_mm", wraps=torch._scaled_mm) as scaled_mm, \
            torch.neuron.adaptive_eager(mode == "adaptive"):
        losses, weight = _train("neuron", recipe, compiled)
    if compiled:
        assert neuron_compile.report()["eager_ops"] == {}  # every op, _scaled_mm included, in the XLA programs
    else:
        assert scaled_mm.call_count == 3 * 2 * STEPS  # each Float8Linear: forward, grad_input, grad_weight
    assert (adaptive.stats()["ops_fused"] > fused_before) == (mode == "adaptive")
    assert losses[-1] < losses[0]
    torch.testing.assert_close(losses, expected_losses, **TORCHAO_TOLERANCE)
    torch.testing.assert_close(weight, expected_weight, **TORCHAO_TOLERANCE)


def test_the_fp8_tutorial_runs_as_written(capsys):
    """docs/extending.md's FP8 section: its python blocks, in order (they register nothing global)."""
    text = (ROOT / "docs" / "extending.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text[text.index("## FP8"):], re.S)
    assert len(blocks) == 2
    exec(compile("\n".join(blocks), "docs/extending.md#fp8", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "torch.bfloat16 torch.Size([16, 24])" and float(lines[1]) > 0
