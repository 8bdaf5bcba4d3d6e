"""Every change torch.compile needs inside PyTorch to treat neuron tensors as plain device tensors.

A NeuronTensor is a wrapper subclass only so that its ops reach our
`__torch_dispatch__`; to Dynamo, FakeTensorMode and AOTAutograd it must look
like an ordinary tensor on the `neuron` device. PyTorch (2.13) decides that
by exact type in a few places. Each function below fixes one such place,
names the upstream gap, and is idempotent; `apply()` runs them all and
`applied()` lets a test check that they are in force.
"""
import functools
import os

import torch

from ..runtime.tensor import NeuronTensor


def dynamo_wraps_neuron_tensors_as_tensors() -> None:
    """Dynamo's VariableBuilder wraps a tensor as a TensorVariable only for its exact type table
    (Tensor, Parameter, FakeTensor, FunctionalTensor) or when `__torch_dispatch__` is Tensor's own;
    anything else becomes a user-defined object and Dynamo traces into our dispatcher."""
    from torch._dynamo.variables.builder import VariableBuilder

    original = VariableBuilder._type_dispatch_impl
    if getattr(original, "neuron_patched", False):
        return
    unwrapped = original.__func__.__wrapped__

    @functools.cache
    def type_dispatch_impl(cls, trace_numpy):
        table = dict(unwrapped(cls, trace_numpy))
        table[NeuronTensor] = cls.wrap_tensor
        return table

    type_dispatch_impl.neuron_patched = True
    VariableBuilder._type_dispatch_impl = classmethod(type_dispatch_impl)


def tangents_accept_neuron_tensors() -> None:
    """AOTAutograd's backward compares each runtime tangent's type with the plain `torch.Tensor` it
    traced, and rejects a subclass unless it defines `__coerce_same_metadata_as_tangent__`."""

    def coerce_same_metadata_as_tangent(self, expected_metadata, expected_type=None):
        return self

    NeuronTensor.__coerce_same_metadata_as_tangent__ = coerce_same_metadata_as_tangent


def dynamo_skips_torchneuron_frames() -> None:
    """Dynamo compiles every Python frame that runs while a compiled function is active and that is not
    in its skip list. Eager code between graphs (a graph break's `bool(tensor)`, an op run eagerly)
    enters our dispatcher in Python, and Dynamo would try to trace the runtime itself."""
    from torch._dynamo import trace_rules

    if not _skipped_by_dynamo():
        trace_rules.add("torchneuron")


def _skipped_by_dynamo() -> bool:
    from torch._dynamo import trace_rules

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return any(os.path.abspath(d) == package for d in trace_rules.SKIP_DIRS if os.path.isabs(d))


_PATCHES = (dynamo_wraps_neuron_tensors_as_tensors, tangents_accept_neuron_tensors, dynamo_skips_torchneuron_frames)


@functools.cache
def apply() -> None:
    for patch in _PATCHES:
        patch()


def applied() -> dict:
    """Which patches are in force, by name (the test suite asserts all are)."""
    from torch._dynamo.variables.builder import VariableBuilder

    return {
        "dynamo_wraps_neuron_tensors_as_tensors": getattr(
            VariableBuilder._type_dispatch_impl, "neuron_patched", False
        ),
        "tangents_accept_neuron_tensors": hasattr(NeuronTensor, "__coerce_same_metadata_as_tangent__"),
        "dynamo_skips_torchneuron_frames": _skipped_by_dynamo(),
    }
