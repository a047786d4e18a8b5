"""Timer engine: one heap of integer keys over every pending occurrence, one broker timer.

A key is ``due_us << 48 | vhost index << 32 | slot`` (``heapq``). Removing or
rescheduling an occurrence leaves its old key behind: a key is live only while
its slot is in use with the same due time; dead keys are dropped when they
reach the head, and the heap is compacted when more than half of it is dead.
One broker timer (``TimerQueue.call_at``) is armed at the live head.

Only the nearest keys are in the heap (a Python list); the rest wait in two flat
``array('q')`` columns (due, slot reference), all due at or after ``horizon``. A
list with a million items costs every full garbage collection a walk over them --
tens of milliseconds of firing lateness -- while an array is opaque to the
collector. When the heap runs dry the nearest ``REFILL`` far keys move into it
(numpy: a partition and a mask, a few milliseconds per million, once per
``REFILL`` firings); when it grows past ``SPILL`` its later keys move out.

Until the heap first spills (or recovery loads keys in bulk) there is no horizon:
every key goes to the heap, and the far columns and numpy (a lazy import: ~0.15 s
quiet, 0.3 s loaded) stay untouched. A fresh broker's first delayed messages
therefore cost what later ones do; a horizon of 0 sent them all through the far
columns, and the first head lookup paid the import while their publishes waited.
"""
from __future__ import annotations

import heapq
from array import array

from .slots import SLOT_BITS, SLOT_MASK, VH_MASK, SlotTable

KEY_SHIFT = SLOT_BITS + 16  # due_us above vhost index (16 bits) and slot (32 bits)
EARLY_SLACK = 0.001  # arm 1 ms after the head is due: never early, and under load one
# timer wake-up fires every item due in that millisecond (10 per wake-up at 10,000/s)
COMPACT_MIN = 1024  # heaps smaller than this are never compacted
REFILL = 1 << 16  # far keys moved into the heap at once
SPILL = 4 * REFILL  # heap size from which its later keys move to the far columns
REF_MASK = (1 << KEY_SHIFT) - 1
NO_HORIZON = 1 << 62  # due_us beyond any due time: every key goes to the heap


def due_us(due: float) -> int:
    return round(due * 1_000_000)


