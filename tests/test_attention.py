"""F.scaled_dot_product_attention on neuron: the fused, blockwise lowering by default (as flash attention's op
without a mask, else as the overrideable op), the math path on request."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torchneuron import compile as neuron_compile
from torchneuron.eager import adaptive, fallback

aten = torch.ops.aten
FUSED = "ScaledDotProductFusedAttentionOverrideableBackward0"
FLASH = "ScaledDotProductFlashAttentionBackward0"


def _inputs(dtype, kv_heads=4, keys=150, mask=None, seed=0, value_dim=8):
    """Keys span three blocks, the last one padded; queries fewer than keys. Values narrower than queries
    and keys are the overrideable op's (flash attention's op gives outputs the query's width)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, 37, 16, generator=g).to(dtype)
    k = torch.randn(2, kv_heads, keys, 16, generator=g).to(dtype)
    v = torch.randn(2, kv_heads, keys, value_dim, generator=g).to(dtype)
    if mask == "bool":
        m = torch.rand(37, keys, generator=g) > 0.3
        m[5] = False  # a fully masked row gives zeros, as the math path's _safe_softmax does
    elif mask == "additive":
        m = (torch.randn(2, 1, 37, keys, generator=g) * 2).to(dtype).requires_grad_()
    elif mask == "per-head row":  # one row per head, broadcast over the queries
        m = (torch.randn(2, 4, 1, keys, generator=g) * 2).to(dtype).requires_grad_()
    else:
        m = None
    return q, k, v, m


def _attend(fn, device, q, k, v, m, **kwargs):
    leaves = [t.detach().to(device).requires_grad_(t.requires_grad or t.is_floating_point()) for t in (q, k, v)]
    mask = None if m is None else m.detach().to(device).requires_grad_(m.requires_grad)
    out = fn(*leaves, attn_mask=mask, **kwargs)
    weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.dtype).to(device)
    (out * weights).sum().backward()
    grads = [t.grad for t in leaves] + ([mask.grad] if mask is not None and mask.requires_grad else [])
    return out, grads


CASES = [
    dict(dtype=torch.float32),
    dict(dtype=torch.float32, is_causal=True),
    dict(dtype=torch.float32, mask="bool"),
    dict(dtype=torch.float32, mask="additive", scale=0.3),
    dict(dtype=torch.float32, kv_heads=2, enable_gqa=True, is_causal=True),
    dict(dtype=torch.float32, mask="per-head row"),
    # grouped heads with masks shared by all heads, one per batch, one row per head
    dict(dtype=torch.float32, kv_heads=2, enable_gqa=True, mask="bool"),
    dict(dtype=torch.float32, kv_heads=2, enable_gqa=True, mask="additive"),
    dict(dtype=torch.float32, kv_heads=2, enable_gqa=True, mask="per-head row"),
    dict(dtype=torch.bfloat16, is_causal=True),
    dict(dtype=torch.float32, value_dim=16),
    dict(dtype=torch.float32, value_dim=16, kv_heads=2, enable_gqa=True, is_causal=True, scale=0.3),
    dict(dtype=torch.bfloat16, value_dim=16, is_causal=True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_fused_attention_matches_the_cpu_forward_and_backward(case):
    case = dict(case)
    dtype, kv_heads, mask = case.pop("dtype"), case.pop("kv_heads", 4), case.pop("mask", None)
    value_dim = case.pop("value_dim", 8)
    q, k, v, m = _inputs(dtype, kv_heads, mask=mask, value_dim=value_dim)
    expected, expected_grads = _attend(F.scaled_dot_product_attention, "cpu", q, k, v, m, **case)
    with fallback.as_error():
        got, grads = _attend(F.scaled_dot_product_attention, "neuron", q, k, v, m, **case)
    assert type(got.grad_fn).__name__ == (FLASH if value_dim == 16 and mask is None else FUSED)
    tolerance = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(got.cpu(), expected, **tolerance)
    for g, e in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g.cpu(), e, **tolerance)


def test_compiled_attention_is_one_program_and_matches_the_cpu():
    q, k, v, m = _inputs(torch.float32, kv_heads=2, mask="additive")

    def attend(q, k, v, attn_mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=True).relu()

    expected, expected_grads = _attend(attend, "cpu", q, k, v, m)
    neuron_compile.reset()
    with fallback.as_error():
        got, grads = _attend(torch.compile(attend, backend="neuron"), "neuron", q, k, v, m)
    torch.testing.assert_close(got.cpu(), expected, atol=2e-5, rtol=1e-4)
    for g, e in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g.cpu(), e, atol=2e-5, rtol=1e-4)
    report = neuron_compile.report()
    assert report["graphs"] == 2 and not report["eager_ops"]


