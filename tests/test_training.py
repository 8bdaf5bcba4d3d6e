"""Training machinery on neuron against the CPU: optimizers, schedulers, clipping, AMP, checkpoints, data."""
import io

import pytest
import torch

import torchneuron
from torchneuron.eager import fallback


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(6, 4, generator=generator), torch.randn(6, 2, generator=generator)


def _run(device, make_optimizer, steps=3, schedule=None, clip=None):
    model = _model().to(device)
    optimizer = make_optimizer(model.parameters())
    scheduler = schedule(optimizer) if schedule else None
    x, y = (t.to(device) for t in _batch())
    for _ in range(steps):
        torch.nn.functional.mse_loss(model(x), y).backward()
        if clip:
            clip(model.parameters())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if scheduler:
            scheduler.step()
    assert all(p.grad is None for p in model.parameters())
    return [p.detach().cpu() for p in model.parameters()]


def _close(make_optimizer, **kwargs):
    fallback.reset()
    actual = _run("neuron", make_optimizer, **kwargs)
    assert torchneuron.fallback_report() == {}
    for a, e in zip(actual, _run("cpu", make_optimizer, **kwargs)):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)


OPTIMIZERS = {
    "sgd": lambda p, **k: torch.optim.SGD(p, lr=0.1, **k),
    "sgd_momentum": lambda p, **k: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01, **k),
    "sgd_nesterov": lambda p, **k: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, **k),
    "adam": lambda p, **k: torch.optim.Adam(p, lr=0.01, weight_decay=0.01, **k),
    "adam_amsgrad": lambda p, **k: torch.optim.Adam(p, lr=0.01, amsgrad=True, **k),
    "adamw": lambda p, **k: torch.optim.AdamW(p, lr=0.01, **k),
    "rmsprop": lambda p, **k: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True, **k),
    "adagrad": lambda p, **k: torch.optim.Adagrad(p, lr=0.1, **k),
}


@pytest.mark.parametrize("implementation", ["for_loop", "foreach"])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_optimizer(name, implementation):
    _close(lambda p: OPTIMIZERS[name](p, foreach=implementation == "foreach"))


FUSED = ["adam", "adam_amsgrad", "adamw", "sgd", "sgd_momentum", "sgd_nesterov", "adagrad"]


@pytest.mark.parametrize("name", FUSED)
def test_fused_optimizer(name):
    _close(lambda p: OPTIMIZERS[name](p, fused=True))


TENSOR_LR = {
    "adamw": torch.optim.AdamW,
    "sgd_momentum": lambda p, **k: torch.optim.SGD(p, momentum=0.9, **k),
    "adagrad": torch.optim.Adagrad,
}


@pytest.mark.parametrize("name", TENSOR_LR)
def test_fused_optimizer_with_tensor_lr_and_maximize(name):
    _close(lambda p: TENSOR_LR[name](p, lr=torch.tensor(0.05), fused=True, maximize=True))


def _fused_step(name, device, found_inf):
    """One fused step with gradients scaled by 4, as torch.amp.GradScaler makes it; the tensors after it."""
    params, grads = [torch.ones(3, device=device)], [torch.full((3,), 8.0, device=device)]
    state = [torch.full((3,), 0.5, device=device)]
    options = dict(grad_scale=torch.tensor(4.0, device=device), found_inf=torch.tensor(found_inf, device=device),
                   maximize=False, weight_decay=0.1)
    step = [torch.tensor(2.0, device=device)]
    if name == "adam":
        torch._fused_adam_(params, grads, state, [state[0].clone()], [], step, lr=0.1, beta1=0.9, beta2=0.99,
                           eps=1e-8, amsgrad=False, **options)
    elif name == "sgd":
        torch._fused_sgd_(params, grads, state, momentum=0.9, lr=0.1, dampening=0.0, nesterov=True,
                          is_first_step=False, **options)
    else:
        torch._fused_adagrad_(params, grads, state, step, lr=0.1, lr_decay=0.01, eps=1e-10, **options)
    return [t.cpu() for t in params + grads + state]


@pytest.mark.parametrize("found_inf", [0.0, 1.0])
@pytest.mark.parametrize("name", ["adam", "sgd", "adagrad"])
def test_fused_step_unscales_gradients_unless_the_scaler_found_inf(name, found_inf):
    # the CPU and CUDA kernels divide the gradients by the scale in place, and when the scaler found a
    # non-finite gradient return before writing anything
    for actual, expected in zip(_fused_step(name, "neuron", found_inf), _fused_step(name, "cpu", found_inf)):
        torch.testing.assert_close(actual, expected)


