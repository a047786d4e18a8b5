"""The one interface every storage backend implements.

The core calls these synchronously from the event loop; a backend buffers and
does its I/O in its own task (``run``), started in the broker's nursery. A
confirm for a persistent message waits on ``when_durable``: the callback runs
once everything enqueued before it is on disk (group commit).
"""
from __future__ import annotations

from typing import Callable


class Store:
    name = "abstract"

    # ---- life cycle (edge, async) ----
    async def open(self) -> None:
        """Connect / open files; raise StoreUnavailable with one clear line on failure."""

    async def run(self) -> None:
        """Background work (group commit, GC, checkpoints) until cancelled."""

    async def close(self) -> None:
        """Flush and release everything."""

    def recover(self, broker) -> None:
        """Recreate durable exchanges, queues, bindings and persistent messages."""

    # ---- definitions ----
    def save_exchange(self, vhost, exchange) -> None: ...
    def delete_exchange(self, vhost, exchange) -> None: ...
    def save_queue(self, vhost, queue) -> None: ...
    def delete_queue(self, vhost, queue) -> None: ...
    def save_binding(self, vhost, binding) -> None: ...
    def delete_binding(self, vhost, binding) -> None: ...

    # ---- messages ----
    def enqueue(self, queue, entry) -> None:
        """A persistent message entered a durable queue."""

    def delivered(self, queue, entry) -> None:
        """First delivery of a stored message: after a crash it comes back redelivered=true."""

    def remove(self, queue, entry) -> None:
        """The message left the queue for good (acked, dropped, expired, dead-lettered)."""

    def when_durable(self, callback: Callable[[], None],
                     on_failure: Callable[[], None] | None = None) -> None:
        """Call ``callback`` once all writes issued so far are durable, or ``on_failure``
        (the publish is nacked) if the backend could not write them."""
        callback()


class StoreUnavailable(RuntimeError):
    """The backend cannot be opened (unreachable database, unreadable data dir)."""


class MemoryStore(Store):
    """Nothing survives a restart; used by tests and ``--store memory``."""
    name = "memory"
