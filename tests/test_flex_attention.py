"""torch.nn.attention.flex_attention on neuron (ops/flex_attention.py): a score_mod and a block mask,
forward and backward, eager and compiled (in the graph's program, or between compiled pieces), against the
same attention written out on the CPU."""
import math

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from torchneuron import compile as neuron_compile
from torchneuron.compile import backend

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
    if how != "eager":  # the attention is part of the forward's and the backward's program
        report = neuron_compile.report()
        programs = report["xla_compiles"] + report["disk_cache_hits"]
        assert report["eager_ops"] == {} and report["graphs"] == 2 and programs == 2, report


LENGTHS = [L, 0]  # the second batch's rows attend to nothing: their output is 0 and their logsumexp -inf


def _variant(name, device):
    """(score_mod, mask function, captured leaves, heads of key and value) of each variant, capturing tensors
    on `device`."""
    if name == "grouped query heads":
        return relative_bias, sliding_causal, [], H // 2
    if name == "learnable bias":
        bias = torch.linspace(-0.5, 0.5, H).to(device).requires_grad_()
        return (lambda score, b, h, q_idx, kv_idx: score + bias[h] * (q_idx - kv_idx)), None, [bias], H
    lengths = torch.tensor(LENGTHS).to(device)
    return None, (lambda b, h, q_idx, kv_idx: kv_idx < lengths[b]), [], H


def _written_out(q, k, v, score_mod, mask_fn):
    """flex attention on the CPU with every score written out, the index tensors broadcast over the grid;
    rows with nothing to attend to give 0 and a logsumexp of -inf (and no NaN to their gradients)."""
    k, v = (t.repeat_interleave(H // t.shape[1], dim=1) for t in (k, v))
    b, h, q_idx, kv_idx = (torch.arange(n).reshape([-1 if i == d else 1 for i in range(4)])
                           for d, n in enumerate((B, H, L, L)))
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    if score_mod is not None:
        scores = score_mod(scores, b, h, q_idx, kv_idx)
    if mask_fn is not None:
        scores = scores.masked_fill(~mask_fn(b, h, q_idx, kv_idx), float("-inf"))
    empty = scores.isneginf().all(dim=-1, keepdim=True)
    scores = torch.where(empty, 0, scores)
    lse = torch.where(empty.squeeze(-1), float("-inf"), torch.logsumexp(scores, dim=-1))
    return torch.where(empty, 0, torch.softmax(scores, dim=-1)) @ v, lse


@pytest.mark.parametrize("how", ["eager", "compiled"])
@pytest.mark.parametrize("name", ["grouped query heads", "learnable bias", "captured mask buffer, empty rows"])
def test_flex_attention_variants_match_the_cpu(name, how):
    """Output, logsumexp, and the gradients of query, key, value and a captured learnable buffer, against the
    CPU. Compiled, the attention is part of the forward's and the backward's programs; eager, PyTorch's
    joint graph of a score_mod capturing a learnable neuron tensor meets it among its fake tensors."""
    results = {}
    for device in ("cpu", "neuron"):
        score_mod, mask_fn, captured, kv_heads = _variant(name, device)
        g = torch.Generator().manual_seed(1)
        shapes = [(B, H, L, D), (B, kv_heads, L, D), (B, kv_heads, L, D)]
        q, k, v = [torch.randn(*shape, generator=g).to(device).requires_grad_() for shape in shapes]
        if device == "cpu":
            out, lse = _written_out(q, k, v, score_mod, mask_fn)
        else:
            block_mask = None if mask_fn is None else create_block_mask(mask_fn, B, None, L, L, device=device,
                                                                        BLOCK_SIZE=16)
            torch._dynamo.reset()
            neuron_compile.reset()
            attention = flex_attention if how == "eager" else torch.compile(flex_attention, backend="neuron")
            out, lse = attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=kv_heads != H,
                                 return_lse=True)
            assert neuron_compile.report()["eager_ops"] == {}
        loss = (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device)).sum()
        (loss + torch.where(lse.isinf(), 0, lse).sum()).backward()
        results[device] = [out.detach().cpu(), lse.detach().cpu()] + [t.grad.cpu() for t in [q, k, v, *captured]]
    for got, expected in zip(results["neuron"], results["cpu"], strict=True):
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    if name.startswith("captured mask"):
        out, lse = results["neuron"][:2]
        assert (out[1] == 0).all() and lse[1].isneginf().all()


def test_with_a_subgraph_op_the_table_lacks_compiled_flex_attention_runs_between_compiled_pieces(monkeypatch):
    """An op of score_mod without a lowering (mul here, as if it had none) cannot run inside the lowering:
    the graph splits around flex attention's ops, which run PyTorch's dense implementation eagerly."""
    monkeypatch.setattr(backend, "supported",
                        lambda target, with_collectives=False: target != torch.ops.aten.mul.Tensor)
    torch._dynamo.reset()
    neuron_compile.reset()
    out, grads = _run(torch.compile(flex_attention, backend="neuron"), "neuron")
    assert neuron_compile.report()["eager_ops"].get("flex_attention", 0) >= 1
    expected_out, expected_grads = _expected()
    for got, expected in zip([out.detach(), *grads], [expected_out.detach(), *expected_grads]):
        torch.testing.assert_close(got.cpu(), expected, atol=2e-5, rtol=1e-4)


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


@pytest.mark.parametrize("positions, raises", [(2 * L - 1, False), (L, True)])
def test_a_bias_table_indexed_out_of_range_in_a_compiled_score_mod_raises(positions, raises):
    """The score_mod runs under vmap, whose trace its checks leave as grids of conditions: an index beyond
    the table raised on the CPU and clamped silently on neuron."""
    table = torch.randn(H, positions)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + table_on_neuron[h, q_idx - kv_idx + L - 1]

    q, k, v = (t.to("neuron") for t in _inputs())
    table_on_neuron = table.to("neuron")
    compiled = torch.compile(lambda q, k, v: flex_attention(q, k, v, score_mod=score_mod), backend="neuron")
    if raises:
        with pytest.raises(IndexError, match=f"out of bounds for dimension 1 with size {L}"):
            compiled(q, k, v).cpu()
        return
    rows, cols = torch.arange(L)[:, None], torch.arange(L)[None, :]
    q, k, v = _inputs()
    scores = q @ k.transpose(-1, -2) / math.sqrt(D) + table[:, rows - cols + L - 1]
    torch.testing.assert_close(compiled(*(t.to("neuron") for t in (q, k, v))).cpu(), torch.softmax(scores, -1) @ v,
                               rtol=1e-4, atol=1e-4)
