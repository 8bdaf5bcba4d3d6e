"""Executables on disk, so that a second process loads what the first one compiled.

`TORCHNEURON_CACHE_DIR` (default `$XDG_CACHE_HOME/torchneuron`, else `~/.cache/torchneuron`) holds
four caches, one directory per jax, jaxlib and torch version and platform:
- `xla/`: JAX's persistent compilation cache, which every executable goes through (eager op programs,
  adaptive eager's fused queues, compiled graphs), keyed by the program's HLO;
- `graphs/`: torch.compile graphs keyed by the FX graph and input signature (compile/disk_cache.py),
- `ops/`: eager op programs keyed by the op's signature (eager/executable.py),
- `fused/`: adaptive eager's fused programs keyed by their ops' signatures and how they connect (eager/adaptive.py),
which hold the executable as compiled, with what tracing its program told: a warm start neither traces
nor lowers them, as JAX's cache, keyed by the lowered program, must. Their keys are ours, so they hold
only what torchneuron's own source lowers (part of every key), never a user's lowering.
`TORCHNEURON_COMPILE_CACHE=0` turns them off; `TORCHNEURON_CACHE_MAX_BYTES` bounds each (default
4 GiB): when a process exits, the entries least recently used go first.
"""
import atexit
import concurrent.futures
import functools
import hashlib
import os
import pathlib
import pickle
import shutil
import tempfile
import threading
import time

import jax
import jaxlib
import torch
from jax.experimental import serialize_executable

KINDS = ("xla", "graphs", "ops", "fused")


def enabled() -> bool:
    return os.environ.get("TORCHNEURON_COMPILE_CACHE", "1") != "0"


def root() -> str:
    default = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "torchneuron")
    return os.environ.get("TORCHNEURON_CACHE_DIR", default)


def directory(kind: str, platform: str) -> str:
    versions = f"jax-{jax.__version__}_jaxlib-{jaxlib.__version__}_torch-{torch.__version__}_{platform}"
    if kind == "xla":
        # JAX's cache by torchneuron source as well: after an upgrade our keys all miss, and the programs would
        # come from JAX's cache, which we cannot store again (`compile_and_store`), for as long as it kept them
        versions += f"{_SOURCE}{source_digest()[:16]}"
    return os.path.join(root(), kind, versions)


_SOURCE = "_torchneuron-"
STALE_SECONDS = 24 * 3600


def remove_stale_sources(current: str) -> None:
    """Delete the directories of JAX's cache that other torchneuron sources left beside `current` (same versions
    otherwise) and nothing has written to for a day: each upgrade, each edit of a checkout, leaves one."""
    parent, name = os.path.split(current)
    prefix = name.split(_SOURCE)[0] + _SOURCE
    try:
        siblings = [entry for entry in os.scandir(parent) if entry.name.startswith(prefix) and entry.name != name]
    except FileNotFoundError:
        return
    for entry in siblings:
        if entry.stat().st_mtime < time.time() - STALE_SECONDS:
            shutil.rmtree(entry.path, ignore_errors=True)  # another process may be removing it too


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
    jax.monitoring.register_event_listener(_count_jax_cache_hit)
    max_bytes = int(os.environ.get("TORCHNEURON_CACHE_MAX_BYTES", 4 << 30))
    for kind in KINDS:
        atexit.register(trim, directory(kind, platform), max_bytes)
    atexit.register(remove_stale_sources, directory("xla", platform))


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


@functools.cache
def source_digest() -> str:
    """The torchneuron source, hashed: part of every key of ours (a changed lowering is a new key)."""
    digest = hashlib.sha256()
    package = pathlib.Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def entry_path(kind: str, platform: str, device, *key: str):
    """Where the entry of `kind` keyed by `key` lives for the PJRT `device` (None with the caches off): the device,
    not the neuron index, as processes sharing a runtime (torch.distributed) share the directory, and each
    executable is loaded onto the device it was compiled for."""
    if not enabled():
        return None
    digest = hashlib.sha256()
    for part in (source_digest(), str(device), *key):
        digest.update(part.encode())
        digest.update(b"\0")
    return os.path.join(directory(kind, platform), digest.hexdigest() + ".xla")


