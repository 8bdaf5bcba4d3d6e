"""Executables on disk, so that a second process loads what the first one compiled.

`TORCHNEURON_CACHE_DIR` (default `$XDG_CACHE_HOME/torchneuron`, else `~/.cache/torchneuron`) holds
two caches, one directory per jax, jaxlib and torch version and platform:
- `xla/`: JAX's persistent compilation cache, which every executable goes through (eager op programs,
  adaptive eager's fused queues, compiled graphs), keyed by the program's HLO;
- `graphs/`: torch.compile graphs keyed by the FX graph and input signature (compile/disk_cache.py),
  which spares a warm start tracing them as well.
`TORCHNEURON_COMPILE_CACHE=0` turns both off; `TORCHNEURON_CACHE_MAX_BYTES` bounds each (default
4 GiB): when a process exits, the entries least recently used go first.
"""
import atexit
import functools
import os

import jax
import jaxlib
import torch


def enabled() -> bool:
    return os.environ.get("TORCHNEURON_COMPILE_CACHE", "1") != "0"


def root() -> str:
    default = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "torchneuron")
    return os.environ.get("TORCHNEURON_CACHE_DIR", default)


def directory(kind: str, platform: str) -> str:
    versions = f"jax-{jax.__version__}_jaxlib-{jaxlib.__version__}_torch-{torch.__version__}_{platform}"
    return os.path.join(root(), kind, versions)


@functools.cache
def configure_jax(platform: str) -> None:
    """Point JAX's persistent cache at ours, for every executable however small (eager ops compile in
    milliseconds each, but a training step has dozens of them)."""
    if not enabled():
        return
    jax.config.update("jax_compilation_cache_dir", directory("xla", platform))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # JAX's own bound lists and reads every entry at each store: with a few thousand entries that is
    # 50 ms a compile, growing with the cache. Unbounded for JAX, trimmed once when the process exits.
    jax.config.update("jax_compilation_cache_max_size", -1)
    max_bytes = int(os.environ.get("TORCHNEURON_CACHE_MAX_BYTES", 4 << 30))
    for kind in ("xla", "graphs"):
        atexit.register(trim, directory(kind, platform), max_bytes)


def trim(path: str, max_bytes: int) -> None:
    """Delete the least recently used files under `path` until the rest fit in `max_bytes`."""
    entries = []
    try:
        with os.scandir(path) as listing:
            for entry in listing:
                if entry.is_file():
                    stat = entry.stat()
                    entries.append((max(stat.st_atime, stat.st_mtime), stat.st_size, entry.path))
    except FileNotFoundError:
        return
    total = sum(size for _, size, _ in entries)
    for _, size, file in sorted(entries):
        if total <= max_bytes:
            break
        try:
            os.remove(file)  # another process may be trimming too
        except FileNotFoundError:
            pass
        total -= size
