"""Storage backends behind one interface (see base.Store)."""
from .base import MemoryStore, Store, StoreUnavailable


def open_store(url: str | None, data_dir: str, flush: str = "sync") -> Store:
    """Pick a backend from ``--store``: journal (default), memory, or a SQLAlchemy URL."""
    if url in (None, "", "journal"):
        from .journal import JournalStore
        return JournalStore(data_dir, flush=flush)
    if url == "memory":
        return MemoryStore()
    if url.startswith(("sqlite", "postgresql", "mysql", "mariadb")):
        from .sql import SQLStore
        return SQLStore(url, flush=flush)
    raise StoreUnavailable(f"unsupported store URL {url!r} (journal, memory, sqlite:///..., "
                           f"postgresql+psycopg://..., mysql+pymysql://...)")


__all__ = ["MemoryStore", "Store", "StoreUnavailable", "open_store"]