def test_adaptive_eager_queues_the_fused_attention():
    q, k, v, m = _inputs(torch.float32, mask="bool")
    expected, expected_grads = _attend(F.scaled_dot_product_attention, "cpu", q, k, v, m, dropout_p=0.0)
    fused_before = adaptive.stats()["ops_fused"]
    with fallback.as_error(), torch.neuron.adaptive_eager():
        for _ in range(3):  # queued once its executables have run, fused from the queue's second sighting
            got, grads = _attend(F.scaled_dot_product_attention, "neuron", q, k, v, m, dropout_p=0.0)
    assert adaptive.stats()["ops_fused"] > fused_before
    assert type(got.grad_fn).__name__ == FUSED
    torch.testing.assert_close(got.cpu(), expected, atol=2e-5, rtol=1e-4)
    for g, e in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g.cpu(), e, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_flash_op_returns_the_cpu_log_sum_exp(is_causal):
    """Context parallelism merges the chunks of a sequence by the flash op's logsumexp output."""
    q, k, v, _ = _inputs(torch.float32, keys=37, value_dim=16)
    expected = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=is_causal)
    got = aten._scaled_dot_product_flash_attention(*(t.to("neuron") for t in (q, k, v)), is_causal=is_causal)
    for name, g, e in zip(("output", "logsumexp"), got[:2], expected, strict=True):
        torch.testing.assert_close(g.cpu(), e, atol=2e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")
    assert (got[6].shape, got[6].dtype, got[7].dtype) == ((2,), torch.uint64, torch.uint64)


def test_sdpa_kernel_selects_the_backend_or_refuses():
    q, k, v, _ = _inputs(torch.float32, value_dim=16)
    with sdpa_kernel(SDPBackend.MATH):
        out, _ = _attend(F.scaled_dot_product_attention, "neuron", q, k, v, None, is_causal=True)
    assert type(out.grad_fn).__name__ not in (FUSED, FLASH)
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    for backend, name in ((SDPBackend.FLASH_ATTENTION, FLASH), (SDPBackend.OVERRIDEABLE, FUSED)):
        with sdpa_kernel(backend):
            out, _ = _attend(F.scaled_dot_product_attention, "neuron", q, k, v, None)
        assert type(out.grad_fn).__name__ == name
    mask = torch.ones(37, 150, dtype=torch.bool, device="neuron")
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), pytest.raises(RuntimeError, match="No available kernel"):
        F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), attn_mask=mask)


@pytest.mark.parametrize("value_dim", [8, 16], ids=["overrideable", "flash"])
def test_dropout_is_seeded_and_its_backward_uses_the_forward_mask(value_dim):
    q, k, v = (t.double().to("neuron") for t in _inputs(torch.float32, value_dim=value_dim)[:3])

    def attend(query):
        torch.manual_seed(7)
        return F.scaled_dot_product_attention(query, k, v, dropout_p=0.4)

    plain = F.scaled_dot_product_attention(q, k, v)
    first, again = attend(q), attend(q)
    torch.testing.assert_close(first.cpu(), again.cpu())
    assert not torch.allclose(first.cpu(), plain.cpu())
    # the backward recomputes the forward's dropout mask: its gradient is the finite difference
    direction, weights = torch.randn_like(q), torch.randn_like(first)
    leaf = q.detach().requires_grad_()
    (attend(leaf) * weights).sum().backward()
    step = 1e-6
    numeric = ((attend(q + step * direction) - attend(q - step * direction)) * weights).sum() / (2 * step)
    torch.testing.assert_close((leaf.grad * direction).sum().cpu(), numeric.cpu(), rtol=1e-5, atol=1e-5)


