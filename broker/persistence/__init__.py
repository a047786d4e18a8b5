"""Storage backends behind one interface (see base.Store) and one URL registry."""
from .base import (
    DURABLE,
    PAGES_MESSAGES,
    READS_BACK,
    MemoryStore,
    Store,
    StoreUnavailable,
    open_store,
    register_store,
    store_class,
)

__all__ = ["DURABLE", "PAGES_MESSAGES", "READS_BACK", "MemoryStore", "Store", "StoreUnavailable",
           "open_store", "register_store", "store_class"]
