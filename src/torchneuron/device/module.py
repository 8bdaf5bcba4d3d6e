"""`torch.neuron`: the device module, as complete as torch.cuda is for ordinary use."""
import functools
import uuid

import torch
from torch.nn.parallel import comm  # noqa: F401  (torch.cuda.comm's counterpart: copies between devices)

from . import amp, graphs  # noqa: F401  (torch.cuda.amp's and torch.cuda.graphs' counterparts)
from .graphs import (  # noqa: F401
    NeuronGraph, graph, graph_pool_handle, is_current_stream_capturing, make_graphed_callables,
)
from .guard import (  # noqa: F401  (torch.neuron's API)
    _adaptive, _all_ready, _index, _jax_device, _runtime, current_device, device, device_count, device_of,
    set_device, synchronize,
)
from .streams import (  # noqa: F401
    Event, Stream, StreamContext, current_stream, default_stream, set_stream, stream,
)

# as torch.cuda.OutOfMemoryError: what the allocator raises when the device cannot hold a request
OutOfMemoryError = torch.OutOfMemoryError


def is_available() -> bool:
    return _runtime().device_count() > 0


def is_initialized() -> bool:
    return True


# read as torch.cuda's by PyTorch code that must not initialise a device by accident: activation checkpointing
# saves and restores the device's random state only if it is set (without it, dropout recomputed in backward
# drew a new mask and the gradients were wrong)
_initialized = True


def _lazy_init() -> None:
    return None


def init() -> None:
    """torch.cuda.init's counterpart: the device is ready once torchneuron is imported."""


def can_device_access_peer(device, peer_device) -> bool:
    """Whether tensors move directly between the two devices: any two neuron devices of this process can."""
    if not 0 <= _index(device) < device_count():
        raise AssertionError("Invalid device id")
    if not 0 <= _index(peer_device) < device_count():
        raise AssertionError("Invalid peer device id")
    return True


def _is_in_bad_fork() -> bool:
    return False


def get_device_name(device=None) -> str:
    d = _jax_device(_index(device))
    return f"neuron ({d.platform}: {d.device_kind})"


def get_device_capability(device=None):
    return (0, 0)


@functools.cache
def _properties(index: int):
    from types import SimpleNamespace

    d = _jax_device(index)
    major, minor = get_device_capability(index)
    return SimpleNamespace(
        name=get_device_name(index),
        platform=d.platform,
        device_kind=d.device_kind,
        total_memory=_memory().free_and_total(index)[1],
        multi_processor_count=1,
        # torch.cuda's fields that code checks for features (major >= 8) or identifies devices by
        major=major,
        minor=minor,
        is_integrated=False,
        is_multi_gpu_board=False,
        uuid=uuid.uuid5(uuid.NAMESPACE_URL, f"neuron/{d.platform}/{d.process_index}/{d.id}"),
        type="neuron",
        index=index,
    )


def get_device_properties(device=None):
    return _properties(_index(device))


# --- synchronisation -----------------------------------------------------------

_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}


def set_sync_debug_mode(debug_mode) -> None:
    """As torch.cuda's: "default" or 0, nothing; "warn" or 1, warn; "error" or 2, raise at each operation that
    waits for the device to read values on the host (`.item()`, `.cpu()`, `nonzero`, a CPU fallback).
    `synchronize()` is not one of them."""
    from ..runtime import sync

    if isinstance(debug_mode, str):
        if debug_mode not in _SYNC_DEBUG_MODES:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        debug_mode = _SYNC_DEBUG_MODES[debug_mode]
    sync.debug_mode = int(debug_mode)


def get_sync_debug_mode() -> int:
    from ..runtime import sync

    return sync.debug_mode


# --- adaptive eager ------------------------------------------------------------


def set_adaptive_eager(enabled: bool) -> None:
    """Queue ops and run them as fused executables (see torchneuron/eager/adaptive.py); on by default."""
    _adaptive().set_enabled(enabled)


def is_adaptive_eager_enabled() -> bool:
    return _adaptive().is_enabled()


