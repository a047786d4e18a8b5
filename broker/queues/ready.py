"""The interface of a queue's ready-message store (``Queue.ready``).

Implementations: ``fifo.FifoReady`` (plain queues), ``priority.PriorityReady``
(x-max-priority), ``retry.RetryReady`` (wraps another one for x-retry-ordered),
``persistence.paged.PagedFifo`` (durable FIFO queues whose store pages messages
out of memory), ``persistence.paged.PagedPriority`` (durable priority queues: one
``PagedFifo`` per level) and the scheduler's slot table. A queue builds its own in
``Queue._new_ready()``; nothing else assigns ``Queue.ready``.

A ready store only orders entries. It does not count bytes (the queue keeps
``ready_bytes``), arm timers or talk to stores; all of them run on the event
loop's thread and never block, except that a paged store may read a message
back from its store's files when it pages entries in.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .entry import QueueEntry

#: A store's paged index: ``(seqs, locs, exps, blens, flags)`` columns (arrays).
PagedIndex = tuple[Sequence[int], Sequence[int], Sequence[float], Sequence[int], Sequence[int]]
#: ``relocate_paged``'s ``move(loc, seq, exp_wall, blen, flags)``: the entry's new location.
Relocate = Callable[[int, int, "float | None", int, int], int]


class ReadyStore(Protocol):
    #: True if ``restore_paged(seqs, locs, exps, blens, flags)`` rebuilds it from a
    #: store's paged index (``PagedFifo``; ``PagedPriority`` also takes a sixth
    #: array, each entry's priority, which its store gets from ``paged_levels()``).
    accepts_paged_index: bool

    #: Ready entries not deliverable yet because their messages are still being read
    #: from the store (``persistence.sql_paged``); counted in message counts and
    #: max-length, not in ``len``. 0 for every other ready store.
    @property
    def stored_behind(self) -> int: ...

    def __len__(self) -> int:
        """How many entries may be delivered now (a blocked ordered retry store says 0)."""
        ...

    def __iter__(self) -> Iterator[QueueEntry]:
        """Every entry in delivery order (paged ones are read back: slow, for tools and tests)."""
        ...

    def append(self, entry: QueueEntry) -> None:
        """Add ``entry`` at the tail (of its priority level). Takes ownership of it."""
        ...

    def popleft(self) -> QueueEntry:
        """Remove and return the next entry to deliver; raises IndexError when empty."""
        ...

    def peek(self) -> QueueEntry | None:
        """The next entry to deliver without removing it, or None when empty."""
        ...

    def requeue(self, entry: QueueEntry) -> None:
        """Put a returned entry back at its original position (by ``entry.seq``)."""
        ...

    def clear(self) -> list[QueueEntry]:
        """Remove and return every entry, in delivery order; the caller owns them."""
        ...

    def pop_tail(self) -> QueueEntry:
        """Remove and return the last entry; raises IndexError when empty."""
        ...

    def head_entries(self) -> list[QueueEntry]:
        """The entries held in memory, in order (all of them, unless the store pages)."""
        ...

    def paged_index(self) -> PagedIndex | None:
        """The stored entries kept only as an index (not in memory): ``(seqs, locs,
        exps, blens, flags)`` arrays (expiry in wall-clock seconds, NaN = none;
        flags = delivery count so far, saturated at 255, 0 = never delivered), or
        None for a store that does not page."""
        ...

    def relocate_paged(self, segments: Collection[int], move: Relocate) -> int:
        """Compaction: give every paged entry stored in ``segments`` the location
        ``move(loc, seq, exp_wall, blen, flags)`` returns; returns how many moved
        (0 for a store that does not page)."""
        ...


class PagingReadyStore(ReadyStore, Protocol):
    """A ready store whose ``accepts_paged_index`` is True."""

    def restore_paged(self, *columns: Sequence[Any]) -> None:
        """Rebuild it from a store's paged index (``PagedIndex``'s columns, and each
        entry's priority for ``PagedPriority``)."""
        ...
