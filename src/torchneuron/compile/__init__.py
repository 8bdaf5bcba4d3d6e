"""torch.compile(model, backend="neuron"): see backend.py; counters in `report()`."""
from .. import patches
from .backend import neuron_backend
from .stats import report, reset

# before Dynamo traces anything: it decides how to wrap a neuron tensor while tracing
patches.apply_compile()

__all__ = ["neuron_backend", "report", "reset"]
