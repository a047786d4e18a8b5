"""Management views: ``scheduler.items`` (id -> Item), ``list`` and ``stats``.

Everything here reads the slot tables live through the scheduler's public
methods; only ``list`` scans all pending messages (and ``stats``' count by kind,
an ``array.count``).
"""
from __future__ import annotations

import heapq
from collections.abc import Mapping

from ..queues.entry import QueueEntry
from .packing import blob_message
from .slots import SlotTable
from .spec import Schedule


class Item:
    """A handle on one pending message (management and tests); reads the slot live."""
    __slots__ = ("_s", "_slot", "_t", "sid")

    def __init__(self, scheduler, table: SlotTable, slot: int, sid: str):
        self._s = scheduler
        self._t = table
        self._slot = slot
        self.sid = sid

    @property
    def cancelled(self) -> bool:
        t, slot = self._t, self._slot
        return not t.kind[slot] or self._s.sid_of(t, slot) != self.sid

    def _check(self) -> tuple[SlotTable, int]:
        if self.cancelled:
            raise KeyError(self.sid)
        return self._t, self._slot

    @property
    def vhost(self) -> str:
        return self._t.vhost_name

    @property
    def due(self) -> float:
        t, slot = self._check()
        return t.due[slot]

    def _state(self) -> tuple[Schedule, int, float]:
        t, slot = self._check()
        return t.state(slot)

    @property
    def schedule(self) -> Schedule:
        return self._state()[0]

    @property
    def left(self) -> int:
        """Deliveries left in the current run."""
        return self._state()[1]

    @property
    def run(self) -> float:
        """Start of the current run (wall clock)."""
        return self._state()[2]

    @property
    def stored(self) -> bool:
        t, slot = self._check()
        return not isinstance(t.held[slot], bytes)

    @property
    def entry(self) -> QueueEntry:
        t, slot = self._check()
        e = t.queue.stored_entry(slot)
        if e is None:
            e = QueueEntry(blob_message(t.held[slot]), 0)
        return e

    def describe(self) -> dict:
        msg = self.entry.message
        s, left, _run = self._t.state(self._slot)
        return {"id": self.sid, "vhost": self.vhost, "exchange": msg.exchange,
                "routing_key": msg.routing_key, "due": self.due, "kind": s.kind,
                "delay": s.delay, "period": s.period, "repeat": s.repeat, "cron": s.cron,
                "remaining_in_run": left, "persistent": msg.persistent,
                "size": len(msg.body)}


class ItemsView(Mapping):
    """``scheduler.items``: id -> Item, computed from the slot tables."""

    def __init__(self, scheduler):
        self._s = scheduler

    def __getitem__(self, sid):
        found = self._s.lookup(sid)
        if found is None:
            raise KeyError(sid)
        t, slot = found
        return Item(self._s, t, slot, sid)

    def __len__(self) -> int:
        return self._s.pending

    def __iter__(self):
        s = self._s
        for t in list(s.tables):
            for slot in t.live_slots():
                yield s.sid_of(t, slot)

    def values(self):  # type: ignore[override]  # a list, as before
        s = self._s
        return [Item(s, t, slot, s.sid_of(t, slot)) for t in list(s.tables) for slot in t.live_slots()]


def list_items(scheduler, limit: int | None = None) -> list[dict]:
    """Pending messages in due order (the first ``limit``), described."""
    keyed = ((t.due[slot], t.vi, slot, t) for t in scheduler.tables for slot in t.live_slots())
    if limit is not None:
        chosen = heapq.nsmallest(limit, keyed, key=lambda x: (x[0], x[1], x[2]))
    else:
        chosen = sorted(keyed, key=lambda x: (x[0], x[1], x[2]))
    return [Item(scheduler, t, slot, scheduler.sid_of(t, slot)).describe()
            for _d, _v, slot, t in chosen]


def stats(scheduler) -> dict:
    by_kind: dict = {}
    for t in scheduler.tables:
        n, a = t.count_by_kind()
        if n:
            by_kind["delay"] = by_kind.get("delay", 0) + n
        if a:
            by_kind["amq"] = by_kind.get("amq", 0) + a
    return {"pending": scheduler.pending, "pending_by_kind": by_kind,
            "next_due": scheduler.engine.head_due(),
            "scheduled_total": scheduler.scheduled, "fired_total": scheduler.fired,
            "removed_total": scheduler.removed,
            "max_lateness_ms": round(scheduler.engine.max_lateness * 1000, 3)}
