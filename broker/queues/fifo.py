"""The ready-message store of a plain queue: FIFO, requeues keep their place.

Implements ``ready.ReadyStore``.
"""
from __future__ import annotations

from bisect import insort
from collections import deque
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .entry import QueueEntry
    from .ready import Relocate


class FifoReady:
    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[QueueEntry] = deque()

    accepts_paged_index = False  # see ready.ReadyStore

    @property
    def stored_behind(self) -> int:
        return 0

    def paged_index(self) -> None:
        return None

    def relocate_paged(self, segments: Collection[int], move: Relocate) -> int:
        return 0

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[QueueEntry]:
        return iter(self._q)

    def append(self, entry: QueueEntry) -> None:
        self._q.append(entry)

    def popleft(self) -> QueueEntry:
        return self._q.popleft()

    def peek(self) -> QueueEntry | None:
        return self._q[0] if self._q else None

    def requeue(self, entry: QueueEntry) -> None:
        """Put a returned message back at its original position (RabbitMQ >= 2.7)."""
        q = self._q
        if not q or entry.seq < q[0].seq:
            q.appendleft(entry)
        elif entry.seq > q[-1].seq:
            q.append(entry)
        else:
            items = list(q)
            insort(items, entry, key=lambda e: e.seq)
            self._q = deque(items)

    def clear(self) -> list[QueueEntry]:
        items = list(self._q)
        self._q.clear()
        return items

    def pop_tail(self) -> QueueEntry:
        return self._q.pop()

    def head_entries(self) -> list[QueueEntry]:
        return list(self._q)