def test_foreach_is_the_default_on_neuron():
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = list(_model().to("neuron").parameters())
    assert _default_to_fused_or_foreach(params, differentiable=False, use_fused=False) == (False, True)


SCHEDULERS = {
    "step": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5),
    "cosine": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=3),
    "onecycle": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=4),
    "warmup": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda step: (step + 1) / 3),
}


@pytest.mark.parametrize("name", SCHEDULERS)
def test_lr_scheduler(name):
    _close(OPTIMIZERS["adamw"], schedule=SCHEDULERS[name])


@pytest.mark.parametrize("foreach", [False, True])
def test_clip_grad_norm(foreach):
    norms = {}

    def clip(device):
        def clip_(params):
            norms.setdefault(device, []).append(torch.nn.utils.clip_grad_norm_(params, 0.1, foreach=foreach).cpu())

        return clip_

    for device in ("neuron", "cpu"):
        _run(device, OPTIMIZERS["sgd"], clip=clip(device))
    torch.testing.assert_close(norms["neuron"], norms["cpu"], rtol=1e-5, atol=1e-5)
    _close(OPTIMIZERS["sgd"], clip=lambda p: torch.nn.utils.clip_grad_norm_(p, 0.1, foreach=foreach))


def test_zero_grad_keeps_tensors_without_set_to_none():
    model = _model().to("neuron")
    model(torch.ones(1, 4, device="neuron")).sum().backward()
    grads = [p.grad for p in model.parameters()]
    torch.optim.SGD(model.parameters(), lr=0.1).zero_grad(set_to_none=False)
    assert all(p.grad is g and p.grad.device.type == "neuron" and not p.grad.any() for p, g in
               zip(model.parameters(), grads))


# --- AMP -------------------------------------------------------------------------------------------------

# output dtypes under CUDA's autocast policy with bfloat16 (ATen/autocast_mode.h)
AUTOCAST_CASES = {
    "mm": (lambda a, b: a @ b, torch.bfloat16),
    "linear": (lambda a, b: torch.nn.functional.linear(a, b), torch.bfloat16),
    "bmm": (lambda a, b: torch.bmm(a[None], b[None]), torch.bfloat16),
    "softmax": (lambda a, b: torch.softmax(a.bfloat16(), -1), torch.float32),
    "exp": (lambda a, b: torch.exp(a.bfloat16()), torch.float32),
    "layer_norm": (lambda a, b: torch.nn.functional.layer_norm(a.bfloat16(), (4,)), torch.float32),
    "sum": (lambda a, b: a.bfloat16().sum(), torch.float32),
    "cross_entropy": (lambda a, b: torch.nn.functional.cross_entropy(a.bfloat16(), torch.tensor([0, 1, 2, 3], device=a.device)), torch.float32),
    "addcmul_promotes": (lambda a, b: torch.addcmul(a, a.bfloat16(), b), torch.float32),
    "add_unlisted": (lambda a, b: a.bfloat16() + 1, torch.bfloat16),
    "relu_unlisted": (lambda a, b: torch.relu(a), torch.float32),
}


