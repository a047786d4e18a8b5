"""``ScheduledQueue``: the internal queue whose ready store is the scheduler's slot table.

Pending scheduled messages live, per vhost, in one internal durable queue
(``amq.triomq.scheduled``), as LavinMQ's delayed-exchange queue is a queue
variant with its own message store. It is an ordinary durable queue for every
store backend (definition, stored entries, checkpoints), but:

* its ready store is a ``SlotTable`` (``_new_ready``), which ``attach_store``
  keeps (a paging store does not replace it);
* clients cannot see it (``internal``: 404, never routed to by name); it is owned by
  the broker, and x-max-length 0 + reject-publish refuses anything that reaches it;
  for the dispatcher its length is 0;
* recovery hands its stored entries back through ``enqueue(message, entry=e)``
  as for any queue: each one is adopted by the scheduler (slot, id, heap key)
  instead of being queued.

The queue also keeps each slot's stored copy: a journal location (the message is
read back when due), the QueueEntry itself for a store that cannot read messages
back (SQL), or nothing but a blob for a transient message.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..persistence.base import READS_BACK
from ..queues.entry import QueueEntry
from ..queues.internal import InternalQueue
from .slots import SlotTable

if TYPE_CHECKING:
    from ..vhost import VirtualHost

INTERNAL_QUEUE = "amq.triomq.scheduled"


class ScheduledQueue(InternalQueue):
    """The internal queue of one vhost; created by ``Scheduler.new_queue``."""

    ready: SlotTable  # from _new_ready

    def __init__(self, scheduler, vhost: VirtualHost, name: str = INTERNAL_QUEUE):
        self.scheduler = scheduler  # before Queue.__init__: _new_ready() asks it for the table
        super().__init__(vhost, name)
        self.ready.queue = self  # the table reads its stored copies through this queue

    def _new_ready(self) -> SlotTable:
        return self.scheduler.table(self.vhost.name)

    def adopt(self, entry: QueueEntry) -> bool:
        return self.scheduler.adopt(self, entry)

    @property
    def restores_paged(self) -> bool:
        """A store that reads messages back may hand this queue its paged index."""
        return self.reads_back

    def restore(self, entries=(), *, paged=None) -> int:
        """Start-up: adopt stored entries, and a paged index ``(seqs, locs, exps, blens,
        ...)``: rebuilt from the timer index where it matches (``checkpoint``), the rest
        read back one message at a time (each is dropped again once its slot is rebuilt)."""
        n = 0
        for entry in entries:
            n += self.enqueue(entry.message, entry=entry)
        if paged is not None and len(paged[0]):
            # entries rebuilt from the index bypass ``enqueue``: the next stored seq must
            # still pass them (a reused seq makes the journal's replay drop the older entry)
            self._stored_seq = max(self._stored_seq, max(paged[0]) + 1)
            n += self.scheduler.restore_paged(self, paged[0], paged[1], paged[3])
        return n

    def sidecar_path(self, name: str) -> str | None:
        """A file beside this queue's store, for the scheduler's timer index."""
        return self.store.sidecar_path(name) if self.store is not None else None

    def read_back(self, seq: int, loc: int) -> bool:
        """Adopt one stored entry of the paged index by reading its message."""
        entry = QueueEntry(self.store.read_message(loc), seq)
        entry.loc = loc
        return self.enqueue(entry.message, entry=entry)

    # ---- the stored copies of the slots ----
    @property
    def reads_back(self) -> bool:
        """Whether the store can read a message back by location (the journal)."""
        return self.store is not None and READS_BACK in self.store.capabilities

    def keep(self, slot: int, entry: QueueEntry) -> bool:
        """Record where a freshly stored occurrence lives; True if the entry itself is
        kept in memory (a store that cannot read messages back)."""
        t = self.ready
        if entry.loc and self.reads_back:
            t.set_paged(slot, entry.seq, entry.loc, len(entry.message.body))
            return False
        t.set_held(slot, entry.seq, entry)
        return True

    def stored_entry(self, slot: int) -> QueueEntry | None:
        """The stored QueueEntry of a persistent slot (read from the journal), else None."""
        t = self.ready
        held = t.held[slot]
        if held is None:
            seq, loc = t.stored_at(slot)
            if not loc:
                return None
            e = QueueEntry(self.store.read_message(loc), seq)
            e.loc = loc
            return e
        if isinstance(held, bytes):
            return None
        return held

    def read_stored(self, slot: int):
        """The stored message of a journal-paged slot, or None."""
        _seq, loc = self.ready.stored_at(slot)
        if loc and self.store is not None:
            return self.store.read_message(loc)
        return None

    def remove_stored(self, slot: int) -> bool:
        """Forget the stored copy of a slot; True if it was an entry kept in memory."""
        t = self.ready
        held = t.held[slot]
        if held is None:
            seq, loc = t.stored_at(slot)
            if loc and self.store is not None:
                e = QueueEntry(None, seq)
                e.loc = loc
                self.store.remove(self, e)
            return False
        if isinstance(held, bytes):
            return False
        if self.store is not None:
            self.store.remove(self, held)
        return True

    def release_read_maps(self) -> None:
        # Reading pending messages back (at recovery, or as they fall due over hours) would
        # otherwise keep every journal segment's pages in the process's RSS.
        if self.reads_back:
            self.store.release_read_maps()
