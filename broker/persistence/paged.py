"""Ready messages of a durable queue that may live on disk (memory budget).

``PagedFifo`` replaces ``FifoReady`` in a durable FIFO queue once persistent
messages arrive. Up to ``budget`` bytes of entries stay in memory (``_head``);
beyond that, new persistent entries are kept only as a compact index in
parallel arrays (seq, journal location, wall-clock expiry, body length, flags:
about 33 bytes each) and the Message is read back from the journal when the
entry nears the head. Entries that cannot be paged (transient messages behind
paged ones) are pinned in a dict and keep their place.
"""
from __future__ import annotations

import math
import os
import time
from array import array
from bisect import insort
from collections import deque

from ..queues.entry import QueueEntry

DEFAULT_BUDGET = int(os.environ.get("TRIOMQ_QUEUE_MEMORY_BUDGET", 32 * 1024 * 1024))
ENTRY_OVERHEAD = 700  # rough bytes per in-memory entry besides the body
PAGE_IN = 512
NAN = float("nan")


class PagedFifo:
    __slots__ = ("_head", "_head_bytes", "_seq", "_loc", "_exp", "_blen", "_flags", "_pi",
                 "_pinned", "_store", "_timers", "budget")

    def __init__(self, store, timers, budget: int = DEFAULT_BUDGET, entries=()):
        self._head: deque = deque()
        self._head_bytes = 0
        self._seq = array("q")
        self._loc = array("q")
        self._exp = array("d")
        self._blen = array("I")
        self._flags = array("B")
        self._pi = 0
        self._pinned: dict = {}
        self._store = store
        self._timers = timers
        self.budget = budget
        for e in entries:
            self.append(e)

    # ---- sizes ----
    def __len__(self) -> int:
        return len(self._head) + len(self._seq) - self._pi

    @property
    def paged_count(self) -> int:
        return len(self._seq) - self._pi

    def __iter__(self):
        yield from list(self._head)
        for i in range(self._pi, len(self._seq)):
            yield self._materialize(i, time.time() - self._timers.now())

    # ---- writing ----
    def append(self, entry) -> None:
        if len(self._seq) > self._pi:
            self._page_out(entry)
        elif self._head_bytes >= self.budget and entry.loc:
            self._page_out(entry)
        else:
            self._head.append(entry)
            self._head_bytes += len(entry.message.body) + ENTRY_OVERHEAD

    def _page_out(self, entry) -> None:
        if entry.loc:
            self._loc.append(entry.loc)
            self._blen.append(len(entry.message.body))
        else:
            self._pinned[entry.seq] = entry
            self._loc.append(0)
            self._blen.append(0)
        self._seq.append(entry.seq)
        exp = entry.expires_at
        self._exp.append(NAN if exp is None else exp + (time.time() - self._timers.now()))
        self._flags.append(1 if (entry.redelivered or entry.delivery_count) else 0)

    def add_paged(self, seq: int, loc: int, exp_wall, blen: int, flags: int) -> None:
        """Recovery: append an index-only entry (expiry in wall-clock time or NaN)."""
        self._seq.append(seq)
        self._loc.append(loc)
        self._exp.append(NAN if exp_wall is None else exp_wall)
        self._blen.append(blen)
        self._flags.append(flags)

    def extend_paged(self, seqs, locs, exps, blens, flags) -> None:
        self._seq.extend(seqs)
        self._loc.extend(locs)
        self._exp.extend(exps)
        self._blen.extend(blens)
        self._flags.extend(flags)

    # ---- reading ----
    def _materialize(self, i: int, wall_minus_mono: float):
        loc = self._loc[i]
        seq = self._seq[i]
        if loc == 0:
            return self._pinned.pop(seq)
        exp = self._exp[i]
        entry = QueueEntry(self._store.read_message(loc), seq,
                           None if math.isnan(exp) else exp - wall_minus_mono, 0)
        entry.loc = loc
        if self._flags[i]:
            entry.redelivered = True
        return entry

    def _page_in(self, n: int = PAGE_IN) -> None:
        start = self._pi
        end = min(start + n, len(self._seq))
        if start >= end:
            return
        delta = time.time() - self._timers.now()
        head = self._head
        hb = 0
        for i in range(start, end):
            e = self._materialize(i, delta)
            head.append(e)
            hb += len(e.message.body) + ENTRY_OVERHEAD
        self._head_bytes += hb
        self._pi = end
        if end == len(self._seq):
            self._reset()
        elif end > 65536 and end * 2 > len(self._seq):
            for a in (self._seq, self._loc, self._exp, self._blen, self._flags):
                del a[:end]
            self._pi = 0

    def _reset(self) -> None:
        self._seq = array("q")
        self._loc = array("q")
        self._exp = array("d")
        self._blen = array("I")
        self._flags = array("B")
        self._pi = 0

    def popleft(self):
        head = self._head
        if not head:
            self._page_in()
            if not head:
                raise IndexError("pop from an empty queue")
        e = head.popleft()
        self._head_bytes -= len(e.message.body) + ENTRY_OVERHEAD
        return e

    def peek(self):
        if not self._head:
            self._page_in()
        return self._head[0] if self._head else None

    def requeue(self, entry) -> None:
        """Put a returned message back at its original position (before any paged one)."""
        q = self._head
        self._head_bytes += len(entry.message.body) + ENTRY_OVERHEAD
        if not q or entry.seq < q[0].seq:
            q.appendleft(entry)
        elif entry.seq > q[-1].seq and not self.paged_count:
            q.append(entry)
        else:
            items = list(q)
            insort(items, entry, key=lambda e: e.seq)
            self._head = deque(items)

    def clear(self) -> list:
        while self.paged_count:
            self._page_in(65536)
        items = list(self._head)
        self._head.clear()
        self._head_bytes = 0
        self._pinned.clear()
        return items

    def pop_tail(self):
        if self.paged_count:
            i = len(self._seq) - 1
            e = self._materialize(i, time.time() - self._timers.now())
            for a in (self._seq, self._loc, self._exp, self._blen, self._flags):
                del a[i]
            return e
        e = self._head.pop()
        self._head_bytes -= len(e.message.body) + ENTRY_OVERHEAD
        return e

    # ---- checkpoints ----
    def snapshot_paged(self):
        """(seqs, locs, exps, blens, flags) arrays of the paged part (persistent only)."""
        s = self._pi
        return (self._seq[s:], self._loc[s:], self._exp[s:], self._blen[s:], self._flags[s:])

    def head_entries(self) -> list:
        return list(self._head)
