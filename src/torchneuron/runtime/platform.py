"""Which PJRT platform backs the `neuron` device, and its devices.

`TORCHNEURON_PLATFORM` names the JAX platform (`cpu`, `cuda`, `neuron`, ...);
the default is XLA:CPU so the backend works on any machine.
XLA:CPU gets `TORCHNEURON_CPU_DEVICES` devices (default 2), so multi-device
code (neuron:1, backward on it, device generators) runs without an accelerator.
"""
import functools
import os

import jax

PLATFORM_ENV = "TORCHNEURON_PLATFORM"
CPU_DEVICES_ENV = "TORCHNEURON_CPU_DEVICES"
DEFAULT_CPU_DEVICES = 2

# PyTorch uses int64 and float64 freely; without x64 JAX would silently narrow them.
jax.config.update("jax_enable_x64", True)


def platform_name() -> str:
    return os.environ.get(PLATFORM_ENV, "cpu").lower()


@functools.cache
def devices() -> tuple:
    name = platform_name()
    if name == "cpu":
        _set_cpu_device_count(os.environ.get(CPU_DEVICES_ENV))
    try:
        found = tuple(jax.devices(name))
    except RuntimeError as exc:
        raise RuntimeError(
            f"torchneuron: PJRT platform {name!r} (from ${PLATFORM_ENV}) is not available: {exc}"
        ) from None
    return found


def _set_cpu_device_count(requested) -> None:
    try:
        jax.config.update("jax_num_cpu_devices", int(requested or DEFAULT_CPU_DEVICES))
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
    return found[index]
