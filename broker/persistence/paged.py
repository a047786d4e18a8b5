"""Ready messages of a durable queue that may live on disk (memory budget).

``PagedFifo`` replaces ``FifoReady`` in a durable FIFO queue once persistent
messages arrive. Up to ``budget`` bytes of entries stay in memory (``_head``);
beyond that, new persistent entries are kept only as a compact index in
parallel arrays (seq, journal location, wall-clock expiry, body length, flags:
about 33 bytes each) and the Message is read back from the journal when the
entry nears the head. Entries that cannot be paged (transient messages behind
paged ones) are pinned in a dict and keep their place.

It implements ``queues.ready.ReadyStore``, plus what a store needs of a paged
ready list: ``paged_index()`` (checkpoints), ``restore_paged(...)`` (recovery)
and ``relocate_paged(...)`` (segment compaction). Subclasses (the scheduler's
slot table) keep the index arrays ``_seq``/``_loc``/``_exp``/``_blen``/``_flags``
and the read position ``_pi`` (protected: for subclasses only) and must set
``accepts_paged_index = True`` themselves to be rebuilt by ``restore_paged``.
"""
from __future__ import annotations

import math
import time
from array import array
from bisect import bisect_right, insort
from collections import deque
from itertools import islice

from ..config import JournalSettings
from ..queues.entry import QueueEntry
from ..queues.priority import PriorityReady
from .journal_format import count_flags

DEFAULT_BUDGET = JournalSettings().queue_memory_budget
ENTRY_OVERHEAD = 700  # rough bytes per in-memory entry besides the body
PAGE_IN = 512
NAN = float("nan")


def _seq_of(entry: QueueEntry) -> int:
    return entry.seq


