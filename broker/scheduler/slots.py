"""Slot storage: the pending messages of one vhost in parallel arrays.

A slot is an index into the arrays of a ``SlotTable``: due time (wall clock),
kind, delay, id (prefix index + number) and, for the journal, seq, location and
body length -- plus, in the sparse ``held`` map, what a slot keeps in memory: a
``bytes`` blob for a transient message, the ``QueueEntry`` for a persistent one in
a store that cannot read messages back; nothing for a journal-paged one.
Repeating / cron schedules keep ``(Schedule, left, run)`` in the ``cx`` dict.

The table is also the ready store of its ``ScheduledQueue``: empty for the
dispatcher, and for the journal a ``PagedFifo`` whose whole content is paged
(checkpoints and segment compaction see the journal-paged slots).
"""
from __future__ import annotations

from array import array
from itertools import compress
from typing import TYPE_CHECKING, cast

from ..persistence.paged import PagedFifo
from .spec import Schedule

if TYPE_CHECKING:
    from .scheduled_queue import ScheduledQueue

# slot kinds
FREE, K_DELAY, K_AMQ, K_COMPLEX = 0, 1, 2, 3  # K_COMPLEX: repeat and/or cron (state in .cx)
# a slot's broker-wide address: vhost index << SLOT_BITS | slot
SLOT_BITS = 32
VH_BITS = 16
SLOT_MASK = (1 << SLOT_BITS) - 1
VH_MASK = (1 << VH_BITS) - 1
NAN = float("nan")
MAX_INTERNED = 100_000  # distinct complex schedules kept as shared objects


