"""Compiled graphs persisted on disk, so a second process loads executables instead of compiling.

Entries are serialized XLA executables keyed by the program's StableHLO text,
the device it runs on, and the jax, jaxlib and torch versions (the directory
name carries the versions and platform, so an upgrade starts a fresh cache).
TORCHNEURON_CACHE_DIR moves the cache (default ~/.cache/torchneuron, or
$XDG_CACHE_HOME/torchneuron); TORCHNEURON_COMPILE_CACHE=0 turns it off.
"""
import functools
import hashlib
import os
import pickle
import tempfile

import jax
import jaxlib
import torch
from jax.experimental import serialize_executable

from ..runtime import events
from ..runtime.platform import jax_device
from .stats import counters


def enabled() -> bool:
    return os.environ.get("TORCHNEURON_COMPILE_CACHE", "1") != "0"


def root() -> str:
    default = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "torchneuron")
    return os.environ.get("TORCHNEURON_CACHE_DIR", default)


@functools.cache
def _versions() -> str:
    platform = jax.devices()[0].platform
    return f"jax-{jax.__version__}_jaxlib-{jaxlib.__version__}_torch-{torch.__version__}_{platform}"


def directory() -> str:
    return os.path.join(root(), "compiled", _versions())


def _path(lowered, device) -> str:
    digest = hashlib.sha256()
    # the PJRT device, not the neuron index: processes sharing a runtime (torch.distributed) share the
    # cache directory, and each one's executable is loaded onto the device it was compiled for
    digest.update(f"{_versions()}|{jax_device(device)}|".encode())
    digest.update(lowered.as_text().encode())
    return os.path.join(directory(), digest.hexdigest() + ".xla")


def compile_lowered(lowered, device):
    """The executable for `lowered`: loaded from the disk cache when present, else compiled (and stored)."""
    path = _path(lowered, device) if enabled() else None
    hit = path is not None and os.path.exists(path)
    if events.listening:
        return events.graph_compile(_compile_or_load, (lowered, device, path, hit), _module_name(lowered), hit)
    return _compile_or_load(lowered, device, path, hit)


def _compile_or_load(lowered, device, path, hit):
    if hit:
        with open(path, "rb") as f:
            payload, in_tree, out_tree = pickle.load(f)
        counters["disk_cache_hits"] += 1
        # on its own device: by default a loaded executable expects one argument shard per local device
        return serialize_executable.deserialize_and_load(
            payload, in_tree, out_tree, execution_devices=[jax_device(device)]
        )
    counters["xla_compiles"] += 1
    compiled = lowered.compile()
    if path is not None:
        _store(path, serialize_executable.serialize(compiled))
    return compiled


def _module_name(lowered) -> str:
    """The program's function name (`module @jit_<function name>` heads its text)."""
    head = lowered.as_text().split("\n", 1)[0]
    return head.split("@jit_", 1)[-1].split(" ", 1)[0] if "@jit_" in head else "graph"


def _store(path, entry) -> None:
    """Write atomically: concurrent processes may compile the same graph."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        pickle.dump(entry, f)
    os.replace(tmp, path)
