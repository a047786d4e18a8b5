"""What a queue's store reads of it and how a queue is rebuilt from stored records at
start-up (a paged index too); not the store itself (persistence/) nor live operations."""
from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from .entry import QueueEntry

if TYPE_CHECKING:
    from .ready import PagedIndex, PagingReadyStore, ReadyStore, Relocate
    from .ttl import ExpiryTimer

_NAN_BYTES = array("d", [math.nan]).tobytes()


def _some_expiry(exps: Sequence[float]) -> bool:
    """Whether recovered wall-clock expiries (NaN = none) hold one; a recovered index of
    millions of entries without TTL is told by one comparison of its bytes."""
    if isinstance(exps, array) and exps.typecode == "d":
        raw = memoryview(exps).cast("B")
        block = _NAN_BYTES * 8192
        step = len(block)
        # bytes, not memoryview slices: a memoryview compares item by item (0.2-0.6 s at
        # 10M entries), bytes with one memcmp
        if all(bytes(raw[i:i + step]) == block[:len(raw) - i] for i in range(0, len(raw), step)):
            return False
    return any(e == e for e in exps)


def _max_and_sum(seqs: Sequence[int], blens: Sequence[int]) -> tuple[int, int]:
    """The highest seq and the body bytes of a recovered index. A long one (arrays of the
    index's typecodes) is reduced by numpy, which the store loading it has imported: the
    builtins walk ten million items in ~0.3 s."""
    if len(seqs) > 100_000 and isinstance(seqs, array) and seqs.typecode == "q" \
            and isinstance(blens, array) and blens.typecode == "I":
        import numpy as np
        return (int(np.frombuffer(seqs, np.int64).max()),
                int(np.frombuffer(blens, np.uint32).sum(dtype=np.int64)))
    return max(seqs), sum(blens)


class Durability(Protocol):
    """``Queue.durability``: what publisher confirms wait for instead of the store."""

    def when_durable(self, callback: Callable[[], None],
                     on_failure: Callable[[], None] | None = None) -> None: ...


class StoredQueue:
    """Mixed into ``Queue``: what these methods use of it."""
    name: str
    ready: ReadyStore
    ready_bytes: int
    stats_published: int
    _next_seq: int
    _expiry: ExpiryTimer

    def enqueue(self, message: Any, *, entry: QueueEntry | None = None,
                reported: bool = False) -> bool:
        raise NotImplementedError

    # ---- stores: what is stored, and rebuilding from it ----
    def stored_entries(self) -> list[QueueEntry]:
        """The ready entries this queue holds in memory, in order (a paging ready
        store's paged part is ``paged_index()``). Entries out of the ready list --
        delivered and not settled, or waiting for a retry delay -- are the store's
        to track from the operation stream: from DELIVER to REQUEUE or a leave."""
        return self.ready.head_entries()

    def paged_index(self) -> PagedIndex | None:
        """The stored part of the ready store's paged index (``(seqs, locs, exps,
        blens, flags)`` arrays, see ``PagedFifo.paged_index``), or None."""
        return self.ready.paged_index()

    def relocate_paged(self, segments: Collection[int], move: Relocate) -> int:
        """Store compaction: see ``ReadyStore.relocate_paged``."""
        return self.ready.relocate_paged(segments, move)

    @property
    def restores_paged(self) -> bool:
        """True if ``restore(paged=...)`` accepts a paged index for this queue."""
        return self.ready.accepts_paged_index

    def restore(self, entries: Iterable[QueueEntry] = (),
                *, paged: tuple[Sequence[Any], ...] | None = None) -> int:
        """Rebuild the ready list from stored records at start-up; returns how many.

        ``entries``: QueueEntry objects in ``seq`` order (not announced to observers:
        they are stored already). ``paged``: ``(seqs, locs, exps, blens, flags)``
        arrays for a paging ready store (``restores_paged``): expiry in wall-clock
        seconds (NaN = none), flags = delivery count (0 = never). Raises TypeError if the
        ready store cannot take a paged index.
        """
        n = 0
        for entry in entries:
            self.enqueue(entry.message, entry=entry)
            n += 1
        if paged is not None and len(paged[0]):
            if not self.restores_paged:
                raise TypeError(f"queue {self.name!r}: its ready store cannot restore a paged index")
            seqs = paged[0]
            cast("PagingReadyStore", self.ready).restore_paged(*paged)
            top, nbytes = _max_and_sum(seqs, paged[3])
            self.ready_bytes += nbytes
            self._next_seq = max(self._next_seq, top + 1)
            self.stats_published += len(seqs)
            n += len(seqs)
            if _some_expiry(paged[2]):
                self._expiry.arm()
        return n

    def restore_behind(self, count: int, nbytes: int, top_seq: int, expiring: bool) -> None:
        """Start-up, a store reading the rest of this queue's index after the broker listens:
        count its ``count`` stored entries (``nbytes`` of bodies, seqs up to ``top_seq``,
        some with an expiry) now; the ready store holds them as ``stored_behind``."""
        self.ready_bytes += nbytes
        self._next_seq = max(self._next_seq, top_seq + 1)
        self.stats_published += count
        if expiring:
            self._expiry.arm()

    @property
    def next_seq(self) -> int:
        """The seq the next enqueued entry gets (seqs only grow)."""
        return self._next_seq
