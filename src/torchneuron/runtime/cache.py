"""A bounded executable cache with hit/miss counters."""
import os


class ExecutableCache:
    def __init__(self, capacity: int):
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


eager_cache = ExecutableCache(int(os.environ.get("TORCHNEURON_EAGER_CACHE_SIZE", "4096")))
