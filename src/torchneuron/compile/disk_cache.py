"""Compiled graphs on disk, keyed by the FX graph itself, so a warm start neither traces nor lowers them again.

An entry is a graph's executable, serialized as compiled, with what tracing it told (which outputs are
arrays, and the values fixed for its signature) and its program exported (`jax.export`: its StableHLO,
serialized), keyed by the graph's code and constants, the input signature, the device, and the torchneuron
source (runtime/compilation_cache.py). A warm start loads the executable as it is: JAX's persistent cache
would first lower the program again for its key, half the load's time. The exported program stands in where
the executable cannot be stored or loaded: it is compiled through JAX's cache.
"""
import hashlib
import os

import jax
import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..ops import registry
from ..runtime import compilation_cache, events
from ..runtime.platform import jax_device, platform_name
from .stats import counters


def graph_digest(gm: torch.fx.GraphModule):
    """The graph's code and constants, hashed: its part of the key. None for a graph calling an op lowered by
    code outside torchneuron (torchneuron.library, kernels): its program may change with code the key does not
    hash, and a kernel's lowering with the choice around it (`nk.use_lowering`)."""
    digest = hashlib.sha256(gm.code.encode())
    with unset_fake_temporarily():
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target in registry.CHECKED_OUTPUTS:
                return None
            if node.op == "get_attr":
                value = getattr(gm, node.target)
                digest.update(_tensor_bytes(value) if isinstance(value, torch.Tensor) else repr(value).encode())
    return digest.hexdigest()


def _tensor_bytes(tensor) -> bytes:
    """Its dtype, shape and bytes (as bytes: numpy has no bfloat16)."""
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return repr((tensor.dtype, tuple(tensor.shape))).encode() + data


def load_or_compile(graph, signature, name: str, device: int, export, compile):
    """(executable, what tracing told, where the executable was loaded from: None if compiled here) of the graph
    whose `graph_digest` is `graph`, for this input signature on the device: loaded from its entry, else
    `compile(exported)` of `export() -> (exported, traced)`, stored. An `exported` of None is a program export
    cannot express, compiled from its trace and not stored."""
    path = graph and compilation_cache.entry_path("graphs", platform_name(), jax_device(device), graph,
                                                  repr(signature))
    if events.listening:
        hit = path is not None and os.path.exists(path)
        return events.graph_compile(_load_or_compile, (path, device, export, compile), name, hit)
    return _load_or_compile(path, device, export, compile)


def _load_or_compile(path, device, export, compile):
    entry = compilation_cache.load(path, jax_device(device))
    if entry is not None:
        compiled, (exported, traced) = entry
        counters["disk_cache_hits"] += 1
        if compiled is None:
            return compile(jax.export.deserialize(exported)), traced, None
        return compiled, traced, path
    counters["xla_compiles"] += 1
    exported, traced = export()
    if exported is None:
        return compile(None), traced, None
    # the exported program stands in where the executable cannot be stored or loaded
    return compilation_cache.compile_and_store(path, lambda: compile(exported), (exported.serialize(), traced),
                                               without_executable=True), traced, None
