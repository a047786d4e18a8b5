"""``InternalQueue``: a broker-owned durable queue variant with a ready store of its own.

The designed seam for features that keep messages the broker holds back (the scheduler's
pending messages, prepared half messages), as LavinMQ's delayed-exchange queue is a queue
subclass with its own store. Every store backend persists it as an ordinary durable queue
(definition, stored entries, checkpoints), so such a feature survives restarts and
``kill -9`` without store code of its own. But:

* clients cannot see it (``internal``: 404 to every operation, never routed to by name);
  it is owned by the broker (``SYSTEM_OWNER``), and x-max-length 0 with reject-publish
  refuses anything that would reach it;
* the feature writes and forgets its stored entries itself (``write``, ``forget``);
* at start-up the store hands the entries back as to any queue (``enqueue(message,
  entry=e)``), and each one is given to the feature (``adopt``) instead of being queued.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .args import parse_queue_arguments
from .entry import QueueEntry
from .queue import Queue

if TYPE_CHECKING:
    from ..message import Message
    from ..vhost import VirtualHost


class _SystemOwner:
    """Exclusive owner of the internal queues: never a client session."""

    def __repr__(self) -> str:
        return "<triomq broker>"


SYSTEM_OWNER = _SystemOwner()


class InternalQueue(Queue):
    """Subclasses set what ``_new_ready`` returns and implement ``adopt``."""

    store: Any  # the vhost's persistent store (or None): written by this queue itself
    internal = True

    def __init__(self, vhost: VirtualHost, name: str) -> None:
        opts = parse_queue_arguments({})
        opts.max_length = 0
        opts.overflow = "reject-publish"
        super().__init__(vhost, name, durable=True, exclusive_owner=SYSTEM_OWNER,
                         arguments={}, opts=opts)
        self._stored_seq = 1  # seq of the next stored entry

    @property
    def keeps_definition(self) -> bool:
        return True  # durable although owned by the broker: the vhost stores it

    def attach_store(self, store: Any) -> None:
        """Persist through ``store``; the own ready store stays (a paging store does not
        replace it) and writes are this queue's own (``write``/``forget``)."""
        self.store = store

    def enqueue(self, message: Message, *, entry: QueueEntry | None = None,
                reported: bool = False) -> bool:
        """A publish routed here is refused (x-max-length 0, reject-publish); a stored
        entry handed back by recovery is adopted by the feature."""
        if entry is None:
            return super().enqueue(message, reported=reported)
        if entry.seq >= self._stored_seq:
            self._stored_seq = entry.seq + 1
        return self.adopt(entry)

    def adopt(self, entry: QueueEntry) -> bool:
        """Take a stored entry back at start-up; True if it is kept."""
        raise NotImplementedError

    def write(self, message: Message) -> QueueEntry:
        """Store one message (persistent, durable store)."""
        seq = self._stored_seq
        self._stored_seq = seq + 1
        entry = QueueEntry(message, seq)
        self.store.enqueue(self, entry)
        return entry

    def forget(self, entry: QueueEntry) -> None:
        """Remove a stored entry."""
        if self.store is not None:
            self.store.remove(self, entry)
