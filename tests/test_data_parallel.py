"""nn.DataParallel over neuron:0 and neuron:1 in one process, and torch.neuron.comm (torch.nn.parallel.comm),
whose copies between devices PyTorch has only for CUDA (patches.data_parallel_copies_between_neuron_devices)."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

comm = torch.neuron.comm


class _ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).relu().flatten(1))


def test_data_parallel_trains_as_its_replicas_would_on_the_cpu():
    torch.manual_seed(0)
    cpu = _ConvNet()
    model = copy.deepcopy(cpu).to("neuron:0")
    parallel = nn.DataParallel(model, device_ids=[0, 1])
    cpu_optimizer = torch.optim.SGD(cpu.parameters(), lr=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        x, y = torch.randn(6, 3, 8, 8), torch.randint(0, 5, (6,))
        # each replica sees half the batch (batch norm's statistics are per replica); only the first, which runs
        # on the module's own buffers, updates the running statistics
        replica_buffers = {k: v.clone() for k, v in cpu.named_buffers()}
        expected = torch.cat([cpu(x[:3]), torch.func.functional_call(cpu, replica_buffers, (x[3:],), strict=False)])
        F.cross_entropy(expected, y).backward()
        out = parallel(x.to("neuron:0"))
        assert out.device == torch.device("neuron:0")
        F.cross_entropy(out, y.to("neuron:0")).backward()
        torch.testing.assert_close(out.detach().cpu(), expected.detach(), atol=1e-5, rtol=1e-4)
        for (name, p), q in zip(cpu.named_parameters(), model.parameters()):
            torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-5, rtol=1e-4, msg=name)
        cpu_optimizer.step(), optimizer.step()
        cpu_optimizer.zero_grad(), optimizer.zero_grad()
    torch.testing.assert_close(model.bn.running_mean.cpu(), cpu.bn.running_mean)
    torch.testing.assert_close(model.bn.running_var.cpu(), cpu.bn.running_var)


def test_broadcast_keeps_the_tensor_on_its_own_device():
    t = torch.arange(6.0, device="neuron:1")
    same, other = comm.broadcast(t, ["neuron:1", 0])
    assert same is t and other.device == torch.device("neuron:0")
    torch.testing.assert_close(other.cpu(), torch.arange(6.0))
    out = [torch.empty(6, device="neuron:0"), torch.empty(6, device="neuron:1")]
    assert all(a is b for a, b in zip(comm.broadcast(t, out=out), out))
    torch.testing.assert_close(out[0].cpu(), torch.arange(6.0))
    with pytest.raises(RuntimeError, match="must appear as the first"):
        comm.broadcast(t, [0, 1])


def test_broadcast_coalesced_gives_each_copy_its_own_version_counter():
    tensors = [torch.arange(6.0), torch.arange(3), torch.ones(2)]
    tensors = [t.to("neuron:0") for t in tensors]
    first, second = comm.broadcast_coalesced(tensors, [0, 1], buffer_size=16)
    assert all(a is b for a, b in zip(first, tensors))
    for copied, original in zip(second, tensors):
        assert copied.device == torch.device("neuron:1") and copied.dtype == original.dtype
        torch.testing.assert_close(copied.cpu(), original.cpu())
    version = second[2]._version
    second[0].add_(1)
    assert second[2]._version == version
    torch.testing.assert_close(second[2].cpu(), torch.ones(2))


def test_scatter_and_gather():
    t = torch.arange(12.0, device="neuron:0").reshape(6, 2)
    head, tail = comm.scatter(t, [0, 1], chunk_sizes=[4, 2])
    assert head.device.index == 0 and tail.device.index == 1
    torch.testing.assert_close(tail.cpu(), torch.arange(8.0, 12.0).reshape(2, 2))
    gathered = comm.gather([tail, head], dim=0, destination="cpu")
    torch.testing.assert_close(gathered, torch.cat([t.cpu()[4:], t.cpu()[:4]]))
    assert comm.gather([head, head.to("neuron:1")], dim=-1, destination=1).shape == (4, 4)
    with pytest.raises(RuntimeError, match="don't sum up"):
        comm.scatter(t, [0, 1], chunk_sizes=[4, 1])
    with pytest.raises(RuntimeError, match="invalid size"):
        comm.gather([head, tail.reshape(4)], destination=0)


def test_reduce_add_sums_on_the_destination_without_asking_nccl():
    t = torch.arange(4.0, device="neuron:1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        total = comm.reduce_add([t, t.to("neuron:0")], destination=0)
    assert total.device == torch.device("neuron:0")
    torch.testing.assert_close(total.cpu(), 2 * torch.arange(4.0))


def test_data_parallel_scatters_host_inputs_on_the_devices_streams():
    torch.manual_seed(0)
    cpu = nn.Linear(4, 3)
    parallel = nn.DataParallel(copy.deepcopy(cpu).to("neuron:0"))
    assert parallel.device_ids == [0, 1]
    x = torch.randn(5, 4)
    out = parallel(x)
    assert out.device == torch.device("neuron:0")
    torch.testing.assert_close(out.detach().cpu(), cpu(x))
