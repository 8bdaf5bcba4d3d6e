"""Compiled graphs on disk, keyed by the FX graph itself, so a warm start does not trace them again.

An entry is a graph's program, exported (`jax.export`: its StableHLO, serialized), with what tracing it
told (which outputs are arrays, and the values fixed for its signature), keyed by the graph's code and
constants, the input signature, the device, and the torchneuron source (a changed lowering is a new key).
Its executable comes from JAX's persistent cache, which holds every executable (runtime/compilation_cache.py):
serializing XLA:CPU executables ourselves proved fragile (an executable compiled in a process that had
loaded others could lose kernels it shares with them).
"""
import functools
import hashlib
import os
import pathlib
import pickle
import tempfile

import jax
import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..runtime import compilation_cache, events
from ..runtime.platform import jax_device, platform_name
from .stats import counters


@functools.cache
def source_digest() -> str:
    """The torchneuron source the graph's lowering came from."""
    digest = hashlib.sha256()
    package = pathlib.Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def graph_digest(gm: torch.fx.GraphModule) -> str:
    """The graph's code and constants, hashed: its part of the key."""
    digest = hashlib.sha256(gm.code.encode())
    with unset_fake_temporarily():
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                value = getattr(gm, node.target)
                digest.update(_tensor_bytes(value) if isinstance(value, torch.Tensor) else repr(value).encode())
    return digest.hexdigest()


def _tensor_bytes(tensor) -> bytes:
    """Its dtype, shape and bytes (as bytes: numpy has no bfloat16)."""
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return repr((tensor.dtype, tuple(tensor.shape))).encode() + data


def path_for(graph: str, signature, device: int):
    """Where the entry of the graph whose `graph_digest` is `graph` lives for this input signature (None with the
    cache off)."""
    if not compilation_cache.enabled():
        return None
    digest = hashlib.sha256()
    # the PJRT device, not the neuron index: processes sharing a runtime (torch.distributed) share the
    # cache directory, and each one's executable is loaded onto the device it was compiled for
    for part in (source_digest(), str(jax_device(device)), graph, repr(signature)):
        digest.update(part.encode())
        digest.update(b"\0")
    return os.path.join(compilation_cache.directory("graphs", platform_name()), digest.hexdigest() + ".xla")


def load_or_export(path, name: str, export):
    """(exported, what tracing told): the graph's program as a `jax.export.Exported`, loaded from the entry
    at `path`, else from `export() -> (exported, traced)` and stored there. (None, None) from `export()`
    is a program that cannot be exported; it is not stored."""
    hit = path is not None and os.path.exists(path)
    if events.listening:
        return events.graph_compile(_load_or_export, (path, export, hit), name, hit)
    return _load_or_export(path, export, hit)


def _load_or_export(path, export, hit):
    if hit:
        with open(path, "rb") as f:
            serialized, traced = pickle.load(f)
        counters["disk_cache_hits"] += 1
        return jax.export.deserialize(serialized), traced
    counters["xla_compiles"] += 1
    exported, traced = export()
    if path is not None and exported is not None:
        _store(path, (exported.serialize(), traced))
    return exported, traced


def _store(path, entry) -> None:
    """Write atomically: concurrent processes may compile the same graph."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        pickle.dump(entry, f)
    os.replace(tmp, path)