class TimerEngine:
    """Orders occurrences and fires them, never early, in batches of ``fire_batch``
    (``Config.scheduler_fire_batch``) per timer callback.

    ``fire(table, slot, due, now)`` handles one due occurrence (it may ``push`` the
    next one); ``after_batch()`` runs after each timer callback's batch."""

    def __init__(self, timers, clock, tables: list[SlotTable], fire, after_batch=None,
                 fire_batch: int = 2000):
        self.timers = timers  # the broker's TimerQueue (monotonic)
        self.clock = clock    # wall clock: due times are wall-clock seconds
        self.tables = tables  # indexed by vhost index
        self.fire = fire
        self.after_batch = after_batch
        self.fire_batch = fire_batch
        self.heap: list[int] = []
        # far keys as two columns: a key (about 100 bits) does not fit one int64
        self.far_due = array("q")  # due_us
        self.far_ref = array("q")  # vhost index << SLOT_BITS | slot
        self.horizon = NO_HORIZON  # due_us from which a new key goes to ``far``
        self.max_lateness = 0.0
        self._handle = None
        self._armed_for: float | None = None

    def push(self, t: SlotTable, slot: int, due: float) -> None:
        d = due_us(due)
        if d < self.horizon:
            heapq.heappush(self.heap, (d << KEY_SHIFT) | (t.vi << SLOT_BITS) | slot)
            if len(self.heap) > SPILL:
                self._spill()
        else:
            self.far_due.append(d)
            self.far_ref.append((t.vi << SLOT_BITS) | slot)

    def push_many(self, t: SlotTable, first: int, dues) -> None:
        """Keys for slots ``first, first+1, ...`` due at ``dues`` (recovery, in bulk)."""
        import numpy as np  # here, not at start-up: ~0.15 s of import

        if self.horizon == NO_HORIZON:
            # bulk keys go to the far columns (a heap push each would be slow); so must
            # the heap's, for every far key to be at or after the horizon
            self._heap_to_far()
        d = np.rint(np.frombuffer(dues, dtype=np.float64) * 1_000_000).astype(np.int64)
        refs = ((t.vi << SLOT_BITS) | first) + np.arange(len(d), dtype=np.int64)
        near = d < self.horizon
        if near.any():
            for du, ref in zip(d[near].tolist(), refs[near].tolist(), strict=True):
                heapq.heappush(self.heap, (du << KEY_SHIFT) | ref)
            d, refs = d[~near], refs[~near]
        self.far_due.frombytes(d.tobytes())
        self.far_ref.frombytes(refs.tobytes())

    def _heap_to_far(self) -> None:
        for k in self.heap:
            self.far_due.append(k >> KEY_SHIFT)
            self.far_ref.append(k & REF_MASK)
        self.heap = []
        self.horizon = 0

    def _spill(self) -> None:
        """Keep the nearest ``REFILL`` keys in the heap, the rest in the far columns."""
        import numpy as np  # here, not at start-up: ~0.15 s of import

        dues = np.array([k >> KEY_SHIFT for k in self.heap], dtype=np.int64)
        refs = np.array([k & REF_MASK for k in self.heap], dtype=np.int64)
        horizon = int(np.partition(dues, REFILL - 1)[REFILL - 1]) + 1
        near = dues < horizon
        far = ~near
        heap = [(du << KEY_SHIFT) | ref
                for du, ref in zip(dues[near].tolist(), refs[near].tolist(), strict=True)]
        heapq.heapify(heap)
        self.heap = heap
        self.horizon = horizon  # lower than before: the far columns are all above it
        self.far_due.frombytes(dues[far].tobytes())
        self.far_ref.frombytes(refs[far].tobytes())

    def _refill(self) -> bool:
        """Move the nearest far keys into the (empty) heap; False if there are none."""
        if not self.far_due:
            return False
        if len(self.far_due) <= REFILL:
            # all of them: no selection, so no numpy (nor its import on a firing path)
            heap = [(du << KEY_SHIFT) | ref
                    for du, ref in zip(self.far_due, self.far_ref, strict=True)]
            heap.extend(self.heap)
            heapq.heapify(heap)
            self.heap = heap
            self.horizon = NO_HORIZON  # the far columns are empty
            self.far_due, self.far_ref = array("q"), array("q")
            return True
        import numpy as np  # here, not at start-up: ~0.15 s of import

        dues = np.frombuffer(self.far_due, dtype=np.int64)
        refs = np.frombuffer(self.far_ref, dtype=np.int64)
        horizon = int(np.partition(dues, REFILL - 1)[REFILL - 1]) + 1
        near = dues < horizon
        heap = [(du << KEY_SHIFT) | ref
                for du, ref in zip(dues[near].tolist(), refs[near].tolist(), strict=True)]
        heap.extend(self.heap)
        heapq.heapify(heap)
        self.heap = heap
        self.horizon = horizon
        far = ~near
        self.far_due = array("q", dues[far].tobytes())
        self.far_ref = array("q", refs[far].tobytes())
        return True

    def _live(self, k: int) -> bool:
        t = self.tables[(k >> SLOT_BITS) & VH_MASK]
        slot = k & SLOT_MASK
        return bool(t.kind[slot]) and due_us(t.due[slot]) == k >> KEY_SHIFT

    def head(self) -> int | None:
        """The first live heap key (dropping dead ones), or None."""
        tables = self.tables
        while True:
            heap = self.heap
            if not heap and not self._refill():
                return None
            heap = self.heap
            while heap:
                k = heap[0]
                t = tables[(k >> SLOT_BITS) & VH_MASK]
                slot = k & SLOT_MASK
                if t.kind[slot] and due_us(t.due[slot]) == k >> KEY_SHIFT:
                    return k
                heapq.heappop(heap)

    def head_due(self) -> float | None:
        k = self.head()
        if k is None:
            return None
        return self.tables[(k >> SLOT_BITS) & VH_MASK].due[k & SLOT_MASK]

    def arm(self) -> None:
        due = self.head_due()
        if due is None:
            if self._handle is not None:
                self._handle.cancel()
                self._handle = None
                self._armed_for = None
            return
        if self._handle is not None and self._armed_for is not None and self._armed_for <= due:
            return  # armed for an earlier (or the same) moment; it will re-arm
        if self._handle is not None:
            self._handle.cancel()
        when = self.timers.now() + max(0.0, due - self.clock()) + EARLY_SLACK
        self._armed_for = due
        self._handle = self.timers.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._handle = None
        self._armed_for = None
        self.run_due()
        if self.after_batch is not None:
            self.after_batch()
        due = self.head_due()
        if due is not None and due <= self.clock():
            # more due than one batch: continue right after other timers / connections
            self._armed_for = due
            self._handle = self.timers.call_at(self.timers.now(), self._on_timer)
        else:
            self.arm()

    def run_due(self, now: float | None = None, limit: int | None = None) -> int:
        if limit is None:
            limit = self.fire_batch
        now = self.clock() if now is None else now
        now_us = due_us(now) + 1
        heap = self.heap
        tables = self.tables
        fire = self.fire
        fired = 0
        while fired < limit:
            if not heap:
                if not self._refill():
                    break
                heap = self.heap
            k = heap[0]
            if k >> KEY_SHIFT > now_us:
                break
            t = tables[(k >> SLOT_BITS) & VH_MASK]
            slot = k & SLOT_MASK
            due = t.due[slot]
            if not t.kind[slot] or due_us(due) != k >> KEY_SHIFT:
                heapq.heappop(heap)  # removed or rescheduled: a dead key
                continue
            if due > now:
                break  # due within the next microsecond: never early
            heapq.heappop(heap)
            late = now - due
            if late > self.max_lateness:
                self.max_lateness = late
            fire(t, slot, due, now)
            heap = self.heap  # firing may push, and a push may spill into a new list
            fired += 1
        return fired

    def maybe_compact(self, live: int) -> None:
        """Drop dead keys once they are more than half of a large heap."""
        total = len(self.heap) + len(self.far_due)
        if total > COMPACT_MIN and total > 2 * live:
            keep = [k for k in self.heap if self._live(k)]
            heapq.heapify(keep)
            self.heap = keep
            if self.far_due:
                self._compact_far()

    def _compact_far(self) -> None:
        """Keep the far keys still live, checked table by table on whole columns."""
        import numpy as np  # here, not at start-up: ~0.15 s of import

        dues = np.frombuffer(self.far_due, dtype=np.int64)
        refs = np.frombuffer(self.far_ref, dtype=np.int64)
        vis = (refs >> SLOT_BITS) & VH_MASK
        alive = np.zeros(len(refs), dtype=bool)
        for vi in np.unique(vis).tolist():
            t = self.tables[vi]
            sel = vis == vi
            slots = refs[sel] & SLOT_MASK
            kind = np.frombuffer(t.kind, dtype=np.uint8)
            due = np.frombuffer(t.due, dtype=np.float64)
            inside = slots < len(kind)
            slots = np.where(inside, slots, 0)
            same = np.rint(due[slots] * 1_000_000).astype(np.int64) == dues[sel]
            alive[sel] = inside & (kind[slots] != 0) & same
        self.far_due = array("q", dues[alive].tobytes())
        self.far_ref = array("q", refs[alive].tobytes())

    def clear(self) -> None:
        self.heap.clear()
        self.far_due, self.far_ref = array("q"), array("q")
        self.horizon = NO_HORIZON
