"""On XLA:CPU the device's memory is the process's heap: keep what its programs free for their next run, as
a device's caching allocator (PyTorch's for CUDA) keeps freed device memory.

glibc's malloc gives blocks above its mmap threshold (128 KB, raised by use to at most 32 MB) mappings of
their own and unmaps them when they are freed, and it returns the heap's free top to the system above its
trim threshold: each run of a compiled program then faults its buffers' pages in afresh. A small GPT's
compiled training step (bench.models gpt, 2 cores) took 10-14k page faults and 50-80 ms of system time a
step, a sixth of its wall-clock time. At the first device use on XLA:CPU the thresholds are raised (the
largest mmap threshold glibc accepts, a trim threshold of 256 MB, 64 MB of padding to each growth of the
heap), so freed buffers stay in the process and the next run reuses their pages.
`torch.neuron.empty_cache()` gives the free memory back (`malloc_trim`). Other C libraries, and
`TORCHNEURON_KEEP_HOST_MEMORY=0`, leave malloc as it is.
"""
import ctypes
import functools
import os

ENV = "TORCHNEURON_KEEP_HOST_MEMORY"
# mallopt's parameters (malloc.h) and the values set
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_SETTINGS = ((_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 256 << 20), (_M_TOP_PAD, 64 << 20))

kept = False  # whether this process keeps freed host memory


@functools.cache
def _glibc():
    """The process's C library if it is glibc (whose malloc the settings are for), else None."""
    libc = ctypes.CDLL(None)
    if not all(hasattr(libc, name) for name in ("gnu_get_libc_version", "mallopt", "malloc_trim")):
        return None
    return libc


def keep_freed_memory() -> None:
    """Raise malloc's thresholds (see the module's docstring); once per process."""
    global kept
    if kept or os.environ.get(ENV, "1") == "0" or _glibc() is None:
        return
    for parameter, value in _SETTINGS:
        _glibc().mallopt(parameter, value)
    kept = True


def release() -> None:
    """Give the free memory malloc keeps back to the system."""
    if kept:
        _glibc().malloc_trim(0)
