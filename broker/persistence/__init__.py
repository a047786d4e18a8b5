"""Storage backends behind one interface (see base.Store)."""
from .base import MemoryStore, Store, StoreUnavailable


def open_store(url: str | None, data_dir: str) -> Store:
    """Pick a backend from ``--store``: 'memory' for now; journal and SQL plug in here."""
    if url in (None, "", "memory", "journal"):
        return MemoryStore()
    raise StoreUnavailable(f"unsupported store URL {url!r}")


__all__ = ["MemoryStore", "Store", "StoreUnavailable", "open_store"]