def adaptive_eager(enabled: bool = True):
    """A context manager turning adaptive eager on (or off) within it."""
    return _adaptive().enabled(enabled)


def adaptive_eager_stats() -> dict:
    return _adaptive().stats()


def set_host_bookkeeping(enabled: bool) -> None:
    """Run a small integer op whose shapes keep changing on the CPU, compiling a shape of it when it recurs
    (see torchneuron/eager/host_bookkeeping.py); on by default."""
    _host_bookkeeping().set_enabled(enabled)


def host_bookkeeping(enabled: bool = True):
    """A context manager turning host bookkeeping on (or off) within it."""
    return _host_bookkeeping().enabled_within(enabled)


def host_bookkeeping_report() -> dict:
    """Per op, its runs on the CPU as a new shape (`set_host_bookkeeping`) since start."""
    return dict(_host_bookkeeping().counts.most_common())


def _host_bookkeeping():
    from ..eager import host_bookkeeping

    return host_bookkeeping


# --- streams and events --------------------------------------------------------

# --- random numbers ------------------------------------------------------------


def _rng():
    from ..runtime import rng

    return rng


class _DefaultGenerators(tuple):
    """torch.neuron.default_generators: one torch.Generator per device, as torch.cuda's."""

    def __new__(cls):
        return super().__new__(cls, (_rng().generator(i) for i in range(device_count())))


def __getattr__(name):
    # built on first use: the device count starts the PJRT platform
    if name == "default_generators":
        globals()[name] = value = _DefaultGenerators()
        return value
    raise AttributeError(f"module 'torch.neuron' has no attribute {name!r}")


def manual_seed(seed: int) -> None:
    _rng().generator(current_device()).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _rng().generator(i).manual_seed(int(seed))


def seed() -> int:
    return _rng().generator(current_device()).seed()


def seed_all() -> None:
    value = _rng().generator(0).seed()
    for i in range(1, device_count()):
        _rng().generator(i).manual_seed(value)


def initial_seed() -> int:
    return _rng().generator(current_device()).initial_seed()


def get_rng_state(device="neuron") -> torch.Tensor:
    return _rng().generator(_index(device)).get_state()


def set_rng_state(new_state: torch.Tensor, device="neuron") -> None:
    _rng().generator(_index(device)).set_state(new_state.cpu())


def get_rng_state_all() -> list:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


# --- memory ---------------------------------------------------------------------


def _memory():
    from ..runtime import memory

    return memory


def memory_allocated(device=None) -> int:
    return _memory().account(_index(device)).allocated


def max_memory_allocated(device=None) -> int:
    return _memory().account(_index(device)).peak


def memory_reserved(device=None) -> int:
    return memory_allocated(device)


def max_memory_reserved(device=None) -> int:
    return max_memory_allocated(device)


def reset_peak_memory_stats(device=None) -> None:
    _memory().reset_peak(_index(device))


reset_max_memory_allocated = reset_peak_memory_stats
# torch.cuda's older names, which some training code still calls
memory_cached, max_memory_cached = memory_reserved, max_memory_reserved
reset_max_memory_cached = reset_peak_memory_stats


def memory_stats(device=None) -> dict:
    """CUDA's statistics by CUDA's names, for the tools that read them (TorchTitan's memory monitor).
    PJRT allocates each buffer as it is made and frees it when it dies: there is no caching allocator,
    so reserved equals allocated equals active, and an allocation is never retried. The accumulated
    figures (`.allocated`, `.freed`, the allocation count, `num_ooms`) count from the last
    `reset_accumulated_memory_stats`."""
    index = _index(device)
    account = _memory().account(index)
    stats = {"num_alloc_retries": 0, "num_ooms": account.ooms, "allocation.all.allocated": account.allocations}
    for name in ("allocated_bytes", "active_bytes", "reserved_bytes", "requested_bytes"):
        stats[f"{name}.all.current"] = account.allocated
        stats[f"{name}.all.peak"] = account.peak
        stats[f"{name}.all.allocated"] = account.allocated_total
        stats[f"{name}.all.freed"] = account.freed_bytes()
    for name, value in (_jax_device(index).memory_stats() or {}).items():
        stats[f"pjrt.{name}"] = value
    return stats


