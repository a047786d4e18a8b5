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
from typing import Any

from ..queues.args import parse_queue_arguments
from ..queues.entry import QueueEntry
from ..queues.queue import Queue

HELD_QUEUE = "amq.triomq.transactions"


class _SystemOwner:
    """Exclusive owner of the internal queue: never a client session."""

    def __repr__(self) -> str:
        return "<triomq transactions>"


SYSTEM_OWNER = _SystemOwner()


class HeldReady:
    """The ready store of a ``HeldQueue``: nothing is ever ready, everything is held.

    ``pending`` is the vhost's table (transaction id -> ``Pending``) kept by
    ``Transactions``; the stored entries are read from it, never copied.
    """

    accepts_paged_index = False

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


class HeldQueue(Queue):
    """The internal queue of one vhost; created by ``Transactions.new_queue``."""

    store: Any  # the vhost's persistent store (or None): written by this queue itself
    internal = True

    def __init__(self, transactions, vhost, name: str = HELD_QUEUE) -> None:
        self.transactions = transactions  # before Queue.__init__: _new_ready() asks it
        opts = parse_queue_arguments({})
        opts.max_length = 0
        opts.overflow = "reject-publish"
        super().__init__(vhost, name, durable=True, exclusive_owner=SYSTEM_OWNER,
                         arguments={}, opts=opts)
        self._stored_seq = 1  # seq of the next stored half message

    def _new_ready(self) -> HeldReady:
        return HeldReady(self.transactions.table(self.vhost.name))

    @property
    def keeps_definition(self) -> bool:
        return True  # durable although owned by the broker: the vhost stores it

    def attach_store(self, store) -> None:
        """Persist through ``store``; writes are this queue's own (``write``/``forget``)."""
        self.store = store

    def enqueue(self, message, *, entry: QueueEntry | None = None) -> bool:
        """A publish routed here is refused; a stored entry handed back is adopted."""
        if entry is None:
            return super().enqueue(message)
        if entry.seq >= self._stored_seq:
            self._stored_seq = entry.seq + 1
        return self.transactions.adopt(self, entry)

    def restore(self, entries=(), *, paged=None) -> int:
        return sum(self.enqueue(e.message, entry=e) for e in entries)

    def write(self, message) -> QueueEntry:
        """Store one half message (persistent, durable store)."""
        seq = self._stored_seq
        self._stored_seq = seq + 1
        entry = QueueEntry(message, seq)
        self.store.enqueue(self, entry)
        return entry

    def forget(self, entry: QueueEntry) -> None:
        """Remove a stored half message (decided, or a stale copy found at recovery)."""
        if self.store is not None:
            self.store.remove(self, entry)
