"""x-max-priority: one FIFO per priority level, highest served first.

A message's priority is its ``priority`` property capped at the queue's
maximum (RabbitMQ caps rather than rejects); no property means 0.
"""
from __future__ import annotations

from .fifo import FifoReady


def message_priority(properties: dict, max_priority: int) -> int:
    p = properties.get("priority") or 0
    return p if p <= max_priority else max_priority


class PriorityReady:
    """A ``ready.ReadyStore`` with one FIFO per priority level."""

    __slots__ = ("_count", "_levels")

    def __init__(self, max_priority: int):
        self._levels: list = [FifoReady() for _ in range(max_priority + 1)]  # PagedPriority: PagedFifo
        self._count = 0

    accepts_paged_index = False  # see ready.ReadyStore
    stored_behind = 0

    def paged_index(self) -> None:
        return None

    def relocate_paged(self, segments, move) -> int:
        return 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self):
        for level in reversed(self._levels):
            yield from level

    def append(self, entry) -> None:
        self._levels[entry.priority].append(entry)
        self._count += 1

    def popleft(self):
        for level in reversed(self._levels):
            if len(level):
                self._count -= 1
                return level.popleft()
        raise IndexError("pop from an empty queue")

    def peek(self):
        for level in reversed(self._levels):
            if len(level):
                return level.peek()
        return None

    def requeue(self, entry) -> None:
        self._levels[entry.priority].requeue(entry)
        self._count += 1

    def clear(self) -> list:
        out = []
        for level in reversed(self._levels):
            out.extend(level.clear())
        self._count = 0
        return out

    def head_entries(self) -> list:
        return list(self)

    def pop_tail(self):
        for level in self._levels:
            if len(level):
                self._count -= 1
                return level.pop_tail()
        raise IndexError("pop from an empty queue")
