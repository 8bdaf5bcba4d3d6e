"""torch.nn.attention.flex_attention on neuron (ops/flex_attention.py): a score_mod and a block mask,
forward and backward, eager and compiled, against the same attention written out on the CPU."""
import math

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from torchneuron import compile as neuron_compile

B, H, L, D = 2, 4, 40, 16
WINDOW = 12


def sliding_causal(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < WINDOW)


def relative_bias(score, b, h, q_idx, kv_idx):
    return score + 0.05 * (kv_idx - q_idx) * (h + 1)


def reference(q, k, v):
    """The same attention with every score written out (the CPU refuses flex_attention's backward)."""
    rows, cols = torch.arange(L)[:, None], torch.arange(L)[None, :]
    heads = torch.arange(H).reshape(1, H, 1, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D) + 0.05 * (cols - rows) * (heads + 1)
    scores = scores.masked_fill(~sliding_causal(0, 0, rows, cols), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, L, D, generator=g) for _ in range(3)]


def _leaves(tensors, device):
    return [t.detach().to(device).requires_grad_() for t in tensors]


def _run(attention, device):
    q, k, v = _leaves(_inputs(), device)
    block_mask = create_block_mask(sliding_causal, B, H, L, L, device=device, BLOCK_SIZE=16)
    out = attention(q, k, v, score_mod=relative_bias, block_mask=block_mask)
    weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device)
    (out * weights).sum().backward()
    return out, [q.grad, k.grad, v.grad]


def _expected():
    q, k, v = _leaves(_inputs(), "cpu")
    out = reference(q, k, v)
    (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    return out, [q.grad, k.grad, v.grad]


@pytest.mark.parametrize("how", ["eager", "neuron", "default"])
def test_flex_attention_with_score_mod_and_block_mask_matches_the_cpu(how):
    """"default": torch.compile's own backend (Inductor, which has no neuron code generator) hands the
    graph to the neuron backend; TorchTitan compiles flex attention that way."""
    attention = {"eager": flex_attention, "neuron": torch.compile(flex_attention, backend="neuron"),
                 "default": torch.compile(flex_attention)}[how]
    torch._dynamo.reset()
    neuron_compile.reset()
    out, grads = _run(attention, "neuron")
    expected_out, expected_grads = _expected()
    torch.testing.assert_close(out.detach().cpu(), expected_out.detach(), atol=2e-5, rtol=1e-4)
    for grad, expected in zip(grads, expected_grads):
        assert grad.device.type == "neuron"
        torch.testing.assert_close(grad.cpu(), expected, atol=2e-5, rtol=1e-4)
    if how != "eager":  # the attention runs between compiled pieces, the rest of the graph in XLA programs
        report = neuron_compile.report()
        assert report["eager_ops"].get("flex_attention", 0) >= 1 and report["graphs"] >= 2, report


def test_block_mask_on_neuron_equals_the_cpu_block_mask():
    on_neuron = create_block_mask(sliding_causal, B, H, L, L, device="neuron", BLOCK_SIZE=16)
    on_cpu = create_block_mask(sliding_causal, B, H, L, L, device="cpu", BLOCK_SIZE=16)
    assert on_neuron.kv_num_blocks.device.type == "neuron"
    for mine, theirs in zip(on_neuron.as_tuple()[2:8], on_cpu.as_tuple()[2:8]):
        torch.testing.assert_close(mine.cpu(), theirs)


def test_assert_async_raises_at_synchronisation():
    """TorchTitan's rotary embedding checks positions with torch._assert_async, which must not fall back."""
    x = torch.arange(4.0, device="neuron")
    torch._assert_async(x.sum() > 0, "positions in range")
    torch.neuron.synchronize()
    torch._assert_async(x.sum() < 0, "positions out of range")
    with pytest.raises(RuntimeError, match="positions out of range"):
        torch.neuron.synchronize()
    torch._assert_async(torch.tensor(0.0, device="neuron"))
    with pytest.raises(RuntimeError, match="single nonzero value"):
        torch.neuron.synchronize()