def load(path, device):
    """The entry stored at `path` (None if there is none, or `path` is None): (its executable loaded onto the PJRT
    `device`, None where it cannot be, as on another runtime; what was stored with it)."""
    entry = read(path)
    return entry and (deserialized(entry[0], device), entry[1])


def read(path):
    """The entry stored at `path` as it lies on disk (None if there is none, or `path` is None): (its serialized
    executable, what was stored with it). Reading is cheap; loading the executable (`deserialized`) is not:
    milliseconds each on XLA:CPU, which links its code again."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        return None
    except (OSError, EOFError, pickle.UnpicklingError, ValueError):
        # unreadable (a damaged disk, a file truncated outside our atomic writes): a miss, compiled again
        return None


def stored(path) -> bool:
    return path is not None and os.path.exists(path)


def deserialized_together(executables, device) -> list:
    """`deserialized` of each of `executables`, on as many threads as the host has cores (XLA:CPU's
    deserialization, mostly relinking code, runs outside the GIL): 1.4x faster on 2 cores. One by one where there
    are no threads to be had: ops run while the interpreter shuts down (an atexit hook) may start none."""
    if len(executables) >= 2:
        try:
            with concurrent.futures.ThreadPoolExecutor(min(len(executables), os.cpu_count() or 1)) as pool:
                return list(pool.map(deserialized, executables, [device] * len(executables)))
        except RuntimeError:  # "cannot schedule new futures after interpreter shutdown" (`deserialized` raises none)
            pass
    return [deserialized(e, device) for e in executables]


def deserialized(executable, device):
    """A serialized executable (`read`) loaded onto the PJRT `device`; None where it cannot be (or is None)."""
    if executable is None:
        return None
    try:
        return serialize_executable.deserialize_and_load(*executable, execution_devices=[device])
    except Exception:  # each runtime refuses in its own words; the caller compiles the program instead
        return None


def run_first(path, loaded, args, recompile):
    """The first run of the executable `loaded` from `path` on `args`: (the executable to keep, its results). Where
    none was loaded (None: nothing stored, or another runtime's), `recompile()`'s executable runs; so it does
    where the loaded one cannot run (a kernel XLA did not serialize with it: "Function ... not found") having
    consumed none of its arguments (donated buffers), and its entry leaves the disk; an error that remains is
    the program's own, and raised."""
    if loaded is not None:
        try:
            return loaded, loaded(*args)
        except Exception:
            if any(isinstance(a, jax.Array) and a.is_deleted() for a in args):
                raise
            try:
                os.remove(path)
            except FileNotFoundError:  # another process found it first
                pass
    compiled = recompile()
    return compiled, compiled(*args)


def compile_and_store(path, compile, stored_with=None, without_executable=False):
    """`compile()`'s executable, stored at `path` (unless it is None) with `stored_with`; where the executable cannot
    be stored, `stored_with` alone if `without_executable`. Only an executable compiled here is stored: one JAX
    loaded from its own cache serializes again without some kernels (XLA:CPU, jaxlib 0.10.2: "Function
    add_bitcast_fusion not found" when another process runs it), or refuses ("`LessThan` is not serializable")."""
    hits = _jax_cache_hits.count
    compiled = compile()
    if path is None:
        return compiled
    executable = None
    if _jax_cache_hits.count == hits:
        try:
            executable = serialize_executable.serialize(compiled)
        except Exception:  # as above
            pass
    if executable is not None or without_executable:
        _write(path, (executable, stored_with))
    return compiled


def _write(path, entry) -> None:
    """Write atomically: concurrent processes may compile the same program."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        pickle.dump(entry, f)
    os.replace(tmp, path)


class _JaxCacheHits(threading.local):
    count = 0


_jax_cache_hits = _JaxCacheHits()


def _count_jax_cache_hit(event: str, **kwargs) -> None:
    if event == "/jax/compilation_cache/cache_hits":  # in this thread: it loaded what it is compiling
        _jax_cache_hits.count += 1