class _Const:
    """An 'array' whose every element is the same value (journal compaction reads it)."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __getitem__(self, i):
        return self.value


class Held(dict):
    """slot -> what a slot keeps in memory; a slot that is absent keeps nothing (its
    message is in the journal) and reads as None. Sparse on purpose: a list with one
    item per slot would be traversed by every full garbage collection, a pause that
    grows with the pending count and shows in the firing lateness."""
    __slots__ = ()

    def __missing__(self, slot: int) -> None:
        return None


class SlotTable(PagedFifo):
    """The pending messages of one vhost, and its internal queue's ``ready``.

    For the dispatcher it is empty (length 0, nothing to pop). For the journal it
    looks like a PagedFifo whose whole content is paged: the inherited seq/location/
    body-length arrays describe the journal-paged persistent slots (location 0 = free
    or not in the journal), so checkpoints and segment compaction handle them like
    any paged queue (compaction updates the locations in place)."""

    __slots__ = (
        "cx",
        "delay",
        "due",
        "free",
        "held",
        "kind",
        "live",
        "n_stored",
        "queue",
        "schedules",
        "sidn",
        "sidp",
        "vhost_name",
        "vi",
    )

    def __init__(self, vi: int, vhost_name: str, schedules: dict | None = None):
        super().__init__(None, None, budget=0)
        self.vi = vi
        self.vhost_name = vhost_name
        self.queue = cast("ScheduledQueue", None)  # set by the queue whose ready store this is
        self.schedules = {} if schedules is None else schedules  # interned complex schedules
        # constant columns: pending slots never expire and are never "delivered"
        self._exp = _Const(NAN)  # type: ignore[assignment]
        self._flags = _Const(0)  # type: ignore[assignment]
        self.due = array("d")     # wall-clock seconds
        self.kind = array("B")    # FREE / K_DELAY / K_AMQ / K_COMPLEX
        self.delay = array("q")   # ms
        self.sidp = array("H")    # id prefix index (ids.SidIndex)
        self.sidn = array("q")    # id number (-1: the prefix is the whole id)
        self.held = Held()        # slot -> bytes blob (transient) | QueueEntry; absent = journal
        self.cx: dict = {}        # slot -> (Schedule, left, run) for K_COMPLEX
        self.free = array("I")
        self.live = 0
        self.n_stored = 0         # slots with a journal location

    # ---- slots ----
    def alloc(self) -> int:
        """A free slot, counted live (its kind is set by ``set_state``)."""
        self.live += 1
        if self.free:
            return self.free.pop()
        slot = len(self.kind)
        self.due.append(0.0)
        self.kind.append(FREE)
        self.delay.append(0)
        self.sidp.append(0)
        self.sidn.append(0)
        self._seq.append(0)
        self._loc.append(0)
        self._blen.append(0)
        return slot

    def release(self, slot: int) -> None:
        self.kind[slot] = FREE
        self.held.pop(slot, None)
        if self._loc[slot]:
            self.n_stored -= 1
        self._loc[slot] = 0
        self._seq[slot] = 0
        self.cx.pop(slot, None)
        self.free.append(slot)
        self.live -= 1

    def live_slots(self) -> list[int]:
        kind = self.kind
        return [i for i in range(len(kind)) if kind[i]]

    def sid_pair(self, slot: int) -> tuple[int, int]:
        return self.sidp[slot], self.sidn[slot]

    def set_sid(self, slot: int, p: int, n: int) -> None:
        self.sidp[slot] = p
        self.sidn[slot] = n

    # ---- schedule state ----
    def state(self, slot: int) -> tuple[Schedule, int, float]:
        """(Schedule, left, run) of a slot."""
        k = self.kind[slot]
        if k == K_COMPLEX:
            return self.cx[slot]
        d = self.delay[slot]
        sched = Schedule("delay" if k == K_DELAY else "amq", delay=d)
        return sched, 1, self.due[slot] - d / 1000.0

    def set_state(self, slot: int, sched: Schedule, due: float, left: int, run: float) -> None:
        self.due[slot] = due
        self.delay[slot] = sched.delay
        if sched.cron or sched.repeat or sched.period:
            self.kind[slot] = K_COMPLEX
            interned = self.schedules.get(sched)  # one object per distinct complex schedule
            if interned is not None:
                sched = interned
            elif len(self.schedules) < MAX_INTERNED:
                self.schedules[sched] = sched
            self.cx[slot] = (sched, left, run)
        else:
            self.kind[slot] = K_DELAY if sched.kind == "delay" else K_AMQ
            self.cx.pop(slot, None)

    def delivered_as_delayed(self, slot: int) -> bool:
        """Whether the delivered copy carries ``x-delay`` = -delay (plugin behaviour)."""
        k = self.kind[slot]
        return k == K_DELAY or (k == K_COMPLEX and self.cx[slot][0].kind == "delay")

    def count_by_kind(self) -> tuple[int, int]:
        """(delay, amq) pending counts: C-level counts plus the complex ones."""
        n = self.kind.count(K_DELAY)
        a = self.kind.count(K_AMQ)
        for sched, _l, _r in self.cx.values():
            if sched.kind == "delay":
                n += 1
            else:
                a += 1
        return n, a

    # ---- where a persistent slot is stored ----
    def stored_at(self, slot: int) -> tuple[int, int]:
        """(seq, journal location) of a slot; location 0 = not in the journal."""
        return self._seq[slot], self._loc[slot]

    def seq_of(self, slot: int) -> int:
        return self._seq[slot]

    def set_paged(self, slot: int, seq: int, loc: int, blen: int) -> None:
        """The slot's message is in the journal at ``loc``: keep only the index."""
        if not self._loc[slot]:
            self.n_stored += 1
        self.held.pop(slot, None)
        self._seq[slot] = seq
        self._loc[slot] = loc
        self._blen[slot] = blen

    def set_held(self, slot: int, seq: int, held) -> None:
        """The slot keeps its stored entry (or blob) in memory."""
        if self._loc[slot]:
            self.n_stored -= 1
            self._loc[slot] = 0
        if held is None:
            self.held.pop(slot, None)
        else:
            self.held[slot] = held
        self._seq[slot] = seq

    def seq_column(self) -> array:
        return self._seq

    def loc_column(self) -> array:
        return self._loc

    def blen_column(self) -> array:
        return self._blen

    def load(self, seq: array, loc: array, blen: array, due: array, kind: array, delay: array,
             sidp: array, sidn: array) -> None:
        """Start-up: fill an empty table with journal-paged slots 0..n-1 in one go (the
        columns are taken over, not copied)."""
        if len(self.kind):
            raise ValueError("SlotTable.load: the table is in use")
        n = len(seq)
        if not all(len(c) == n for c in (loc, blen, due, kind, delay, sidp, sidn)):
            raise ValueError("SlotTable.load: columns of different lengths")
        self._seq, self._loc, self._blen = seq, loc, blen
        self.due, self.kind, self.delay, self.sidp, self.sidn = due, kind, delay, sidp, sidn
        self.held = Held()
        self.live = self.n_stored = n

    def set_complex(self, slot: int, sched: Schedule, left: int, run: float) -> None:
        """The repeat/cron state of a loaded K_COMPLEX slot."""
        self.set_state(slot, sched, self.due[slot], left, run)

    # ---- the queue's ready store, as the core sees it ----
    def __len__(self) -> int:
        return 0

    def __iter__(self):
        """Stored pending entries (tests, management); materialized from the journal."""
        q = self.queue
        for slot in self.live_slots():
            e = q.stored_entry(slot)
            if e is not None:
                yield e

    def append(self, entry) -> None:  # never reached: max-length 0 refuses publishes
        pass

    def requeue(self, entry) -> None:
        pass

    def popleft(self):
        raise IndexError("scheduled view")

    def peek(self):
        return None

    def clear(self) -> list:
        return []

    def pop_tail(self):
        raise IndexError("scheduled view")

    # ---- the journal's view (checkpoints, compaction) ----
    @property
    def paged_count(self) -> int:
        return self.n_stored

    def head_entries(self) -> list:
        return []

    def relocate_paged(self, segments, move) -> int:
        """Segment compaction (``PagedFifo.relocate_paged``); each moved slot's new
        location also goes to the timer index log, so a crash right after a compaction
        reads nothing back."""
        locs = self._loc
        seqs, blens = self._seq, self._blen
        log_slot = self.queue.scheduler.log_slot if self.queue is not None else None
        moved = 0
        for i in range(len(locs)):
            loc = locs[i]
            if loc and (loc >> 32) in segments:
                new = move(loc, seqs[i], None, blens[i], 0)
                moved += 1
                if new != loc:
                    locs[i] = new
                    if log_slot is not None:
                        log_slot(self, i)
        return moved

    def snapshot_paged(self):
        """(seqs, locs, exps, blens, flags) of the journal-paged slots, built in C-level
        loops (no per-entry Python list: a checkpoint of a million stays cheap)."""
        locs = self._loc
        n = self.n_stored
        if n == len(locs):
            seqs, locs2, blens = self._seq[:], locs[:], self._blen[:]
        else:
            mask = bytes(map(bool, locs))
            seqs = array("q", compress(self._seq, mask))
            locs2 = array("q", compress(locs, mask))
            blens = array("I", compress(self._blen, mask))
        return (seqs, locs2, array("d", [NAN]) * len(seqs), blens, array("B", bytes(len(seqs))))
