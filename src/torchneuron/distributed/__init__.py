"""`torch.distributed` on neuron: the `neuron` c10d backend (see docs/distributed.md)."""
import torch.distributed as dist

from . import compiled  # noqa: F401  (functional collectives inside compiled graphs)
from .process_group import NeuronProcessGroup, Work, create


def register() -> None:
    """Make `init_process_group("neuron")` and `"cpu:gloo,neuron:neuron"` work. Safe to call more than once."""
    if "NEURON" not in dist.Backend._plugins:
        dist.Backend.register_backend("neuron", create, extended_api=True, devices=["neuron"])


register()

__all__ = ["NeuronProcessGroup", "Work", "register"]