def test_attention_inputs_are_checked_as_on_the_cpu():
    q, k, v, _ = _inputs(torch.float32, kv_heads=2)
    bad_mask = torch.ones(3, 37, 150, dtype=torch.bool)
    for args, kwargs in (((q, k.double(), v.double()), {}), ((q, k, v), {}), ((q, q, q), {"attn_mask": bad_mask})):
        with pytest.raises(RuntimeError) as cpu:
            F.scaled_dot_product_attention(*args, **kwargs)
        with pytest.raises(type(cpu.value), match="dtype" if args[1].dtype != q.dtype else None):
            F.scaled_dot_product_attention(*(t.to("neuron") for t in args),
                                           **{name: m.to("neuron") for name, m in kwargs.items()})


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_attention_memory_stays_far_below_the_score_matrix(compiled):
    """B1 H8 S2048 D64 float32: the causal score matrix alone is 128 MiB; inputs, output and gradients 32 MiB."""
    q, k, v = (torch.randn(1, 8, 2048, 64, device="neuron", requires_grad=True) for _ in range(3))
    grad = torch.randn(1, 8, 2048, 64, device="neuron")

    def step(q, k, v, grad):
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    run = torch.compile(step, backend="neuron") if compiled else step
    torch.neuron.synchronize()
    torch.neuron.reset_peak_memory_stats()
    run(q, k, v, grad)
    torch.neuron.synchronize()
    assert torch.neuron.max_memory_allocated() <= 40 * 2**20


def _module_pair(make):
    torch.manual_seed(0)
    cpu, neuron = make().eval(), make().to("neuron").eval()
    neuron.load_state_dict(cpu.state_dict())
    return cpu, neuron


_CAUSAL = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
_PADDED = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
_EMPTY_ROW = torch.tensor([[False] * 5, [True] * 5])  # every key excluded: nan, as on the CPU


@pytest.mark.parametrize("attn_mask, key_padding_mask", [(None, None), (_CAUSAL, None), (None, _PADDED),
                                                         (_CAUSAL, _PADDED), (None, _EMPTY_ROW)])
def test_multihead_attention_inference_fast_path_matches_the_cpu(attn_mask, key_padding_mask):
    """Under no_grad in eval mode nn.MultiheadAttention self-attention (torchvision's ViT) is one fused op,
    `_native_multi_head_attention`, which ran on the CPU before it was lowered (ops/transformer.py)."""
    fallback.reset()
    cpu, neuron = _module_pair(lambda: torch.nn.MultiheadAttention(16, 2, batch_first=True))
    x = torch.randn(2, 5, 16)
    x_neuron = x.to("neuron")

    def on(device, t):
        return None if t is None else t.to(device)

    with torch.no_grad():
        expected = cpu(x, x, x, need_weights=False, attn_mask=attn_mask, key_padding_mask=key_padding_mask)[0]
        got = neuron(x_neuron, x_neuron, x_neuron, need_weights=False, attn_mask=on("neuron", attn_mask),
                     key_padding_mask=on("neuron", key_padding_mask))[0]
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5, equal_nan=True)
    assert fallback.report() == {}


@pytest.mark.parametrize("norm_first, activation", [(False, "relu"), (True, "gelu")])
@pytest.mark.parametrize("mask, padding", [(None, None), (_CAUSAL, None), (None, _PADDED)])
def test_transformer_encoder_inference_fast_path_matches_the_cpu(norm_first, activation, mask, padding):
    """Under no_grad in eval mode each nn.TransformerEncoderLayer is one fused op,
    `_transformer_encoder_layer_fwd`, which ran on the CPU before it was lowered."""
    fallback.reset()

    def make():
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation=activation, batch_first=True,
                                                 norm_first=norm_first)
        return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    cpu, neuron = _module_pair(make)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        expected = cpu(x, mask=mask, src_key_padding_mask=padding)
        got = neuron(x.to("neuron"), mask=None if mask is None else mask.to("neuron"),
                     src_key_padding_mask=None if padding is None else padding.to("neuron"))
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)
    assert fallback.report() == {}


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("padding", [_PADDED, torch.zeros(2, 5).masked_fill(_PADDED, float("-inf")),
                                     _PADDED.flip(-1)], ids=["bool", "float", "padded first"])
def test_transformer_encoder_nested_tensor_path_gives_the_cpus_output(norm, padding):
    """With a padding mask under no_grad, nn.TransformerEncoder (enable_nested_tensor=True, the default) packs
    its unpadded tokens into a nested tensor, which neuron cannot hold, and unpads the result with zeros: on
    neuron its layers take the padding mask instead, and the padded positions get what the CPU gives them."""
    fallback.reset()

    def make():
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        return torch.nn.TransformerEncoder(layer, 2, norm=torch.nn.LayerNorm(16) if norm else None)

    cpu, neuron = _module_pair(make)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        expected = cpu(x, src_key_padding_mask=padding)
        got = neuron(x.to("neuron"), src_key_padding_mask=padding.to("neuron"))
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)
    if padding is _PADDED and not norm:
        assert expected[1, 3:].abs().sum() == 0  # the CPU did take its nested tensor path
    assert fallback.report() == {} and neuron.use_nested_tensor
    with pytest.raises(NotImplementedError, match="nested tensors cannot live on neuron"):
        torch._nested_tensor_from_mask(x.to("neuron"), padding.to("neuron") == 0)


