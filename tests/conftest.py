import pytest
import torch

import torchneuron  # noqa: F401  (also autoloaded by `import torch`; importing keeps tests explicit)


@pytest.fixture
def neuron():
    return torch.device("neuron")


def assert_same(neuron_tensor, cpu_tensor, **tolerances):
    """Values, dtype and shape of a neuron result equal the CPU result."""
    assert neuron_tensor.device.type == "neuron"
    torch.testing.assert_close(neuron_tensor.cpu(), cpu_tensor, **tolerances)
