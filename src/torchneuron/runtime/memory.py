"""Per-device memory accounting of live neuron storages (bytes).

Storages update their device's Account directly: it is on every op's path, and
attribute updates of a slotted object cost a fraction of Counter updates.
"""
import functools
import os

import torch

from .platform import jax_device


class Account:
    """Bytes held now and at the peak; since the last reset of the accumulated statistics, the allocations
    made, their bytes, and the allocations refused. Freed bytes follow from these (see `freed_bytes`), so
    a storage's death updates one figure. `limit`: the bytes this process may hold on the device
    (torch.neuron.set_per_process_memory_fraction), or None."""

    __slots__ = ("device_index", "allocated", "peak", "allocations", "allocated_total", "allocated_at_reset", "ooms",
                 "limit", "fraction", "threshold")

    def __init__(self, device_index: int):
        self.device_index = device_index
        self.allocated = 0
        self.peak = 0
        self.allocations = 0
        self.allocated_total = 0
        self.allocated_at_reset = 0
        self.ooms = 0  # allocations refused for lack of device memory
        self.limit = None
        self.fraction = 1.0
        self.threshold = 0  # the lesser of peak and limit: only an allocation past it needs a look

    def allocate(self, nbytes: int) -> None:
        """One allocation of `nbytes` (a new storage, or the new size of a resized one). One past the limit is
        counted, then refused: the storage that asked gives it back when it dies."""
        self.allocations += 1
        self.allocated_total += nbytes
        self.allocated += nbytes
        if self.allocated > self.threshold:
            if self.limit is not None and self.allocated > self.limit:
                raise self.refusal(nbytes, f"This process may hold {size_text(self.limit)} of neuron:"
                                           f"{self.device_index} (set_per_process_memory_fraction) and PyTorch holds "
                                           f"{size_text(self.allocated - nbytes)} of it.")
            self.peak = max(self.peak, self.allocated)
            self.update_threshold()

    def refusal(self, nbytes: int, why: str) -> torch.OutOfMemoryError:
        """CUDA's error for an allocation of `nbytes` refused, counted."""
        self.ooms += 1
        return torch.OutOfMemoryError(f"neuron out of memory. Tried to allocate {size_text(nbytes)} ({nbytes} bytes). "
                                      f"{why}")

    def update_threshold(self) -> None:
        self.threshold = self.peak if self.limit is None else min(self.peak, self.limit)

    def freed_bytes(self) -> int:
        """Bytes freed since the last reset of the accumulated statistics."""
        return self.allocated_at_reset + self.allocated_total - self.allocated

    def reset_accumulated(self) -> None:
        self.allocations = self.allocated_total = self.ooms = 0
        self.allocated_at_reset = self.allocated


class _Accounts(dict):
    def __missing__(self, device_index: int) -> Account:
        self[device_index] = account = Account(device_index)
        return account


accounts = _Accounts()


def account(device_index: int) -> Account:
    return accounts[device_index]


def reset_peak(device_index: int) -> None:
    a = accounts[device_index]
    a.peak = a.allocated
    a.update_threshold()


def set_limit(device_index: int, fraction: float) -> None:
    """The bytes this process may hold on the device: `fraction` of its total, as CUDA's allocator limits it."""
    a = accounts[device_index]
    a.fraction, a.limit = fraction, int(fraction * free_and_total(device_index)[1])
    a.update_threshold()


def reset_accumulated(device_index: int) -> None:
    accounts[device_index].reset_accumulated()


def free_and_total(device_index: int) -> tuple:
    """Bytes free and in all on the device: PJRT's figures where it keeps them, else (XLA:CPU) the host's."""
    stats = jax_device(device_index).memory_stats() or {}
    if "bytes_limit" in stats:
        total = int(stats["bytes_limit"])
        return total - int(stats.get("bytes_in_use", 0)), total
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page + _host_reclaimable(), os.sysconf("SC_PHYS_PAGES") * page


def _host_reclaimable() -> int:
    """Page cache the kernel gives back on demand (MemAvailable less MemFree), where /proc says."""
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
    except OSError:
        return 0
    return (int(fields["MemAvailable"].split()[0]) - int(fields["MemFree"].split()[0])) * 1024


@functools.cache
def _worth_asking(device_index: int) -> int:
    """Requests up to a quarter of the device's memory go ahead unasked: asking costs a system call."""
    return free_and_total(device_index)[1] // 4


def size_text(nbytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.2f} {unit}"
        nbytes /= 1024


def check_fits(nbytes: int, device_index: int) -> None:
    """Raise torch.OutOfMemoryError, as CUDA's allocator does, for an allocation the device cannot hold
    (PJRT would fail later, at first use, with an error PyTorch code does not expect)."""
    if nbytes <= _worth_asking(device_index):
        return
    free, total = free_and_total(device_index)
    if nbytes > free:
        account = accounts[device_index]
        raise account.refusal(nbytes, f"neuron:{device_index} has a total capacity of {size_text(total)} of which "
                                      f"{size_text(free)} is free; PyTorch holds {size_text(account.allocated)} of it.")


def raise_if_exhausted(error: Exception, device_index: int) -> None:
    """XLA's RESOURCE_EXHAUSTED from running a program, as the torch.OutOfMemoryError PyTorch code expects."""
    if "RESOURCE_EXHAUSTED" in str(error):
        accounts[device_index].ooms += 1
        raise torch.OutOfMemoryError(
            f"neuron out of memory on neuron:{device_index}: {str(error).splitlines()[0]}"
        ) from None