@pytest.mark.parametrize("name", AUTOCAST_CASES)
def test_autocast_policy(name):
    fn, dtype = AUTOCAST_CASES[name]
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        actual = fn(a.to("neuron"), b.to("neuron"))
    assert actual.dtype == dtype
    # the same computation with the casts made explicit, on the CPU without autocast
    with torch.autocast("cpu", enabled=False):
        expected = fn(a.bfloat16().float() if dtype == torch.bfloat16 else a, b.bfloat16().float() if dtype == torch.bfloat16 else b)
    torch.testing.assert_close(actual.cpu().float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_autocast_training_step():
    model = _model().to("neuron")
    x, y = (t.to("neuron") for t in _batch())
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
    assert out.dtype == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    assert not torch.is_autocast_enabled("neuron")


def test_grad_scaler_float16():
    model = _model().to("neuron")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("neuron", init_scale=2.0**10, growth_interval=2)
    x, y = (t.to("neuron") for t in _batch())
    before = [p.detach().cpu().clone() for p in model.parameters()]
    for _ in range(3):
        with torch.autocast("neuron", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    assert scaler.get_scale() == 2.0**11
    assert all(not torch.equal(p.detach().cpu(), b) for p, b in zip(model.parameters(), before))

    # an inf gradient skips the step and halves the scale
    after = [p.detach().cpu().clone() for p in model.parameters()]
    model[0].weight.grad = torch.full_like(model[0].weight, float("inf"))
    scaler.step(optimizer)
    scaler.update()
    assert scaler.get_scale() == 2.0**10
    assert all(torch.equal(p.detach().cpu(), a) for p, a in zip(model.parameters(), after))


def test_torch_neuron_amp_is_torch_cuda_amp_for_neuron():
    model = _model().to("neuron")
    scaler = torch.neuron.amp.GradScaler(init_scale=2.0**10)
    assert scaler.get_scale() == 2.0**10 and scaler._device == "neuron"
    x, y = (t.to("neuron") for t in _batch())

    @torch.neuron.amp.autocast()
    def forward(x):
        return model(x)

    assert forward(x).dtype == torch.float16
    with torch.neuron.amp.autocast(dtype=torch.bfloat16):
        assert model(x).dtype == torch.bfloat16

    class Doubled(torch.autograd.Function):
        @staticmethod
        @torch.neuron.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, t):
            assert not torch.is_autocast_enabled("neuron")
            return t * 2

        @staticmethod
        @torch.neuron.amp.custom_bwd
        def backward(ctx, grad):
            return grad * 2

    with torch.neuron.amp.autocast():
        assert Doubled.apply(x.half()).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sync_batch_norm_steps_pool_two_halves_as_one_batch(dtype):
    """SyncBatchNorm's per-process kernels (CUDA's alone in PyTorch), as two processes holding half a batch
    each use them, give what batch norm gives the whole batch: output, running statistics, gradients."""
    generator = torch.Generator().manual_seed(0)
    x, grad = (torch.randn(8, 3, 5, 5, generator=generator).to(dtype) for _ in range(2))
    weight, bias = torch.randn(3, generator=generator), torch.randn(3, generator=generator)
    device = [t.to("neuron") for t in (x, grad, weight, bias)]
    halves, grad_halves = device[0].chunk(2), device[1].chunk(2)
    running_mean, running_var = torch.zeros(3, device="neuron"), torch.ones(3, device="neuron")
    with fallback.as_error():
        stats = [torch.batch_norm_stats(half, 1e-5) for half in halves]
        counts = torch.full((2,), 100.0, device="neuron")
        mean, invstd = torch.batch_norm_gather_stats_with_counts(
            halves[0], torch.stack([m for m, _ in stats]), torch.stack([s for _, s in stats]), running_mean,
            running_var, 0.1, 1e-5, counts)
        out = torch.cat([torch.batch_norm_elemt(half, device[2], device[3], mean, invstd, 1e-5) for half in halves])
        sums = [torch.batch_norm_backward_reduce(g, half, mean, invstd, device[2], True, True, True)
                for g, half in zip(grad_halves, halves)]
        sum_dy, sum_dy_xmu, grad_weight, grad_bias = (sum(parts) for parts in zip(*sums))
        count = torch.full((2,), 100, dtype=torch.int32, device="neuron")
        grad_x = torch.cat([torch.batch_norm_backward_elemt(g, half, mean, invstd, device[2], sum_dy, sum_dy_xmu, count)
                            for g, half in zip(grad_halves, halves)])
    assert mean.dtype == invstd.dtype == torch.float32 and out.dtype == grad_x.dtype == dtype

    reference = [t.clone().requires_grad_() for t in (x, weight, bias)]
    reference_mean, reference_var = torch.zeros(3), torch.ones(3)
    expected = torch.nn.functional.batch_norm(reference[0].float(), reference_mean, reference_var, reference[1],
                                              reference[2], training=True, momentum=0.1, eps=1e-5)
    expected.backward(grad.float())
    tolerance = dict(rtol=1e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.cpu(), expected.detach().to(dtype), **tolerance)
    torch.testing.assert_close(running_mean.cpu(), reference_mean, **tolerance)
    torch.testing.assert_close(running_var.cpu(), reference_var, **tolerance)
    for actual, wanted in zip((grad_x, grad_weight, grad_bias), reference):
        torch.testing.assert_close(actual.cpu().float(), wanted.grad.float(), **tolerance)


# --- checkpoints -----------------------------------------------------------------------------------------


def _trained(device):
    model = _model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    x, y = (t.to(device) for t in _batch())
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    return model, optimizer


def _saved(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def test_state_dict_round_trip_through_cpu():
    model, optimizer = _trained("neuron")
    buffer = _saved({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    on_cpu = torch.load(buffer, map_location="cpu")
    assert all(t.device.type == "cpu" for t in on_cpu["model"].values())
    restored = _model(seed=1).to("neuron")
    restored.load_state_dict(on_cpu["model"])
    restored_optimizer = torch.optim.AdamW(restored.parameters(), lr=0.01)
    restored_optimizer.load_state_dict(on_cpu["optimizer"])
    for key, value in model.state_dict().items():
        assert restored.state_dict()[key].device.type == "neuron"
        torch.testing.assert_close(restored.state_dict()[key].cpu(), value.cpu(), rtol=0, atol=0)
    state = restored_optimizer.state[next(iter(restored.parameters()))]
    assert state["exp_avg"].device.type == "neuron"


def test_load_with_map_location_neuron():
    model, optimizer = _trained("cpu")
    buffer = _saved({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    loaded = torch.load(buffer, map_location="neuron")
    for key, value in model.state_dict().items():
        assert loaded["model"][key].device.type == "neuron"
        torch.testing.assert_close(loaded["model"][key].cpu(), value, rtol=0, atol=0)
    assert loaded["optimizer"]["state"][0]["exp_avg"].device.type == "neuron"


def test_save_neuron_tensors_and_load_them_back():
    model, _ = _trained("neuron")
    loaded = torch.load(_saved(model.state_dict()))
    for key, value in model.state_dict().items():
        assert loaded[key].device == value.device
        torch.testing.assert_close(loaded[key].cpu(), value.cpu(), rtol=0, atol=0)


def test_safetensors_round_trip(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    model, _ = _trained("neuron")
    path = tmp_path / "model.safetensors"
    safetensors.save_file({k: v.cpu() for k, v in model.state_dict().items()}, str(path))
    loaded = {k: v.to("neuron") for k, v in safetensors.load_file(str(path)).items()}
    restored = _model(seed=1).to("neuron")
    restored.load_state_dict(loaded)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(restored.state_dict()[key].cpu(), value.cpu(), rtol=0, atol=0)


def test_safetensors_save_neuron_tensors(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    model, _ = _trained("neuron")
    safetensors.save_file(model.state_dict(), str(tmp_path / "model.safetensors"))
    loaded = safetensors.load_file(str(tmp_path / "model.safetensors"))
    torch.testing.assert_close(loaded["0.weight"], model[0].weight.cpu(), rtol=0, atol=0)


def test_safetensors_load_onto_neuron(tmp_path):
    """load_file, load_model and safe_open (tensors and slices) take a neuron device, as they take CUDA's (their
    Rust loader knows only its own device names)."""
    safetensors = pytest.importorskip("safetensors.torch")
    from safetensors import safe_open

    model, _ = _trained("cpu")
    path = str(tmp_path / "model.safetensors")
    safetensors.save_file(model.state_dict(), path)
    loaded = safetensors.load_file(path, device="neuron:1")
    assert loaded.keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        assert loaded[key].device == torch.device("neuron", 1)
        torch.testing.assert_close(loaded[key].cpu(), value, rtol=0, atol=0)
    restored = _model(seed=1).to("neuron")
    safetensors.load_model(restored, path, device="neuron")
    torch.testing.assert_close(restored[0].weight.cpu(), model[0].weight, rtol=0, atol=0)
    with safe_open(path, framework="pt", device=torch.device("neuron")) as opened:
        assert set(opened.keys()) == set(loaded)
        rows = opened.get_slice("0.weight")[1:3]
        assert rows.device.type == "neuron" and opened.get_tensor("0.bias").device.type == "neuron"
    torch.testing.assert_close(rows.cpu(), model[0].weight[1:3], rtol=0, atol=0)


# --- data ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pin_memory", [False, True])
def test_dataloader_non_blocking(pin_memory):
    x, y = _batch()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=3, pin_memory=pin_memory)
    seen = []
    for xb, yb in loader:
        on_device = xb.to("neuron", non_blocking=True), yb.to("neuron", non_blocking=True)
        torch.neuron.synchronize()
        seen.append(torch.cat([t.cpu() for t in on_device], dim=1))
    torch.testing.assert_close(torch.cat(seen), torch.cat([x, y], dim=1), rtol=0, atol=0)


def test_memory_stays_flat_over_1000_steps():
    model = torch.nn.Linear(4, 1).to("neuron")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = (t.to("neuron") for t in (torch.randn(2, 4), torch.randn(2, 1)))

    def step():
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(10):
        step()
    torch.neuron.synchronize()
    start = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    for _ in range(1000):
        step()
    torch.neuron.synchronize()
    assert torch.neuron.memory_allocated() == start
    assert torch.neuron.max_memory_allocated() - start < 4096
