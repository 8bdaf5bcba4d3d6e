"""Autograd above the device, and the issue's training example matching the CPU."""
import pytest
import torch
import torch.nn.functional as F

import torchneuron
from conftest import assert_same


def test_leaf_grads_hooks_retain_grad():
    x = torch.randn(4, 3)
    results = {}
    for device in ["cpu", "neuron"]:
        leaf = x.clone().to(device).requires_grad_()
        hooked = []
        leaf.register_hook(lambda g: hooked.append(g))
        mid = (leaf * 2).tanh()
        mid.retain_grad()
        (mid.sum() * 3).backward()
        results[device] = (leaf.grad, mid.grad, hooked[0])
    for neuron_value, cpu_value in zip(results["neuron"], results["cpu"]):
        assert_same(neuron_value, cpu_value)


def test_autograd_through_views_and_inplace():
    x = torch.randn(3, 4)
    grads = {}
    for device in ["cpu", "neuron"]:
        leaf = x.clone().to(device).requires_grad_()
        y = leaf * 1
        y.t()[1].mul_(3)
        y[:, ::2].add_(y[:, 1::2])
        (y.pow(2).sum()).backward()
        grads[device] = leaf.grad
    assert_same(grads["neuron"], grads["cpu"])


def test_autograd_grad_and_double_backward():
    x = torch.randn(5)
    out = {}
    for device in ["cpu", "neuron"]:
        leaf = x.clone().to(device).requires_grad_()
        (g,) = torch.autograd.grad((leaf.sin() * leaf).sum(), leaf, create_graph=True)
        (gg,) = torch.autograd.grad(g.sum(), leaf)
        out[device] = (g.detach(), gg)
    assert_same(out["neuron"][0], out["cpu"][0])
    assert_same(out["neuron"][1], out["cpu"][1])


def _train(device, steps=20):
    torch.manual_seed(0)
    x = torch.randn(64, 32)
    target = torch.randint(0, 10, (64,))
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    xs, ts = x.to(device), target.to(device)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(xs), ts)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_issue_example_matches_cpu_without_fallback():
    torchneuron.eager.fallback.reset()
    cpu = _train("cpu")
    neuron = _train("neuron")
    assert torchneuron.fallback_report() == {}
    assert neuron[-1] < neuron[0]
    torch.testing.assert_close(torch.tensor(neuron), torch.tensor(cpu), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("optimizer", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
    lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False),
])
def test_optimizers_match_cpu(optimizer):
    torch.manual_seed(1)
    base = torch.nn.Linear(8, 4)
    x = torch.randn(16, 8)
    params = {}
    for device in ["cpu", "neuron"]:
        model = torch.nn.Linear(8, 4)
        model.load_state_dict(base.state_dict())
        model.to(device)
        opt = optimizer(model.parameters())
        for _ in range(3):
            opt.zero_grad()
            model(x.to(device)).square().mean().backward()
            opt.step()
        params[device] = model.weight.detach()
    assert_same(params["neuron"], params["cpu"], rtol=1e-5, atol=1e-6)


def test_small_cnn_and_transformer_blocks_match_cpu():
    torch.manual_seed(2)
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 5),
    )
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    image, tokens = torch.randn(2, 3, 8, 8), torch.randn(2, 6, 16)
    for model, data in [(cnn, image), (layer, tokens)]:
        expected = model(data)
        expected.sum().backward()
        cpu_grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model.to("neuron")
        got = model(data.to("neuron"))
        got.sum().backward()
        assert_same(got, expected, rtol=1e-4, atol=1e-5)
        for p, g in zip(model.parameters(), cpu_grads):
            assert_same(p.grad, g, rtol=1e-4, atol=1e-4)
        model.cpu()


@pytest.mark.parametrize("train", [True, False])
def test_batchnorm_running_statistics(train):
    torch.manual_seed(3)
    x = torch.randn(4, 3, 5, 5)
    cpu = torch.nn.BatchNorm2d(3).train(train)
    cpu.running_var.fill_(2.0)
    neuron = torch.nn.BatchNorm2d(3).train(train)
    neuron.load_state_dict(cpu.state_dict())
    neuron.to("neuron")
    for _ in range(2):
        expected, got = cpu(x), neuron(x.to("neuron"))
    assert_same(got, expected, rtol=1e-5, atol=1e-5)
    assert_same(neuron.running_mean, cpu.running_mean)
    assert_same(neuron.running_var, cpu.running_var)
    assert_same(neuron.num_batches_tracked, cpu.num_batches_tracked)


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_recomputes_dropout_with_the_forward_mask(reentrant):
    """Checkpointing saves the device's random state only when the device module says it is initialised
    (`_initialized`, as torch.cuda's): without it the recomputed dropout drew a new mask in backward and the
    gradients were silently wrong."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 8)).to("neuron")
    x = torch.randn(4, 8, device="neuron")
    grads = []
    for run in (lambda t: checkpoint(model, t, use_reentrant=reentrant), model):
        leaf = x.detach().requires_grad_()
        torch.manual_seed(1)
        run(leaf).sum().backward()
        grads.append(leaf.grad)
    assert_same(grads[0], grads[1].cpu())


def test_weight_norm_parametrization_gradients_on_the_device():
    """`_weight_norm_interface_backward` is lowered (it ran on the CPU)."""
    torchneuron.eager.fallback.reset()
    torch.manual_seed(0)
    cpu = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(4, 3))
    neuron = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(4, 3)).to("neuron")
    neuron.load_state_dict(cpu.state_dict())
    x = torch.randn(2, 4)
    cpu(x).pow(2).sum().backward()
    neuron(x.to("neuron")).pow(2).sum().backward()
    for expected, got in zip(cpu.parameters(), neuron.parameters()):
        assert_same(got.grad, expected.grad, atol=1e-5, rtol=1e-5)
    assert torchneuron.fallback_report() == {}


def test_forward_mode_ad_on_the_device():
    """Dual tensors: make_dual asks `_has_same_storage_numel`, answered from the storages' sizes (it was a CPU
    fallback copying both tensors to the host)."""
    import torch.autograd.forward_ad as fwAD

    torchneuron.eager.fallback.reset()
    x, tangent = torch.randn(3), torch.randn(3)
    tangents = {}
    for device in ("cpu", "neuron"):
        with fwAD.dual_level():
            dual = fwAD.make_dual(x.to(device), tangent.to(device))
            tangents[device] = fwAD.unpack_dual((dual.sin() * 2).exp()).tangent
    assert_same(tangents["neuron"], tangents["cpu"])
    assert torchneuron.fallback_report() == {}


def test_jvp_through_an_in_place_lerp_as_quantile_makes_it():
    """lerp_'s meta kernel (PyTorch's) formats its arguments while matching overloads, which fails inside
    forward-mode AD; quantile interpolates with lerp_."""
    x, q = torch.randn(7, dtype=torch.float64), torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)
    tangent = torch.linspace(-1, 1, 7, dtype=torch.float64)
    expected = torch.func.jvp(lambda t: torch.quantile(t, q), (x,), (tangent,))
    got = torch.func.jvp(lambda t: torch.quantile(t, q.to("neuron")), (x.to("neuron"),), (tangent.to("neuron"),))
    for g, e in zip(got, expected):
        assert_same(g, e)
