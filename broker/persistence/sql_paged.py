"""Ready messages of a durable FIFO queue on the SQL store: a backlog left in the database.

At start-up the SQL store hands a queue the index of its stored entries (seq, message
id, expiry, body length, delivery count: about 30 bytes each) together with the
messages of the first ``SQLSettings.page_window`` entries only; the rest stays in the
database. While consumers drain the head, the store's pager task reads the next page
ahead (``SQLStore.want_page``, in a worker thread: the event loop never waits for the
database) and hands it back through ``page_arrived``.

While part of the backlog is still in the database, ``len()`` -- what can be
delivered now, as ``ready.ReadyStore`` defines it -- is the head read so far; the rest
(``stored_behind``) still counts as ready for message counts and max-length. Messages
published meanwhile wait behind the backlog (``_tail``), so FIFO order holds. If the
database is down the head runs dry, delivery waits, and the pager retries.

Without a backlog (every queue in normal operation) it is a ``FifoReady``: the only
extra cost is one test per ``popleft``.
"""
from __future__ import annotations

import math
from array import array
from bisect import insort
from collections import deque
from typing import Any

from ..queues.entry import QueueEntry
from ..queues.fifo import FifoReady
from ..queues.retry import restore_delivery_count

NAN = float("nan")


class SQLPagedFifo(FifoReady):
    __slots__ = ("_asked", "_blens", "_exps", "_flags", "_gen", "_mids", "_pi", "_queue",
                 "_seqs", "_store", "_tail", "low", "page")

    accepts_paged_index = True

    def __init__(self, store: Any, queue: Any, entries=(), *, page: int = 2000):
        super().__init__()
        self._q.extend(entries)
        self._store = store
        self._queue = queue
        self.page = page              # entries read per database round trip
        self.low = page               # ask for the next page below this many in the head
        self._tail: deque = deque()   # published while a backlog is still in the database
        self._empty_index()
        self._asked = False           # a page is being read (one at a time)
        self._gen = 0                 # bumped when the index is dropped (purge, delete)

    def _empty_index(self) -> None:
        self._seqs = array("q")
        self._mids = array("q")
        self._exps = array("d")
        self._blens = array("I")
        self._flags = array("B")
        self._pi = 0  # next index entry to read

    @property
    def unread(self) -> int:
        """Entries whose messages are still in the database only."""
        return len(self._seqs) - self._pi

    @property
    def stored_behind(self) -> int:
        return self.unread + len(self._tail)

    # ---- ReadyStore ----
    def __iter__(self):
        """The entries in memory (head, then those published behind the backlog); the
        backlog still in the database is not read back for this."""
        yield from self._q
        yield from self._tail

    def append(self, entry) -> None:
        if self._pi < len(self._seqs):
            self._tail.append(entry)
        else:
            self._q.append(entry)

    def popleft(self):
        entry = self._q.popleft()
        if self._pi < len(self._seqs) and len(self._q) < self.low and not self._asked:
            self._ask()
        return entry

    def requeue(self, entry) -> None:
        if self._pi < len(self._seqs) and entry.seq > self._seqs[self._pi]:
            insort(self._tail, entry, key=lambda e: e.seq)  # pragma: no cover - never delivered
        else:
            super().requeue(entry)

    def clear(self) -> list:
        """Every entry in memory; the backlog still in the database is removed there
        (``SQLStore.forget_unread``)."""
        items = list(self._q)
        items.extend(self._tail)
        self._q.clear()
        self._tail.clear()
        if self.unread:
            self._store.forget_unread(self._queue, self._seqs[self._pi:], self._mids[self._pi:])
            self._empty_index()
            self._gen += 1
            self._asked = False
        return items

    def pop_tail(self):
        if self._tail:
            return self._tail.pop()
        if self.unread:
            raise IndexError("the tail of the queue is still in the database")
        return self._q.pop()

    def head_entries(self) -> list:
        return list(self)

    def paged_index(self) -> None:
        return None

    def restore_paged(self, seqs, mids, exps, blens, flags) -> None:
        """Start-up: the entries behind those already in memory (sorted by seq); their
        messages are read in pages as the head drains."""
        if self.unread or self._tail:
            raise ValueError("SQLPagedFifo.restore_paged: a backlog is already indexed")
        self._seqs, self._mids, self._exps = array("q", seqs), array("q", mids), array("d", exps)
        self._blens, self._flags = array("I", blens), array("B", flags)
        self._pi = 0
        if len(self._q) < self.low:
            self._ask()

    # ---- the pager (SQLStore) ----
    def _ask(self) -> None:
        self._asked = True
        self._store.want_page(self)

    def next_page(self) -> tuple[int, Any, array, array]:
        """``(generation, queue, seqs, message ids)`` of the next page to read."""
        end = min(len(self._seqs), self._pi + self.page)
        return self._gen, self._queue, self._seqs[self._pi:end], self._mids[self._pi:end]

    def page_arrived(self, gen: int, messages: dict, wall_minus_mono: float) -> int:
        """The pager read the messages (id -> Message) of the page ``next_page`` gave for
        generation ``gen``: move those entries to the head. Returns how many; 0 if the
        index changed meanwhile (a purge). Entries whose message is gone are skipped."""
        self._asked = False
        if gen != self._gen or not self.unread:
            return 0
        queue = self._queue
        start = self._pi
        end = min(len(self._seqs), start + self.page)
        moved = 0
        for i in range(start, end):
            message = messages.get(self._mids[i])
            if message is None:
                continue
            exp = self._exps[i]
            entry = QueueEntry(message, self._seqs[i],
                               None if math.isnan(exp) else exp - wall_minus_mono)
            if self._flags[i]:
                restore_delivery_count(queue, entry, self._flags[i])
            self._q.append(entry)
            moved += 1
        self._pi = end
        if self._pi >= len(self._seqs):  # the backlog is all in memory now
            self._empty_index()
            self._q.extend(self._tail)
            self._tail.clear()
        elif len(self._q) < self.low:
            self._ask()
        return moved
