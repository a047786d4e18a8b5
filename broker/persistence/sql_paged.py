"""Ready messages of a durable FIFO queue on the SQL store: a backlog left in the database.

Three parts, in delivery order: the head (in memory, up to ``window`` entries), the
index of entries whose messages are only in the database (seq, message id, expiry,
body length, delivery count: about 30 bytes each), and the tail (in memory, newer).

* At start-up the SQL store hands a queue the messages of its first ``window`` stored
  entries and the count of the rest (``restore_pending``), whose index it then reads in
  the background in bounded steps (``index_arrived``, ``index_done``): the broker serves
  meanwhile. Until the last step, entries published since stay in the tail, behind the
  part still loading. (``restore_paged`` takes a whole index at once.)
* While running, entries beyond a full head wait in the tail; once the store has
  committed them (``stored_up_to``), persistent ones move to the index and their
  messages leave memory. A transient message cannot be paged: it stays, and so does
  everything behind it.
* As the head drains below ``low``, the store's pager task reads the next page of the
  index in a worker thread (``SQLStore.want_page`` -> ``page_arrived``): the event loop
  never waits for the database; if the database is down the head runs dry, delivery
  waits, and the pager retries. With the index empty, the tail refills the head.

``len()`` -- what can be delivered now, as ``ready.ReadyStore`` defines it -- excludes
the index and whatever is behind it (``stored_behind``), which still count as ready for
message counts and max-length. Without a backlog (every queue in normal operation) it
is a ``FifoReady`` plus one length test per ``append`` and ``popleft``.
"""
from __future__ import annotations

import math
import time
from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..queues.entry import QueueEntry
from ..queues.fifo import FifoReady
from ..queues.retry import restore_delivery_count

NAN = float("nan")


