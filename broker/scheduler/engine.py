"""Timer engine: one heap of integer keys over every pending occurrence, one broker timer.

A key is ``due_us << 48 | vhost index << 32 | slot`` (``heapq``). Removing or
rescheduling an occurrence leaves its old key behind: a key is live only while
its slot is in use with the same due time; dead keys are dropped when they
reach the head, and the heap is compacted when more than half of it is dead.
One broker timer (``TimerQueue.call_at``) is armed at the live head.
"""
from __future__ import annotations

import heapq

from .slots import SLOT_BITS, SLOT_MASK, VH_MASK, SlotTable

KEY_SHIFT = SLOT_BITS + 16  # due_us above vhost index (16 bits) and slot (32 bits)
EARLY_SLACK = 0.001  # arm 1 ms after the head is due: never early, and under load one
# timer wake-up fires every item due in that millisecond (10 per wake-up at 10,000/s)
COMPACT_MIN = 1024  # heaps smaller than this are never compacted


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
        self.max_lateness = 0.0
        self._handle = None
        self._armed_for: float | None = None

    def push(self, t: SlotTable, slot: int, due: float) -> None:
        heapq.heappush(self.heap, (due_us(due) << KEY_SHIFT) | (t.vi << SLOT_BITS) | slot)

    def push_many(self, t: SlotTable, first: int, dues) -> None:
        """Keys for slots ``first, first+1, ...`` due at ``dues`` (recovery, in bulk)."""
        base = (t.vi << SLOT_BITS) | first
        heap = self.heap
        heap.extend([(round(d * 1_000_000) << KEY_SHIFT) | (base + i) for i, d in enumerate(dues)])
        heapq.heapify(heap)

    def _live(self, k: int) -> bool:
        t = self.tables[(k >> SLOT_BITS) & VH_MASK]
        slot = k & SLOT_MASK
        return bool(t.kind[slot]) and due_us(t.due[slot]) == k >> KEY_SHIFT

    def head(self) -> int | None:
        """The first live heap key (dropping dead ones), or None."""
        heap = self.heap
        tables = self.tables
        while heap:
            k = heap[0]
            t = tables[(k >> SLOT_BITS) & VH_MASK]
            slot = k & SLOT_MASK
            if t.kind[slot] and due_us(t.due[slot]) == k >> KEY_SHIFT:
                return k
            heapq.heappop(heap)
        return None

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
        while heap and fired < limit:
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
            fired += 1
        return fired

    def maybe_compact(self, live: int) -> None:
        """Drop dead keys once they are more than half of a large heap."""
        if len(self.heap) > COMPACT_MIN and len(self.heap) > 2 * live:
            keep = [k for k in self.heap if self._live(k)]
            heapq.heapify(keep)
            self.heap = keep

    def clear(self) -> None:
        self.heap.clear()
