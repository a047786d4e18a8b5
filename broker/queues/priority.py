"""Message priorities: one FIFO per priority level.

Classic queues (``x-max-priority``): a message's priority is its ``priority``
property capped at the queue's maximum (RabbitMQ caps rather than rejects); no
property means 0; the highest level is always served first.

Quorum queues (RabbitMQ 4): two levels, whatever the publisher sends -- priority 0-4
(or none) is normal, 5 and above high -- and the queue serves them as RabbitMQ's
``rabbit_fifo_q`` does: two high for one normal, so normal messages are never
starved; the third turn goes to a high message all the same when it is older than
the oldest normal one. Every store keeps an entry's level (``QueueEntry.priority``)
or recomputes it with ``message_priority``, so the levels survive a restart.
"""
from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any, cast

from .fifo import FifoReady

if TYPE_CHECKING:
    from .entry import QueueEntry
    from .ready import ReadyStore, Relocate

# rabbit_fifo_q: priorities above this are high on a quorum queue
QUORUM_HIGH_ABOVE = 4
# rabbit_fifo_q's ?WEIGHT: the dequeue counter runs 0..WEIGHT; at WEIGHT a normal
# message is due
WEIGHT = 2


def message_priority(properties: dict[str, Any], max_priority: int, two_level: bool = False) -> int:
    """The level a message goes to (``QueueEntry.priority``)."""
    p: int = properties.get("priority") or 0
    if two_level:
        return 1 if p > QUORUM_HIGH_ABOVE else 0
    return p if p <= max_priority else max_priority


class PriorityReady:
    """A ``ready.ReadyStore`` with one FIFO per priority level; ``weighted`` (two levels
    only): RabbitMQ's 2:1 high/normal rule instead of strictly highest first."""

    __slots__ = ("_count", "_counter", "_levels", "_weighted")

    def __init__(self, max_priority: int, weighted: bool = False) -> None:
        # Any: PagedPriority (persistence/) puts PagedFifo levels here and uses their own methods
        self._levels: list[Any] = [FifoReady() for _ in range(max_priority + 1)]  # PagedPriority: PagedFifo
        self._count = 0
        self._weighted = weighted and max_priority == 1
        self._counter = 0

    accepts_paged_index = False  # see ready.ReadyStore
    stored_behind = 0

    def paged_index(self) -> None:
        return None

    def relocate_paged(self, segments: Collection[int], move: Relocate) -> int:
        return 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[QueueEntry]:
        for level in reversed(self._levels):
            yield from level

    def append(self, entry: QueueEntry) -> None:
        self._levels[entry.priority].append(entry)
        self._count += 1

    def _next_level(self) -> ReadyStore | None:
        """The level the next delivery comes from (None: empty)."""
        normal: ReadyStore
        high: ReadyStore
        level: ReadyStore
        if self._weighted:
            normal, high = self._levels
            if not len(high):
                return normal if len(normal) else None
            if self._counter == WEIGHT and len(normal) \
                    and cast("QueueEntry", normal.peek()).seq < cast("QueueEntry", high.peek()).seq:
                return normal
            return high
        for level in reversed(self._levels):
            if len(level):
                return level
        return None

    def popleft(self) -> QueueEntry:
        level = self._next_level()
        if level is None:
            raise IndexError("pop from an empty queue")
        if self._weighted:
            self._counter = 0 if self._counter == WEIGHT else self._counter + 1
        self._count -= 1
        return level.popleft()

    def peek(self) -> QueueEntry | None:
        level = self._next_level()
        return None if level is None else level.peek()

    def requeue(self, entry: QueueEntry) -> None:
        self._levels[entry.priority].requeue(entry)
        self._count += 1

    def clear(self) -> list[QueueEntry]:
        out: list[QueueEntry] = []
        for level in reversed(self._levels):
            out.extend(level.clear())
        self._count = 0
        return out

    def head_entries(self) -> list[QueueEntry]:
        return list(self)

    def pop_tail(self) -> QueueEntry:
        level: ReadyStore
        for level in self._levels:
            if len(level):
                self._count -= 1
                return level.pop_tail()
        raise IndexError("pop from an empty queue")
