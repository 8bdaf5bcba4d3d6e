"""torchneuron.kernels.lib: each kernel forward and backward against the PyTorch reference on the CPU, in
float32 and bfloat16 (the reference computes in float32 from the same rounded inputs)."""
import pytest
import torch
import torch.nn.functional as F

from torchneuron.kernels import lib

DTYPES = [torch.float32, torch.bfloat16]
SLOW = pytest.mark.slow  # the second dtype of a kernel the default run already covers in the first


def dtypes(fast):
    """Both dtypes, the one not named `fast` marked slow (compiling every kernel twice is most of the time)."""
    return [d if d == fast else pytest.param(d, marks=SLOW) for d in DTYPES]


def relative(a, b):
    return ((a.detach().cpu().float() - b.detach().float()).norm() / b.detach().float().norm().clamp_min(1e-12)).item()


def check(entry, reference, inputs, dtype, *, grad_of=None, tol=None, out=lambda o: o):
    """entry(*neuron inputs) against reference(*float32 CPU inputs): outputs and the gradients of a random
    projection of the output with respect to the inputs whose positions are in `grad_of`."""
    tol = tol or (2e-5 if dtype == torch.float32 else 2e-2)
    inputs = [t.to(dtype) if t.is_floating_point() else t for t in inputs]
    grad_of = range(len(inputs)) if grad_of is None else grad_of
    ref_in = [t.detach().float().clone().requires_grad_(i in grad_of) if t.is_floating_point() else t for i, t in enumerate(inputs)]
    dev_in = [t.detach().to("neuron").requires_grad_(i in grad_of) if t.is_floating_point() else t.to("neuron")
              for i, t in enumerate(inputs)]
    expected, got = out(reference(*ref_in)), out(entry(*dev_in))
    assert got.device.type == "neuron" and got.dtype == dtype and got.shape == expected.shape
    assert relative(got, expected) < tol
    weight = torch.randn(expected.shape)
    (expected * weight).sum().backward()
    (got * weight.to(dtype).to("neuron")).sum().backward()
    for i in grad_of:
        assert dev_in[i].grad is not None and dev_in[i].grad.dtype == dtype, i
        assert relative(dev_in[i].grad, ref_in[i].grad) < tol, (i, relative(dev_in[i].grad, ref_in[i].grad))


