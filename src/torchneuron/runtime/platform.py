"""Which PJRT platform backs the `neuron` device, and its devices.

`TORCHNEURON_PLATFORM` names the JAX platform (`cpu`, `cuda`, `neuron`, ...);
the default is XLA:CPU so the backend works on any machine.
XLA:CPU gets `TORCHNEURON_CPU_DEVICES` devices (default 2; 1 per process in a
multi-process run), so multi-device code (neuron:1, backward on it, device
generators) runs without an accelerator.

Several processes (one per rank, as under `torchrun`) share one JAX runtime
(multi-controller JAX) once they `join`: collectives are then ordinary XLA
programs over every rank's device. Joining must precede the first device use,
so it happens either in `init_process_group` (the c10d store agrees on the
coordinator) or, under `torchrun`, at the first device use (through the
agent's store). A joined process's neuron indices are the node's devices, one
block per local rank: `neuron:LOCAL_RANK` is its own device (as CUDA numbers
a node's GPUs); the other indices are its peers' and cannot be used from it.
"""
import dataclasses
import functools
import os
import socket

import jax
from jax._src import xla_bridge

from ..native import _C as native
from . import compilation_cache, host_memory

PLATFORM_ENV = "TORCHNEURON_PLATFORM"
CPU_DEVICES_ENV = "TORCHNEURON_CPU_DEVICES"
DEFAULT_CPU_DEVICES = 2

# PyTorch uses int64 and float64 freely; without x64 JAX would silently narrow them.
jax.config.update("jax_enable_x64", True)


def platform_name() -> str:
    return os.environ.get(PLATFORM_ENV, "cpu").lower()


def pallas_pays() -> bool:
    """Whether kernels are better lowered with Pallas than left to XLA's fusion on this platform: on
    NVIDIA and AMD GPUs (Pallas' Triton backend), not on XLA:CPU or Trainium."""
    return platform_name() in ("cuda", "gpu", "rocm")


COORDINATOR_ENV = "TORCHNEURON_COORDINATOR"


@dataclasses.dataclass(frozen=True)
class Processes:
    """The processes sharing this JAX runtime; `index` is the rank, `local_rank` the rank on its node."""

    coordinator: str
    count: int
    index: int
    local_rank: int
    local_count: int


joined = None  # Processes once this process has joined others


def join(coordinator: str, count: int, index: int, local_rank: int, local_count: int, timeout_s: int = 300) -> Processes:
    """Join the `count` processes sharing one JAX runtime, whose coordinator (run by process 0) is
    `host:port`. Idempotent for the same processes (a second process group reuses the runtime)."""
    global joined
    wanted = Processes(coordinator, count, index, local_rank, local_count)
    if joined is not None:
        if (joined.count, joined.index) != (count, index):
            raise RuntimeError(
                f"neuron: this process already shares its device runtime as rank {joined.index} of "
                f"{joined.count}; it cannot become rank {index} of {count} (one runtime per process)"
            )
        return joined
    started = devices.cache_info().currsize or xla_bridge.backends_are_initialized()
    if started and count == 1:
        # one process has no peers to join: its runtime serves as it is (TorchTitan makes tensors first)
        joined = wanted
        return joined
    if started:
        raise RuntimeError(
            "neuron: the device runtime started before this process joined the others: call "
            "dist.init_process_group before making neuron tensors (or launch with torchrun, which "
            "joins at the first device use)"
        )
    name = platform_name()
    if name == "cpu":
        # XLA:CPU runs cross-process collectives only with an explicit implementation
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator, count, index,
        # one device per process on accelerators, as CUDA_VISIBLE_DEVICES would give
        local_device_ids=None if name == "cpu" else [local_rank],
        initialization_timeout=timeout_s,
        heartbeat_timeout_seconds=max(10, min(timeout_s, 100)),
        shutdown_timeout_seconds=max(10, min(timeout_s, 300)),
    )
    joined = wanted
    return joined


def free_coordinator_address(host: str) -> str:
    """`host:port` with a port free on this host now (process 0 binds it for the coordinator)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return f"{host}:{probe.getsockname()[1]}"


def _join_under_torchrun() -> None:
    """Under torchrun the agent's store exists before any worker code runs: agree on the coordinator
    there, so a device used before init_process_group is already this rank's."""
    env = os.environ
    count = int(env.get("WORLD_SIZE", "1"))
    if joined is not None or count < 2 or "LOCAL_RANK" not in env:
        return
    coordinator = env.get(COORDINATOR_ENV)
    if coordinator is None:
        if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            return
        import datetime

        import torch.distributed as dist

        store = dist.TCPStore(
            env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=datetime.timedelta(seconds=300)
        )
        key = f"torchneuron/coordinator/{env.get('TORCHELASTIC_RUN_ID', '')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        if int(env["RANK"]) == 0:
            store.set(key, free_coordinator_address(env["MASTER_ADDR"]))
        coordinator = store.get(key).decode()
    join(coordinator, count, int(env["RANK"]), int(env["LOCAL_RANK"]), int(env.get("LOCAL_WORLD_SIZE", "1")))


@functools.cache
def devices() -> tuple:
    """The neuron devices by index; None where the index is a peer process's device."""
    name = platform_name()
    compilation_cache.configure_jax(name)
    _join_under_torchrun()
    if name == "cpu":
        _set_cpu_device_count(os.environ.get(CPU_DEVICES_ENV))
        host_memory.keep_freed_memory()
    try:
        found = tuple(jax.local_devices(backend=name))
    except RuntimeError as exc:
        raise RuntimeError(
            f"torchneuron: PJRT platform {name!r} (from ${PLATFORM_ENV}) is not available: {exc}"
        ) from None
    if joined is None:
        return found
    peers = (None,) * len(found)
    # threads that never chose a device use this process's own, as a rank's threads use its GPU
    native.set_default_device(joined.local_rank * len(found))
    return peers * joined.local_rank + found + peers * (joined.local_count - joined.local_rank - 1)


def _set_cpu_device_count(requested) -> None:
    # a process sharing the runtime with others owns one device, as a rank owns one GPU
    default = 1 if joined is not None else DEFAULT_CPU_DEVICES
    try:
        jax.config.update("jax_num_cpu_devices", int(requested or default))
    except RuntimeError:
        # JAX already started its CPU backend (the user ran JAX first): only an explicit request is an error
        if requested:
            raise


def device_count() -> int:
    try:
        return len(devices())
    except RuntimeError:
        return 0


def jax_device(index: int):
    found = devices()
    if not 0 <= index < len(found):
        raise RuntimeError(
            f"neuron device index {index} is out of range: {len(found)} device(s) on platform {platform_name()!r}"
        )
    device = found[index]
    if device is None:
        own = [i for i, d in enumerate(found) if d is not None]
        raise RuntimeError(
            f"neuron:{index} belongs to another process of this node; this process (local rank "
            f"{joined.local_rank}) owns neuron:{own[0]}" + (f"..{own[-1]}" if len(own) > 1 else "")
            + ": use torch.device('neuron', LOCAL_RANK) or torch.neuron.set_device(LOCAL_RANK)"
        )
    return device
