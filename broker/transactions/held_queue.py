"""``HeldQueue``: the internal durable queue that keeps prepared (half) messages.

One per vhost, ``amq.triomq.transactions``, built on the scheduler's pattern of a queue
variant with its own ready store: every store backend (journal, SQL) persists it as an
ordinary durable queue, so half messages survive a restart and ``kill -9`` without
store code of their own. But:

* its ready store (``HeldReady``) is empty for the dispatcher, ``basic.get``, purge and
  counts; for the journal's checkpoints and compaction it lists the stored entries;
* clients cannot see it (``internal``: 404, never routed to by name), it is owned by the
  broker, and x-max-length 0 + reject-publish refuses anything that would reach it;
* at start-up the store hands its entries back (``enqueue(message, entry=e)`` or
  ``restore(entries)``, as for any queue) and each is adopted by ``Transactions``.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..queues.entry import QueueEntry
from ..queues.internal import InternalQueue

if TYPE_CHECKING:
    from ..vhost import VirtualHost

HELD_QUEUE = "amq.triomq.transactions"


class HeldReady:
    """The ready store of a ``HeldQueue``: nothing is ever ready, everything is held.

    ``pending`` is the vhost's table (transaction id -> ``Pending``) kept by
    ``Transactions``; the stored entries are read from it, never copied.
    """

    accepts_paged_index = False
    stored_behind = 0

    def __init__(self, pending: dict):
        self.pending = pending

    def __len__(self) -> int:
        return 0

    def __iter__(self) -> Iterator[QueueEntry]:
        return iter(())

    def append(self, entry: QueueEntry) -> None:
        raise RuntimeError("held messages are not queued")  # x-max-length 0 refuses first

    def popleft(self) -> QueueEntry:
        raise IndexError("no ready message")

    def peek(self) -> QueueEntry | None:
        return None

    def requeue(self, entry: QueueEntry) -> None:
        raise RuntimeError("held messages are never delivered")

    def clear(self) -> list[QueueEntry]:
        return []

    def pop_tail(self) -> QueueEntry:
        raise IndexError("no ready message")

    def head_entries(self) -> list[QueueEntry]:
        return [p.entry for p in self.pending.values() if p.entry is not None]

    def paged_index(self):
        return None

    def relocate_paged(self, segments, move) -> int:
        return 0


class HeldQueue(InternalQueue):
    """The internal queue of one vhost; created by ``Transactions.new_queue``."""

    def __init__(self, transactions, vhost: VirtualHost, name: str = HELD_QUEUE) -> None:
        self.transactions = transactions  # before Queue.__init__: _new_ready() asks it
        super().__init__(vhost, name)

    def _new_ready(self) -> HeldReady:
        return HeldReady(self.transactions.table(self.vhost.name))

    def adopt(self, entry: QueueEntry) -> bool:
        return self.transactions.adopt(self, entry)

    def restore(self, entries=(), *, paged=None) -> int:
        return sum(self.enqueue(e.message, entry=e) for e in entries)