@pytest.mark.parametrize("dtype", dtypes(torch.float32))
def test_rms_norm(dtype):
    def reference(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    check(lib.rms_norm, reference, [torch.randn(3, 50, 96), torch.randn(96)], dtype)


@pytest.mark.parametrize("dtype", dtypes(torch.bfloat16))
def test_layer_norm_fused_with_the_residual_add(dtype):
    def reference(x, w, b, r):
        h = x + r
        return torch.cat([F.layer_norm(h, (96,), w, b), h], -1)

    def entry(x, w, b, r):
        return torch.cat(lib.layer_norm(x, w, b, residual=r), -1)
    check(entry, reference, [torch.randn(150, 96), torch.randn(96), torch.randn(96), torch.randn(150, 96)], dtype)


def _rotate_half(x):
    a, b = x.chunk(2, -1)
    return torch.cat((-b, a), -1)


@pytest.mark.parametrize("dtype", dtypes(torch.float32))
def test_rope_as_transformers_applies_it(dtype):
    def reference(x, cos, sin):
        return x * cos[:, None] + _rotate_half(x) * sin[:, None]
    angles = torch.rand(2, 140, 8) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    check(lib.rope, reference, [torch.randn(2, 3, 140, 16), cos, sin], dtype, grad_of=[0])


@pytest.mark.parametrize("dtype", dtypes(torch.float32))
def test_swiglu(dtype):
    def reference(x, wg, wu, wd):
        return (F.silu(x @ wg) * (x @ wu)) @ wd
    check(lib.swiglu, reference, [torch.randn(2, 70, 160), torch.randn(160, 600) / 12, torch.randn(160, 600) / 12,
                                  torch.randn(600, 160) / 24], dtype)


def _attention_reference(causal=False, window=None, segments=None):
    def reference(q, k, v):
        heads, kv_heads, queries, keys = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
        k, v = (t.repeat_interleave(heads // kv_heads, 1) for t in (k, v))
        i, j = torch.arange(queries)[:, None], torch.arange(keys)[None]
        mask = torch.ones(queries, keys, dtype=torch.bool)
        if causal:
            mask &= j <= i
        if window is not None:
            mask &= (j >= i - window[0]) & (j <= i + window[1])
        if segments is not None:
            mask &= segments[:, None] == segments[None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return reference


@pytest.mark.parametrize("dtype, causal, window, kv_heads", [
    (torch.float32, True, None, 2),       # causal, GQA
    pytest.param(torch.float32, False, (20, 30), 1, marks=SLOW),  # sliding window, MQA
    (torch.bfloat16, True, (40, 0), 4),   # causal sliding window, MHA
])
def test_flash_attention(dtype, causal, window, kv_heads):
    q, k, v = torch.randn(2, 4, 200, 32), torch.randn(2, kv_heads, 150, 32), torch.randn(2, kv_heads, 150, 32)
    check(lambda q, k, v: lib.flash_attention(q, k, v, causal=causal, window=window),
          _attention_reference(causal, window), [q, k, v], dtype)


def test_flash_attention_behind_sdpa_on_request():
    q, k, v = (torch.randn(1, 4, 130, 16, device="neuron", requires_grad=True) for _ in range(3))
    seen = []

    with lib.use_for_sdpa():
        from torchneuron.ops import attention
        kernel = attention.kernel_override
        attention.kernel_override = lambda *a, **kw: seen.append(kw) or kernel(*a, **kw)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.sum().backward()
        attention.kernel_override = kernel
    assert attention.kernel_override is None and seen == [dict(causal=True, scale=None, dropout_p=0.0)]
    expected = _attention_reference(causal=True)(*(t.detach().cpu() for t in (q, k, v)))
    torch.testing.assert_close(out.detach().cpu(), expected, atol=1e-5, rtol=1e-5)
    assert q.grad is not None

    torch._dynamo.reset()
    with lib.use_for_sdpa():  # compiled: AOTAutograd traces through the same choice
        kernel = attention.kernel_override
        attention.kernel_override = lambda *a, **kw: seen.append(kw) or kernel(*a, **kw)
        compiled = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                 backend="neuron")
        torch.testing.assert_close(compiled(q, k, v).detach().cpu(), expected, atol=1e-5, rtol=1e-5)
        attention.kernel_override = kernel
    assert len(seen) > 1

    wide = torch.randn(1, 2, 8, 160, device="neuron", dtype=torch.float64)  # declined: the built-in lowering runs
    with lib.use_for_sdpa():
        torch.testing.assert_close(F.scaled_dot_product_attention(wide, wide, wide).cpu(),
                                   F.scaled_dot_product_attention(*(wide.cpu(),) * 3))


def test_flash_attention_dropout_draws_from_the_device_generator():
    q, k, v = torch.randn(1, 2, 100, 16), torch.randn(1, 2, 100, 16), torch.randn(1, 2, 100, 16)
    qn, kn, vn = (t.to("neuron").requires_grad_() for t in (q, k, v))
    torch.manual_seed(7)
    seed = lib.flash_attention_seed(qn, 0.3)
    torch.manual_seed(7)
    out = lib.flash_attention(qn, kn, vn, dropout_p=0.3)
    torch.manual_seed(7)
    again = lib.flash_attention(qn, kn, vn, dropout_p=0.3)
    torch.testing.assert_close(out, again)
    keep = lib.dropout_keep(qn, kn, seed, 0.3).cpu()
    assert abs(keep.float().mean().item() - 0.7) < 0.02
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    probabilities = torch.softmax(qr @ kr.transpose(-1, -2) / 4, -1)
    expected = (probabilities * keep / 0.7) @ vr
    torch.testing.assert_close(out.detach().cpu(), expected.detach(), atol=1e-5, rtol=1e-5)
    weight = torch.randn(expected.shape)
    (expected * weight).sum().backward()
    (out * weight.to("neuron")).sum().backward()
    for got, want in ((qn, qr), (kn, kr), (vn, vr)):
        torch.testing.assert_close(got.grad.cpu(), want.grad, atol=1e-5, rtol=1e-4)


def test_flash_attention_variable_length():
    lengths = [70, 150, 40]
    cu_seqlens = torch.tensor([0, 70, 220, 260], dtype=torch.int32)
    q, k, v = torch.randn(260, 4, 16), torch.randn(260, 2, 16), torch.randn(260, 2, 16)
    segments = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))

    def reference(q, k, v):
        pack = (lambda t: t.transpose(0, 1)[None])
        return _attention_reference(causal=True, segments=segments)(pack(q), pack(k), pack(v))[0].transpose(0, 1)

    check(lambda q, k, v: lib.flash_attention(q, k, v, causal=True, cu_seqlens=cu_seqlens.to("neuron")),
          reference, [q, k, v], torch.float32)


def test_flash_attention_bad_input():
    q = torch.randn(1, 3, 8, 16, device="neuron")
    with pytest.raises(RuntimeError, match="3 query heads do not group over 2"):
        lib.flash_attention(q, torch.randn(1, 2, 8, 16, device="neuron"), torch.randn(1, 2, 8, 16, device="neuron"))
    with pytest.raises(TypeError, match="share a floating point dtype"):
        lib.flash_attention(q, q.half(), q)
    with pytest.raises(ValueError, match="dropout_p"):
        lib.flash_attention(q, q, q, dropout_p=1.5)


@pytest.mark.parametrize("dtype", dtypes(torch.bfloat16))
def test_linear_cross_entropy_without_the_logits_gradient(dtype):
    target = torch.randint(0, 700, (3, 50))
    target[0, :5] = -100

    def reference(h, w):
        return F.cross_entropy((h @ w.t()).reshape(-1, 700), target.reshape(-1)).reshape(1)

    check(lambda h, w: lib.linear_cross_entropy(h, w, target.to("neuron")).reshape(1), reference,
          [torch.randn(3, 50, 160), torch.randn(700, 160) / 10], dtype)


@pytest.mark.parametrize("dtype", dtypes(torch.float32))
def test_fused_adamw_steps_as_torch_optim_adamw(dtype):
    shapes = [(30, 20), (7,), (300,)]
    reference = [torch.randn(s).to(dtype) for s in shapes]
    params = [p.to("neuron") for p in reference]
    moments = [[torch.zeros_like(p) for p in params] for _ in range(2)]
    optimizer = torch.optim.AdamW([p.float().requires_grad_() for p in reference], lr=0.01, weight_decay=0.1)
    for step in range(1, 4):
        grads = [torch.randn(s).to(dtype) for s in shapes]
        for p, g in zip(optimizer.param_groups[0]["params"], grads):
            p.grad = g.float()
        optimizer.step()
        lib.adamw_step(params, [g.to("neuron") for g in grads], *moments, step=step, lr=0.01, weight_decay=0.1)
    for got, want in zip(params, optimizer.param_groups[0]["params"]):
        assert got.dtype == dtype
        assert relative(got, want.to(dtype)) < (1e-6 if dtype == torch.float32 else 1e-2)


def moe_reference(layer, x):
    """The eager composition the MoE kernels replace: dense per-expert compute, masks for routing."""
    logits = layer.router(x)
    capacity, experts = layer.capacity(x.shape[0]), layer.experts
    top = logits.topk(layer.k).indices
    weight = torch.softmax(logits, -1).gather(1, top)
    weight = weight / weight.sum(-1, keepdim=True)
    counts, out = torch.zeros(experts), torch.zeros_like(x)
    for choice in range(layer.k):
        onehot = F.one_hot(top[:, choice], experts).float()
        position = ((onehot.cumsum(0) - onehot + counts) * onehot).sum(-1)
        counts = counts + onehot.sum(0)
        for e in range(experts):
            routed = ((top[:, choice] == e) & (position < capacity)).float() * weight[:, choice]
            out = out + routed[:, None] * (F.silu(x @ layer.w1[e]) @ layer.w2[e])
    return out


def test_moe_pieces_against_torch():
    torch.manual_seed(0)
    logits = torch.randn(300, 8)
    chosen, slots = lib.route(logits.to("neuron"), 2, 80)
    assert torch.equal(chosen.cpu(), logits.topk(2).indices.int())
    assert (slots.cpu() == -1).sum() > 0 and slots.cpu().max() == 79
    check(lib.grouped_matmul, lambda a, b: a @ b, [torch.randn(3, 140, 70), torch.randn(3, 70, 40)], torch.float32)
    slot = torch.tensor([[0, 3], [2, -1], [-1, 1]], dtype=torch.int32)
    x = torch.randn(3, 5)
    buffer = lib.permute(x.to("neuron"), slot.to("neuron"), 4).cpu()
    torch.testing.assert_close(buffer, torch.stack([x[0], x[2], x[1], x[0]]))


@SLOW  # test_small_moe_trains_to_the_eager_reference_loss checks the same gradients by training
@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_layer_forward_and_backward(dtype):
    torch.manual_seed(0)
    layer = lib.MoE(32, 64, experts=4, k=2, capacity_factor=1.0)
    device_layer = lib.MoE(32, 64, experts=4, k=2, capacity_factor=1.0)
    device_layer.load_state_dict(layer.state_dict())
    device_layer.to(device="neuron", dtype=dtype)

    def entry(x, router, w1, w2):
        return torch.func.functional_call(device_layer, {"router.weight": router, "w1": w1, "w2": w2}, (x,))

    def reference(x, router, w1, w2):
        return moe_reference(_Bound(layer, router, w1, w2), x)

    check(entry, reference, [torch.randn(150, 32), layer.router.weight.detach(), layer.w1.detach(),
                             layer.w2.detach()], dtype, tol=1e-4 if dtype == torch.float32 else 3e-2)


class _Bound:
    """A MoE layer's hyperparameters with given weights (for the functional reference)."""

    def __init__(self, layer, router, w1, w2):
        self.k, self.experts, self.capacity = layer.k, layer.experts, layer.capacity
        self.router, self.w1, self.w2 = (lambda x: x @ router.t()), w1, w2


def test_small_moe_trains_to_the_eager_reference_loss():
    torch.manual_seed(0)
    layer = lib.MoE(16, 32, experts=4, k=2)
    device_layer = lib.MoE(16, 32, experts=4, k=2)
    device_layer.load_state_dict(layer.state_dict())
    device_layer.to("neuron")
    x, y = torch.randn(200, 16), torch.randn(200, 16)
    losses = []
    for model, forward, inputs in ((layer, lambda m, a: moe_reference(m, a), (x, y)),
                                   (device_layer, lambda m, a: m(a), (x.to("neuron"), y.to("neuron")))):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        run = []
        for _ in range(8):
            loss = (forward(model, inputs[0]) - inputs[1]).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            run.append(loss.item())
        losses.append(run)
    assert losses[0][-1] < losses[0][0] * 0.9
    torch.testing.assert_close(torch.tensor(losses[1]), torch.tensor(losses[0]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", dtypes(torch.bfloat16))
def test_paged_attention_decode(dtype):
    torch.manual_seed(0)
    block_size, blocks, kv_heads, heads, dim = 16, 12, 2, 8, 32
    k_cache, v_cache = torch.randn(blocks, block_size, kv_heads, dim), torch.randn(blocks, block_size, kv_heads, dim)
    block_table = torch.tensor([[3, 7, 1, 0], [5, 2, 11, 9], [4, -1, -1, -1]], dtype=torch.int32)
    seq_lens = torch.tensor([40, 64, 9], dtype=torch.int32)
    q = torch.randn(3, heads, dim)
    expected = []
    for b in range(3):
        rows = torch.cat([torch.arange(block_size) + block_size * int(i) for i in block_table[b] if i >= 0])
        rows = rows[:seq_lens[b]]
        k = k_cache.reshape(-1, kv_heads, dim)[rows].transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        v = v_cache.reshape(-1, kv_heads, dim)[rows].transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        expected.append(F.scaled_dot_product_attention(q[b][:, None].to(dtype).float(), k.to(dtype).float(),
                                                       v.to(dtype).float())[:, 0])
    got = lib.paged_attention_decode(*(t.to(dtype).to("neuron") for t in (q, k_cache, v_cache)),
                                     block_table.to("neuron"), seq_lens.to("neuron"))
    assert got.dtype == dtype
    assert relative(got, torch.stack(expected)) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_library_kernels_compile_as_nodes_of_one_program():
    from torchneuron import compile as neuron_compile

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(64))
            self.linear = torch.nn.Linear(64, 64)

        def forward(self, x, use_kernel=True):
            if use_kernel:
                return self.linear(lib.rms_norm(x, self.weight))
            return self.linear(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight)

    torch.manual_seed(0)
    model = Block()
    device_model = Block().to("neuron")
    device_model.load_state_dict(model.state_dict())
    x = torch.randn(130, 64)
    torch._dynamo.reset()
    neuron_compile.reset()
    compiled = torch.compile(device_model, backend="neuron")
    out = compiled(x.to("neuron"))
    out.square().mean().backward()
    expected = model(x, use_kernel=False)
    expected.square().mean().backward()
    torch.testing.assert_close(out.detach().cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(device_model.weight.grad.cpu(), model.weight.grad, rtol=1e-4, atol=1e-5)
    report = neuron_compile.report()
    assert report["dynamo_graphs"] == 1 and report["graphs"] == 2 and not report["eager_ops"]


def test_fused_adamw_steps_over_its_lists_without_concatenating_them():
    params = [torch.randn(64, 1024, device="neuron") for _ in range(4)]
    grads = [torch.randn_like(p) for p in params]
    moments = [[torch.zeros_like(p) for p in params] for _ in range(2)]
    lib.adamw_step(params, grads, *moments, step=1, lr=1e-3)  # compiles
    torch.neuron.synchronize()
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.memory_allocated()
    lib.adamw_step(params, grads, *moments, step=2, lr=1e-3)
    torch.neuron.synchronize()
    size = sum(p.numel() * p.element_size() for p in params)
    # the new params and moments (3 sizes); concatenating the four lists first took 4 more
    assert torch.neuron.max_memory_allocated() - base <= 3 * size, (torch.neuron.max_memory_allocated() - base) / size