class SQLPagedFifo(FifoReady):
    __slots__ = ("_asked", "_blens", "_exps", "_flags", "_gen", "_load_after", "_load_top",
                 "_mids", "_pending", "_pi", "_queue", "_seqs", "_store", "_tail", "low", "page",
                 "window")

    accepts_paged_index = True

    def __init__(self, store: Any, queue: Any, entries: Iterable[QueueEntry] = (), *, page: int = 2000,
                 window: int = 5000) -> None:
        super().__init__()
        self._q.extend(entries)
        self._store = store
        self._queue = queue
        self.window = max(window, page)  # entries in the head before newer ones may page out
        self.page = page                 # entries read per database round trip
        self.low = page                  # refill the head below this many
        self._tail: deque[QueueEntry] = deque()
        self._empty_index()
        # stored entries behind the index not read into it yet (seqs in (_load_after,
        # _load_top]): the store's background load appends them (index_arrived)
        self._pending = 0
        self._load_after = self._load_top = 0
        self._asked = False              # a page is being read (one at a time)
        self._gen = 0                    # bumped when the index is dropped (purge, delete)

    def _empty_index(self) -> None:
        self._seqs = array("q")
        self._mids = array("q")
        self._exps = array("d")
        self._blens = array("I")
        self._flags = array("B")
        self._pi = 0  # next index entry to read

    @property
    def unread(self) -> int:
        """Entries whose messages are in the database only (indexed or still loading)."""
        return len(self._seqs) - self._pi + self._pending

    @property
    def loading(self) -> int:
        """Stored entries whose index the store has not read yet."""
        return self._pending

    @property
    def generation(self) -> int:
        """Changes when the index is dropped (purge): a load in flight is then discarded."""
        return self._gen

    @property
    def stored_behind(self) -> int:
        unread = self.unread
        return unread + len(self._tail) if unread else 0

    # ---- ReadyStore ----
    # the hot path tests the index inline (no property call per append and popleft)
    def __len__(self) -> int:
        if self._pi < len(self._seqs) or self._pending:
            return len(self._q)
        return len(self._q) + len(self._tail)

    def __iter__(self) -> Iterator[QueueEntry]:
        """The entries in memory, in order; the index is not read back for this."""
        yield from self._q
        yield from self._tail

    def append(self, entry: QueueEntry) -> None:
        if self._tail or len(self._q) >= self.window or self._pi < len(self._seqs) \
                or self._pending:
            self._tail.append(entry)
        else:
            self._q.append(entry)

    def popleft(self) -> QueueEntry:
        q = self._q
        if not q and self._tail and self._pi >= len(self._seqs) and not self._pending:
            self._refill()
        entry = q.popleft()
        if len(q) < self.low and (self._tail or self._pi < len(self._seqs) or self._pending):
            self._more()
        return entry

    def peek(self) -> QueueEntry | None:
        if self._q:
            return self._q[0]
        if self._tail and not self.unread:
            return self._tail[0]
        return None

    def clear(self) -> list[QueueEntry]:
        """Every entry in memory; the index is removed from the database
        (``SQLStore.forget_unread``)."""
        items = list(self._q)
        items.extend(self._tail)
        self._q.clear()
        self._tail.clear()
        if self._pi < len(self._seqs):
            self._store.forget_unread(self._queue, self._seqs[self._pi:], self._mids[self._pi:])
        if self._pending:
            self._store.forget_range(self._queue, self._load_after, self._load_top)
            self._pending = 0
        self._empty_index()
        self._gen += 1
        self._asked = False
        return items

    def pop_tail(self) -> QueueEntry:
        if self._tail:
            return self._tail.pop()
        if self.unread:
            raise IndexError("the end of the queue is in the database")
        return self._q.pop()

    def head_entries(self) -> list[QueueEntry]:
        return list(self)

    def paged_index(self) -> None:
        return None

    def restore_paged(self, seqs: Iterable[int], mids: Iterable[int], exps: Iterable[float],
                      blens: Iterable[int], flags: Iterable[int]) -> None:
        """Start-up: the entries behind those already in memory (sorted by seq); their
        messages are read in pages as the head drains."""
        if self.unread or self._tail:
            raise ValueError("SQLPagedFifo.restore_paged: a backlog is already indexed")
        self._seqs, self._mids, self._exps = array("q", seqs), array("q", mids), array("d", exps)
        self._blens, self._flags = array("I", blens), array("B", flags)
        self._pi = 0
        if len(self._q) < self.low:
            self._more()

    def restore_pending(self, count: int, after_seq: int, top_seq: int) -> None:
        """Start-up: ``count`` stored entries with seqs in ``(after_seq, top_seq]`` follow
        those in memory; the store reads their index later (``index_arrived``)."""
        if self.unread or self._tail:
            raise ValueError("SQLPagedFifo.restore_pending: a backlog is already indexed")
        self._pending = count
        self._load_after, self._load_top = after_seq, top_seq

    def index_arrived(self, gen: int, seqs: Sequence[int], mids: Iterable[int],
                      exps: Iterable[float], blens: Iterable[int], flags: Iterable[int]) -> bool:
        """The next part of the index the store is loading (seq order, after the last
        part); False if the index was dropped since (``gen``: a purge): the load stops."""
        if gen != self._gen or not self._pending:
            return False
        if len(seqs):
            self._seqs.extend(seqs)
            self._mids.extend(mids)
            self._exps.extend(exps)
            self._blens.extend(blens)
            self._flags.extend(flags)
            self._pending = max(0, self._pending - len(seqs))
            self._load_after = seqs[-1]
        if len(self._q) < self.low:
            self._more()
        return True

    def index_done(self, gen: int) -> None:
        """The load read its last part: what was published since follows the index."""
        if gen != self._gen:
            return
        self._pending = 0
        if len(self._q) < self.low:
            self._more()

    # ---- paging out (SQLStore, after a commit) ----
    def stored_up_to(self, seq: int) -> int:
        """The store committed this queue's entries up to ``seq``: with the head full,
        move the persistent ones at the front of the tail to the index (their messages
        leave memory). Returns how many moved. Not while the index loads: the tail must
        stay behind what is still to be read."""
        tail = self._tail
        if len(self._q) < self.window or not tail or self._pending:
            return 0
        wall_minus_mono = time.time() - self._queue.vhost.timers.now()
        moved = 0
        while tail and tail[0].seq <= seq and tail[0].message.persistent:
            entry = tail.popleft()
            exp = entry.expires_at
            self._seqs.append(entry.seq)
            self._mids.append(entry.message.id)
            self._exps.append(NAN if exp is None else exp + wall_minus_mono)
            self._blens.append(len(entry.message.body))
            self._flags.append(min(entry.delivery_count, 255))
            moved += 1
        return moved

    # ---- reading back (SQLStore's pager) ----
    def _refill(self) -> None:
        """The index is empty: the tail moves up into the head."""
        q, tail = self._q, self._tail
        while tail and len(q) < self.window:
            q.append(tail.popleft())

    def _more(self) -> None:
        if self._pi < len(self._seqs):
            if not self._asked:
                self._asked = True
                self._store.want_page(self)
        elif not self._pending:  # (while it loads, the load's next part calls this again)
            self._refill()

    def next_page(self) -> tuple[int, Any, array[int], array[int]]:
        """``(generation, queue, seqs, message ids)`` of the next page to read."""
        end = min(len(self._seqs), self._pi + self.page)
        return self._gen, self._queue, self._seqs[self._pi:end], self._mids[self._pi:end]

    def page_arrived(self, gen: int, messages: dict[int, Any], wall_minus_mono: float) -> int:
        """The pager read the messages (id -> Message) of the page ``next_page`` gave for
        generation ``gen``: move those entries to the head. Returns how many; 0 if the
        index changed meanwhile (a purge). Entries whose message is gone are skipped."""
        self._asked = False
        if gen != self._gen or self._pi >= len(self._seqs):
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
        if self._pi >= len(self._seqs):
            self._empty_index()  # what was behind it is deliverable again
        elif self._pi > 100_000 and self._pi * 2 > len(self._seqs):
            self._compact()
        if len(self._q) < self.low:
            self._more()
        return moved

    def _compact(self) -> None:
        """Drop the read prefix of the index arrays (a backlog that keeps flowing)."""
        pi = self._pi
        for column in (self._seqs, self._mids, self._exps, self._blens, self._flags):
            del column[:pi]
        self._pi = 0
