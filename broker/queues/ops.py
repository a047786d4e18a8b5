"""The operation stream of a queue: what happened to which entry, in order.

A :class:`~broker.queues.queue.Queue` is the one owner of its state. Whatever
changes it (a publish, a delivery, an ack, a TTL expiry, ...) is reported, in
the order it happened and synchronously on the event loop's thread, to the
queue's observers (``Queue.observers``): one ``queue_op(queue, op, entry)``
call per entry and operation. The stores (``broker.persistence``) are such
observers; nothing else may write a queue's state into a store.

Every entry that enters a queue (``ENQUEUE``) leaves it exactly once, by one
of ``SETTLE``, ``EXPIRE``, ``DEAD_LETTER``, ``PURGE`` or ``DELETE``. In between
it may be delivered (``DELIVER``, once per delivery) and returned to the ready
list (``REQUEUE``) any number of times. Entries a store gives back at start-up
(``Queue.restore``) are not announced again: they were stored already.

Cost: a queue without observers pays one truth test of an empty list per
operation; nothing is allocated.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol, Self, SupportsIndex, cast

if TYPE_CHECKING:
    from .entry import QueueEntry
    from .queue import Queue


class Op(enum.IntEnum):
    """One kind of state change of a queue entry."""

    ENQUEUE = 1      #: a new message entered the queue (it is ready)
    DELIVER = 2      #: handed to a consumer or basic.get; ``entry.delivery_count`` counts them
    REQUEUE = 3      #: back to the ready list (nack/reject with requeue, channel closed, retry due)
    SETTLE = 4       #: left for good: acked, no-ack delivery, rejected without requeue and dropped
    EXPIRE = 5       #: left: its TTL ran out (dead-lettered too if the queue has a DLX)
    DEAD_LETTER = 6  #: left: republished to the DLX (rejected, maxlen, delivery_limit)
    PURGE = 7        #: left: queue.purge
    DELETE = 8       #: left: the queue was deleted (ready entries, and unacked ones returned later)

    @property
    def leaves(self) -> bool:
        """True for the operations after which the entry is no longer in the queue."""
        return self >= Op.SETTLE


#: The operations that end an entry's life in the queue.
LEAVING = frozenset(op for op in Op if op.leaves)


class QueueObserver(Protocol):
    """Something that follows a queue's operation stream (a store, a test recorder).

    Register with ``queue.observers.append(observer)`` (``Queue.attach_store``
    does it for the queue's store). An observer derived from ``CallerReported`` is not
    called for what callers report (``ObserverList``).
    """

    def queue_op(self, queue: Queue, op: Op, entry: QueueEntry) -> None:
        """Note that ``op`` happened to ``entry`` of ``queue``.

        Called synchronously, in order, on the event loop's thread, right after
        the queue changed its own state. Returns nothing and must not block or
        await: a store only buffers here and writes in its own task. It must not
        raise; an exception propagates into the AMQP method that caused the
        operation (closing that channel) and the queue's state is already
        changed. The observer owns nothing of ``entry``: it may keep a reference
        until the entry leaves (``op.leaves``), and may write ``entry.loc``
        (its own location of the message), nothing else. It must not call back
        into the queue. For ``SETTLE``, ``EXPIRE`` and ``DEAD_LETTER`` emitted
        while the queue discards entries, ``queue.leave_reason`` says why
        ("rejected", "expired", "maxlen", "delivery_limit"); otherwise it is None
        (an ack, a no-ack delivery, a withdrawn publish).
        """
        ...


class ReportedObserver(QueueObserver, Protocol):
    """A ``CallerReported`` observer (the audit trail): callers tell it
    what the operation stream does not show (``ObserverList``)."""

    def retried(self, queue: Queue, entry: QueueEntry, delay_ms: int) -> None:
        """The retry policy holds ``entry`` back for ``delay_ms`` (0: requeued now)."""
        ...

    def stream_appended(self, queue: Queue, pairs: Iterable[tuple[int, int]]) -> None:
        """A stream queue appended records: (message id, offset) pairs."""
        ...

    def stream_truncated(self, queue: Queue, first: int, count: int, reason: str) -> None:
        """Records ``first`` .. ``first + count - 1`` left a stream queue (``reason``:
        retention, deleted)."""
        ...


#: The store capability (``persistence.base.Store.capabilities``) of a store that pages a
#: durable FIFO queue's messages: ``Queue.attach_store`` hands its entries to
#: ``store.paged_ready(queue, entries)``.
PAGES_MESSAGES = "pages_messages"


class CallerReported:
    """The base of an observer that its callers tell what they report (the audit trail):
    ``ObserverList`` keeps it in ``told``, out of ``unreported``."""

    __slots__ = ()


class ObserverList(list["QueueObserver"]):
    """``Queue.observers``: a list that also keeps ``unreported``, the observers without
    a ``CallerReported`` base, and ``told``, those with one.

    Such an observer (the audit trail) learns of the most frequent operations from their
    callers, which know more (the session, the consumer, the delivery tag): the queue does
    not call it for a ``DELIVER``, nor for an ``ENQUEUE`` or ``SETTLE`` whose caller says
    ``reported=True`` (a client's publish, a client's ack), and its callers tell it what
    the operation stream does not show: ``retried(queue, entry, delay_ms)``, an entry the
    retry policy holds back for ``delay_ms`` (0: requeued now). Every mutation of the list
    refreshes ``unreported`` and ``told``.
    """

    def __init__(self, *args: Iterable[QueueObserver]) -> None:
        super().__init__(*args)
        self.unreported: tuple[QueueObserver, ...] = ()
        self.told: tuple[ReportedObserver, ...] = ()
        self._sync()

    def _sync(self) -> None:
        self.unreported = tuple(o for o in self if not isinstance(o, CallerReported))
        self.told = tuple(cast("ReportedObserver", o) for o in self
                          if isinstance(o, CallerReported))

    def append(self, observer: QueueObserver) -> None:
        super().append(observer)
        self._sync()

    def insert(self, index: SupportsIndex, observer: QueueObserver) -> None:
        super().insert(index, observer)
        self._sync()

    def extend(self, observers: Iterable[QueueObserver]) -> None:
        super().extend(observers)
        self._sync()

    def remove(self, observer: QueueObserver) -> None:
        super().remove(observer)
        self._sync()

    def pop(self, index: SupportsIndex = -1) -> QueueObserver:
        observer = super().pop(index)
        self._sync()
        return observer

    def clear(self) -> None:
        super().clear()
        self._sync()

    # typeshed's list.__add__ overloads take any list[_S]; an in-place add keeps the item type
    def __iadd__(self, observers: Iterable[QueueObserver]) -> Self:  # type: ignore[override,misc]
        super().__iadd__(observers)
        self._sync()
        return self

    def __setitem__(self, index: SupportsIndex | slice, value: Any) -> None:
        super().__setitem__(index, value)
        self._sync()

    def __delitem__(self, index: SupportsIndex | slice) -> None:
        super().__delitem__(index)
        self._sync()


class OpRecorder:
    """An observer that keeps ``(op, seq)`` pairs: for tests and debugging."""

    def __init__(self) -> None:
        self.ops: list[tuple[Op, int]] = []

    def queue_op(self, queue: Queue, op: Op, entry: QueueEntry) -> None:
        self.ops.append((op, entry.seq))