def memory_stats_as_nested_dict(device=None) -> dict:
    """`memory_stats` with its dotted names as nested dictionaries, as torch.cuda's."""
    nested = {}
    for name, value in memory_stats(device).items():
        *path, leaf = name.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def reset_accumulated_memory_stats(device=None) -> None:
    _memory().reset_accumulated(_index(device))


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A readable table of the memory statistics, as torch.cuda's: what PyTorch holds on the device now,
    at its peak, allocated and freed since the last reset; then what the device itself reports.
    `abbreviated` is accepted for torch.cuda's signature: there is one pool, so nothing to abbreviate."""
    index = _index(device)
    memory = _memory()
    account = memory.account(index)
    free, total = memory.free_and_total(index)
    width = 75
    rule, double_rule = "|" + "-" * width + "|", "|" + "=" * width + "|"

    def row(*cells):
        return "| " + cells[0].ljust(21) + "".join(f" | {c:>10}" for c in cells[1:]) + " |"

    lines = [
        double_rule,
        "|" + f"PyTorch neuron memory summary, device ID {index}".center(width) + "|",
        rule,
        "|" + "no caching allocator: reserved memory is allocated memory".center(width) + "|",
        rule,
        row("Metric", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed"),
        rule,
        row("Allocated memory", *(memory.size_text(n) for n in (
            account.allocated, account.peak, account.allocated_total, account.freed_bytes()))),
        row("Allocations", "", "", str(account.allocations), ""),
        rule,
        "| " + f"Allocations refused (OOMs): {account.ooms}".ljust(width - 1) + "|",
        "| " + f"Device: {memory.size_text(total - free)} used of {memory.size_text(total)}".ljust(width - 1) + "|",
        double_rule,
    ]
    return "\n".join(lines) + "\n"


def set_per_process_memory_fraction(fraction, device=None) -> None:
    """Limit what this process may hold on the device to `fraction` of its total memory, as torch.cuda's: a
    storage past it raises torch.OutOfMemoryError. On XLA:CPU the total is the host's memory."""
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _memory().set_limit(_index(device), fraction)


def get_per_process_memory_fraction(device=None) -> float:
    return _memory().account(_index(device)).fraction


def mem_get_info(device=None):
    """(free, total) bytes of the device: PJRT's figures, or the host's on XLA:CPU."""
    return _memory().free_and_total(_index(device))


def device_memory_used(device=None) -> int:
    """Bytes in use on the device by every process, as the device reports them (the host's on XLA:CPU)."""
    free, total = mem_get_info(device)
    return total - free


def empty_cache() -> None:
    """Give the memory freed device buffers left back to the system, as torch.cuda's returns its cached
    blocks: on XLA:CPU, where malloc keeps it for the next program run (runtime/host_memory.py); on other
    platforms PJRT frees each device buffer when its last tensor dies, and nothing is kept. Compiled
    executables are kept; see `clear_executable_cache`."""
    from ..runtime import host_memory

    host_memory.release()


def ipc_collect() -> None:
    """Nothing to collect: neuron tensors are not shared between processes by IPC handles (a tensor sent to
    another process is a host copy)."""


def empty_host_cache() -> None:
    """Nothing to release: pinned host blocks are ordinary host memory, freed when their tensor dies
    (native/storage.cpp); there is no caching host allocator."""


# --- mixed precision -----------------------------------------------------------


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# --- backend introspection ------------------------------------------------------


def fallback_report() -> dict:
    """CPU-fallback counts per op since start (or the last reset)."""
    from ..eager import fallback

    return fallback.report()


def cache_stats() -> dict:
    from ..runtime.cache import eager_cache

    return eager_cache.stats()


def clear_executable_cache() -> None:
    """Drop the compiled eager executables and adaptive eager's fused programs (host memory; each op
    signature compiles again on its next use)."""
    from ..eager.adaptive import fused_cache
    from ..runtime.cache import eager_cache

    eager_cache.clear()
    fused_cache.clear()
