"""TorchNeuron: a native PyTorch device, `neuron`, backed by XLA through PJRT (via JAX).

`import torch` registers it (torch.backends entry point); importing this
package does the same.
"""
from .device.registration import register

register()

from .runtime.tensor import NeuronTensor  # noqa: E402
from . import ops  # noqa: E402,F401
from .eager.fallback import report as fallback_report  # noqa: E402

__all__ = ["NeuronTensor", "fallback_report", "register"]


def _autoload() -> None:
    """Entry point of the `torch.backends` group: PyTorch calls it at the end of `import torch`."""
    register()
