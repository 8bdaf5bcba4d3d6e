"""Bounded executable caches with hit/miss counters, released whole near the process's memory-map limit."""
import os
import weakref

import jax


class ExecutableCache:
    def __init__(self, capacity: int):
        _CACHES.add(self)
        self.capacity = capacity
        self.entries = {}
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, key):
        entry = self.entries.get(key)
        if entry is None:
            self.misses += 1
        else:
            self.hits += 1
        return entry

    def put(self, key, entry) -> None:
        if len(self.entries) >= self.capacity:
            # dicts keep insertion order: drop the oldest entry
            del self.entries[next(iter(self.entries))]
            self.evictions += 1
        self.entries[key] = entry
        _count_new_program()

    def replace(self, key, entry) -> None:
        """`entry` in the place of `key`'s, which stood in for it while it was made (if the cache still holds it)."""
        if key in self.entries:
            self.entries[key] = entry

    def clear(self) -> None:
        self.entries.clear()

    def stats(self) -> dict:
        return {
            "entries": len(self.entries),
            "capacity": self.capacity,
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
        }


_CACHES = weakref.WeakSet()

# Linux caps a process's memory mappings (vm.max_map_count, 65530 by default). XLA maps each executable's code
# (about 5 mappings on XLA:CPU), and JAX keeps executables of its own (op-by-op primitives, per shape) beyond
# ours; XLA:CPU crashes when a mapping then fails. A process compiling tens of thousands of programs (many
# shapes) crashed so; it now drops every cached executable, ours and JAX's, once its mappings pass
# MAP_SHARE of the limit: they are compiled again, or read from the persistent cache, when next used.
MAP_SHARE = 0.75
CHECK_EVERY = 256  # new programs between counts of the mappings (a count reads /proc/self/maps: ~10 ms)
released = 0  # times the caches were released
_new_programs = 0


def _count_new_program() -> None:
    global _new_programs
    _new_programs += 1
    if _new_programs % CHECK_EVERY == 0:
        release_near_map_limit()


def map_limit():
    try:
        with open("/proc/sys/vm/max_map_count") as source:
            return int(source.read())
    except (OSError, ValueError):
        return None  # not Linux


def map_count() -> int:
    with open(f"/proc/{os.getpid()}/maps") as source:
        return sum(1 for _ in source)


def release_near_map_limit() -> bool:
    """Drop every cached executable if the process's mappings are near the limit; whether it did."""
    global released
    limit = map_limit()
    if limit is None or map_count() < MAP_SHARE * limit:
        return False
    for cache in list(_CACHES):
        cache.clear()
    jax.clear_caches()
    released += 1
    return True


eager_cache = ExecutableCache(int(os.environ.get("TORCHNEURON_EAGER_CACHE_SIZE", "4096")))
