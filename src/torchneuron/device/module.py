"""`torch.neuron`: the device module, as complete as torch.cuda is for ordinary use."""
import functools

import torch

from ..native import _C as native

_current_streams = {}
# as torch.cuda.OutOfMemoryError: what the allocator raises when the device cannot hold a request
OutOfMemoryError = torch.OutOfMemoryError


def _runtime():
    from ..runtime import platform

    return platform


def is_available() -> bool:
    return _runtime().device_count() > 0


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    return None


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return _runtime().device_count()


def current_device() -> int:
    """This thread's current neuron device (per thread, as CUDA's; the autograd engine's device
    threads each set their own)."""
    return native.current_device()


def _index(device=None) -> int:
    if device is None:
        return native.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "neuron":
        raise ValueError(f"Expected a neuron device, but got: {device}")
    return device.index if device.index is not None else native.current_device()


def set_device(device) -> None:
    index = _index(device)
    if index >= 0:
        native.set_device(index)


class device:
    """Context manager that changes the current neuron device."""

    def __init__(self, device):
        self.index = _index(device) if device is not None else -1
        self.previous = -1

    def __enter__(self):
        self.previous = native.exchange_device(self.index)

    def __exit__(self, *exc):
        if self.index >= 0:
            native.set_device(self.previous)
        return False


def device_of(tensor):
    return device(tensor.device.index if tensor.device.type == "neuron" else -1)


def _jax_device(index: int):
    return _runtime().jax_device(index)


def get_device_name(device=None) -> str:
    d = _jax_device(_index(device))
    return f"neuron ({d.platform}: {d.device_kind})"


def get_device_capability(device=None):
    return (0, 0)


@functools.cache
def _properties(index: int):
    from types import SimpleNamespace

    d = _jax_device(index)
    return SimpleNamespace(
        name=get_device_name(index),
        platform=d.platform,
        device_kind=d.device_kind,
        total_memory=_memory().free_and_total(index)[1],
        multi_processor_count=1,
        type="neuron",
        index=index,
    )


def get_device_properties(device=None):
    return _properties(_index(device))


# --- synchronisation -----------------------------------------------------------


def _adaptive():
    from ..eager import adaptive

    return adaptive


def _all_ready(index: int) -> bool:
    from ..runtime import sync

    _adaptive().flush()
    return sync.ready(index, _jax_device(index))


def synchronize(device=None) -> None:
    """Wait until every operation queued on the device has finished, and report failed device checks."""
    from ..runtime import pending_checks, sync

    index = _index(device)
    _adaptive().flush()
    sync.wait(index, _jax_device(index))
    pending_checks.raise_failures(index)


# --- adaptive eager ------------------------------------------------------------


def set_adaptive_eager(enabled: bool) -> None:
    """Queue ops and run them as fused executables (see torchneuron/eager/adaptive.py); off by default."""
    _adaptive().set_enabled(enabled)


def is_adaptive_eager_enabled() -> bool:
    return _adaptive().is_enabled()


def adaptive_eager(enabled: bool = True):
    """A context manager turning adaptive eager on (or off) within it."""
    return _adaptive().enabled(enabled)


def adaptive_eager_stats() -> dict:
    return _adaptive().stats()


# --- streams and events --------------------------------------------------------

from .streams import Event, Stream, StreamContext  # noqa: E402,F401  (torch.neuron.Event)


def current_stream(device=None) -> Stream:
    index = _index(device)
    return _current_streams.get(index) or default_stream(index)


@functools.cache
def _default_stream(index: int) -> Stream:
    return Stream(index, stream_id=0)


def default_stream(device=None) -> Stream:
    return _default_stream(_index(device))


def set_stream(stream) -> None:
    _current_streams[stream.device_index] = stream


def stream(stream) -> StreamContext:
    return StreamContext(stream)


# --- random numbers ------------------------------------------------------------


def _rng():
    from . import rng

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


def memory_stats(device=None) -> dict:
    """CUDA's statistics by CUDA's names, for the tools that read them (TorchTitan's memory monitor).
    PJRT allocates each buffer as it is made and frees it when it dies: there is no caching allocator,
    so reserved equals allocated equals active, and an allocation is never retried."""
    index = _index(device)
    account = _memory().account(index)
    stats = {"num_alloc_retries": 0, "num_ooms": account.ooms, "allocation.all.allocated": account.allocations}
    for name in ("allocated_bytes", "active_bytes", "reserved_bytes", "requested_bytes"):
        stats[f"{name}.all.current"] = account.allocated
        stats[f"{name}.all.peak"] = account.peak
    for name, value in (_jax_device(index).memory_stats() or {}).items():
        stats[f"pjrt.{name}"] = value
    return stats


def mem_get_info(device=None):
    """(free, total) bytes of the device: PJRT's figures, or the host's on XLA:CPU."""
    return _memory().free_and_total(_index(device))


def empty_cache() -> None:
    """Drop cached eager executables; device buffers are freed as soon as tensors die."""
    from ..runtime.cache import eager_cache

    eager_cache.clear()


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