class PagedFifo:
    __slots__ = (
        "_blen",
        "_exp",
        "_flags",
        "_head",
        "_head_bytes",
        "_loc",
        "_pi",
        "_pinned",
        "_seq",
        "_store",
        "_timers",
        "budget",
        "level",
        "restored",
    )

    #: ``restore_paged`` rebuilds it from a store's index (``ReadyStore``). Not inherited:
    #: a subclass opts in by setting it again.
    accepts_paged_index = True
    stored_behind = 0  # everything paged is read back on demand (ReadyStore)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "accepts_paged_index" not in cls.__dict__:
            cls.accepts_paged_index = False

    def __init__(self, store, timers, budget: int = DEFAULT_BUDGET, entries=(), *,
                 level: int = 0, restored=None):
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
        self.level = level  # the priority of the entries it reads back (PagedPriority)
        # called with an entry read back that had been delivered before (flags > 0),
        # after its delivery count is set: the retry policy's ``restored``
        self.restored = restored
        for e in entries:
            self.append(e)

    # ---- sizes ----
    def __len__(self) -> int:
        return len(self._head) + len(self._seq) - self._pi

    @property
    def paged_count(self) -> int:
        return len(self._seq) - self._pi

    @property
    def pinned_count(self) -> int:
        """Entries in the paged part that are held in memory (not stored)."""
        return len(self._pinned)

    def __iter__(self):
        yield from list(self._head)
        for i in range(self._pi, len(self._seq)):
            if self._loc[i] == 0:  # held in memory: looking at it must leave it there
                yield self._pinned[self._seq[i]]
            else:
                yield self._materialize(i, time.time() - self._timers.now())

    # ---- writing ----
    def append(self, entry: QueueEntry) -> None:
        if len(self._seq) > self._pi or (self._head_bytes >= self.budget and entry.loc):
            self._page_out(entry)
        else:
            self._head.append(entry)
            self._head_bytes += len(entry.message.body) + ENTRY_OVERHEAD

    def _page_out(self, entry: QueueEntry) -> None:
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
        self._flags.append(count_flags(entry.delivery_count, entry.redelivered))

    def add_paged(self, seq: int, loc: int, exp_wall, blen: int, flags: int) -> None:
        """Recovery: append an index-only entry (expiry in wall-clock time or NaN)."""
        self._seq.append(seq)
        self._loc.append(loc)
        self._exp.append(NAN if exp_wall is None else exp_wall)
        self._blen.append(blen)
        self._flags.append(flags)

    def restore_paged(self, seqs, locs, exps, blens, flags) -> None:
        """Recovery: append index-only entries (arrays; expiry wall-clock or NaN)."""
        if not self._seq and all(type(a) is array for a in (seqs, locs, exps, blens, flags)):
            # nothing paged yet: take the recovered arrays as they are (no copy of a
            # ten-million-entry index); copied if some are not of the index's typecodes
            taken = [a if a.typecode == code else array(code, a)
                     for a, code in zip((seqs, locs, exps, blens, flags), "qqdIB", strict=True)]
            self._seq, self._loc, self._exp, self._blen, self._flags = taken
            return
        self.extend_paged(seqs, locs, exps, blens, flags)

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
                           None if math.isnan(exp) else exp - wall_minus_mono, self.level)
        entry.loc = loc
        flags = self._flags[i]
        if flags:
            entry.redelivered = True
            entry.delivery_count = flags
            if self.restored is not None:
                self.restored(entry)
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

    def requeue(self, entry: QueueEntry) -> None:
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

    # ---- replication: a queue's copy sent in bounded steps ----
    def seq_counts(self) -> tuple[list[int], dict[int, int]]:
        """Every seq held, in order, and the delivery count of those that have one, read
        from the index (no message is read back)."""
        seqs = [e.seq for e in self._head]
        counts = {e.seq: e.delivery_count for e in self._head if e.delivery_count}
        s = self._pi
        paged = self._seq[s:]
        seqs.extend(paged)
        flags = self._flags
        for i in range(s, len(flags)):
            if flags[i]:
                seq = self._seq[i]
                pinned = self._pinned.get(seq) if self._loc[i] == 0 else None
                n = pinned.delivery_count if pinned is not None else flags[i]
                if n:
                    counts[seq] = n
        return seqs, counts

    def entries_after(self, seq: int, limit: int) -> list:
        """Up to ``limit`` entries with a seq above ``seq``, in order, left in place (paged
        ones read back as copies): a replica's sync reads a large paged queue in steps
        instead of all at once."""
        head = self._head
        start = bisect_right(head, seq, key=_seq_of)  # in order, indexed in C
        out = list(islice(head, start, start + limit))
        if len(out) >= limit:
            return out
        i = bisect_right(self._seq, seq, self._pi)
        end = min(len(self._seq), i + limit - len(out))
        if i < end:
            delta = time.time() - self._timers.now()
            for j in range(i, end):
                if self._loc[j] == 0:
                    out.append(self._pinned[self._seq[j]])
                else:
                    out.append(self._materialize(j, delta))
        return out

    def paged_index(self):
        """``(seqs, locs, exps, blens, flags)`` of the stored paged entries (pinned,
        unstored ones left out), or None when nothing is paged."""
        if not self.paged_count:
            return None
        seqs, locs, exps, blens, flags = self.snapshot_paged()
        if self.pinned_count:
            keep = [i for i in range(len(locs)) if locs[i]]
            seqs = array("q", [seqs[i] for i in keep])
            locs = array("q", [locs[i] for i in keep])
            exps = array("d", [exps[i] for i in keep])
            blens = array("I", [blens[i] for i in keep])
            flags = array("B", [flags[i] for i in keep])
        return seqs, locs, exps, blens, flags

    def drain(self):
        """Remove and yield every entry in order, reading paged messages back one at a
        time (recovery hand-overs: nothing is materialized all at once). The store is
        empty afterwards, also if the caller stops early."""
        try:
            while self._head:
                e = self._head.popleft()
                self._head_bytes -= len(e.message.body) + ENTRY_OVERHEAD
                yield e
            delta = time.time() - self._timers.now() if self._timers is not None else 0.0
            while self._pi < len(self._seq):
                i = self._pi
                self._pi = i + 1
                yield self._materialize(i, delta)
        finally:
            self._head.clear()
            self._head_bytes = 0
            self._pinned.clear()
            self._reset()

    def relocate_paged(self, segments, move) -> int:
        """Compaction: for every paged entry stored in one of ``segments`` (a set of
        segment numbers, ``loc >> 32``), call ``move(loc, seq, exp_wall, blen, flags)``
        (``exp_wall`` None = no expiry) and keep the location it returns. Returns how
        many moved."""
        locs = self._loc
        moved = 0
        for i in range(self._pi, len(locs)):
            loc = locs[i]
            if loc and (loc >> 32) in segments:
                exp = self._exp[i]
                locs[i] = move(loc, self._seq[i], None if exp != exp else exp, self._blen[i],
                               self._flags[i])
                moved += 1
        return moved