def _jagged(sequences, device):
    return torch.nested.nested_tensor([s.to(device) for s in sequences], layout=torch.jagged, requires_grad=True)


@pytest.mark.parametrize("is_causal,cross", [(False, False), (True, False), (False, True)])
def test_attention_of_jagged_nested_tensors_attends_within_each_sequence(is_causal, cross):
    """Jagged nested tensors' SDPA takes flash attention's op for packed sequences, as on CUDA (the CPU's math
    path converts to strided nested tensors, which neuron cannot hold; it failed): each sequence attends to its
    own keys, as dense attention of each sequence on the CPU does, gradients too."""
    torch.manual_seed(0)
    queries = [torch.randn(n, 2, 8) for n in (3, 5, 1)]
    keys = [torch.randn(n, 2, 8) for n in (4, 2, 6)] if cross else queries
    weights = torch.randn(9, 2, 8)
    with fallback.as_error():
        q = _jagged(queries, "neuron")
        k = _jagged(keys, "neuron") if cross else q
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2),
                                             is_causal=is_causal).transpose(1, 2)
        (out.values() * weights.to("neuron")).sum().backward()
    dense_q = [x.clone().requires_grad_() for x in queries]
    dense_k = [x.clone().requires_grad_() for x in keys] if cross else dense_q
    expected = torch.cat([F.scaled_dot_product_attention(a.transpose(0, 1), b.transpose(0, 1), b.transpose(0, 1),
                                                         is_causal=is_causal).transpose(0, 1)
                          for a, b in zip(dense_q, dense_k)])
    (expected * weights).sum().backward()
    torch.testing.assert_close(out.values().detach().cpu(), expected.detach())
    torch.testing.assert_close(q.grad.values().cpu(), torch.cat([x.grad for x in dense_q]))
    torch.testing.assert_close(k.grad.values().cpu(), torch.cat([x.grad for x in dense_k]))


def test_jagged_nested_tensors_pad_and_unpad_on_the_device():
    """Softmax over the ragged dimension and to_padded_tensor go through the padded <-> packed conversions, which
    ran on the CPU (a fallback each); they match the CPU's nested tensors, backward too."""
    def run(device):
        torch.manual_seed(0)
        x = _jagged([torch.randn(2, 3), torch.randn(5, 3), torch.randn(1, 3)], device)
        soft = x.softmax(dim=1)
        padded = x.to_padded_tensor(-1.0, output_size=(3, 6, 3))
        ((soft.values() * soft.values().detach().exp()).sum() + padded.sin().sum()).backward()
        return soft.values().detach().cpu(), padded.detach().cpu(), x.grad.values().cpu()

    fallback.reset()
    for on_neuron, on_cpu in zip(run("neuron"), run("cpu")):
        torch.testing.assert_close(on_neuron, on_cpu)
    # the op itself without total_L: the packed length is read from the offsets, as CUDA's kernel reads it
    dense, offsets = torch.randn(3, 5, 2), torch.tensor([0, 2, 7, 10])
    packed = torch.ops.aten._padded_dense_to_jagged_forward(dense.to("neuron"), [offsets.to("neuron")])
    assert torch.equal(packed.cpu(), torch.ops.aten._padded_dense_to_jagged_forward(dense, [offsets]))
    assert fallback.report() == {}


def test_compiled_attention_of_jagged_nested_tensors_matches_eager():
    """Under torch.compile the backward graph hands back the nested tensors' sequence-length tensors, empty CPU
    tensors the program never reads (the graph refused them as tensors of another device)."""
    def attend(q):
        t = q.transpose(1, 2)
        return F.scaled_dot_product_attention(t, t, t).transpose(1, 2).softmax(dim=1)

    torch.manual_seed(0)
    sequences = [torch.randn(3, 2, 8), torch.randn(5, 2, 8)]
    results = []
    for fn in (attend, torch.compile(attend, backend="neuron")):
        q = _jagged(sequences, "neuron")
        out = fn(q)
        (out.values() * out.values().detach().cos()).sum().backward()
        results.append((out.values().detach().cpu(), q.grad.values().cpu()))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager)
