"""Per-device memory accounting of live neuron storages (bytes)."""
import collections

allocated = collections.Counter()
peak = collections.Counter()
allocations = collections.Counter()


def on_alloc(device_index: int, nbytes: int) -> None:
    allocated[device_index] += nbytes
    allocations[device_index] += 1
    if allocated[device_index] > peak[device_index]:
        peak[device_index] = allocated[device_index]


def on_free(device_index: int, nbytes: int) -> None:
    allocated[device_index] -= nbytes


def reset_peak(device_index: int) -> None:
    peak[device_index] = allocated[device_index]