class PagedPriority(PriorityReady):
    """``PriorityReady`` of a durable x-max-priority queue: one ``PagedFifo`` per level.

    Each level pages on its own (``budget`` is shared out evenly), so the highest
    level is always served first, whatever is on disk. ``paged_index()`` is the
    levels' indexes, highest first; ``paged_levels()`` adds the parallel priority
    column a store keeps to rebuild it with ``restore_paged(..., prios)``.
    """

    __slots__ = ()
    accepts_paged_index = True

    def __init__(self, store, timers, max_priority: int, budget: int = DEFAULT_BUDGET,
                 entries=(), restored=None, weighted: bool = False):
        per_level = budget // (max_priority + 1)
        self._levels = [PagedFifo(store, timers, per_level, level=p, restored=restored)
                        for p in range(max_priority + 1)]
        self._count = 0
        self._weighted = weighted and max_priority == 1
        self._counter = 0
        for e in entries:
            self.append(e)

    def head_entries(self) -> list:
        out: list = []
        for level in reversed(self._levels):
            out.extend(level.head_entries())
        return out

    def paged_levels(self) -> tuple[array[int], ...] | None:
        """``(seqs, locs, exps, blens, flags, prios)`` of the stored paged entries, or None."""
        cols: tuple[array, ...] = (array("q"), array("q"), array("d"), array("I"), array("B"),
                                   array("B"))
        for level in reversed(self._levels):
            part = level.paged_index()
            if part is None:
                continue
            for c, a in zip(cols, part, strict=False):
                c.extend(a)
            cols[5].frombytes(bytes((level.level,)) * len(part[0]))
        return cols if len(cols[0]) else None

    def paged_index(self):
        cols = self.paged_levels()
        return None if cols is None else cols[:5]

    def restore_paged(self, seqs, locs, exps, blens, flags, prios=None) -> None:
        """Recovery: ``prios`` (required) is each entry's level; entries in seq order,
        or grouped by level from the lowest, in seq order within each (faster)."""
        if prios is None:
            raise TypeError("a paged priority queue needs the priorities of its index")
        top = len(self._levels) - 1
        if prios and max(prios) > top:
            prios = array("B", [min(p, top) for p in prios])
        raw = bytes(prios)
        counts = [raw.count(level.level) for level in self._levels]
        cols: tuple = (seqs, locs, exps, blens, flags)
        if raw != b"".join(bytes((p,)) * n for p, n in enumerate(counts)):
            # not grouped by level yet: a stable sort by level keeps seq order within
            # each level (C loops: a million entries take a fraction of a second)
            order = sorted(range(len(raw)), key=raw.__getitem__)
            cols = tuple(array(a.typecode, map(a.__getitem__, order)) for a in map(
                array, "qqdIB", cols))
        start = 0
        for level, n in zip(self._levels, counts, strict=True):
            if n:
                level.extend_paged(*(c[start:start + n] for c in cols))
            start += n
        self._count += len(seqs)

    def relocate_paged(self, segments, move) -> int:
        return sum(level.relocate_paged(segments, move) for level in self._levels)
