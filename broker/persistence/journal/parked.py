"""Delivered-but-unsettled stored entries parked out of memory: a channel that holds a
delivery for longer than a consumer-timeout sweep hands its ``QueueEntry`` to the store
(``park``), which keeps it as one row of columns and hands back a slot number; settling it
(ack, nack, reject, requeue, close, timeout) takes the entry back (``unpark``), rebuilt from
the row and its record's header. Checkpoints and compaction see the rows as they see the
entries of ``_out``. The rows themselves (parking.py: the store's side). Does not decide when to park
(the channel does).

A row: seq, location, body length, queue id, delivery count, redelivered, priority: 30
bytes, about what a paged queue's entry costs, instead of a ``QueueEntry``, its
``StoredMessage``, their ints and ``_out``'s dict slot (~300 B). Expiry times, rare on
unacked deliveries, are a dict by slot, on the broker's clock as an entry's (made wall-clock
time when a checkpoint or compaction writes them).
"""
from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...queues.entry import QueueEntry


class Parked:
    """The rows, by slot. A free slot has location 0 (a parked entry is always stored) and
    is reused; the columns are dropped once no row is left."""

    __slots__ = ("blens", "counts", "exps", "flags", "free", "live", "locs", "prios", "qids",
                 "seqs")

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.seqs = array("q")
        self.locs = array("q")
        self.blens = array("I")
        self.qids = array("I")
        self.counts = array("I")
        self.flags = array("B")   # 1: redelivered
        self.prios = array("B")
        self.exps: dict[int, float] = {}  # slot -> expiry (timers.now()), for the few with one
        self.free = array("q")
        self.live = 0

    def add(self, qid: int, entry: QueueEntry, blen: int, expires_at: float | None) -> int:
        row = (entry.seq, entry.loc, blen, qid, min(entry.delivery_count, 0xFFFFFFFF),
               1 if entry.redelivered else 0, entry.priority)
        cols = (self.seqs, self.locs, self.blens, self.qids, self.counts, self.flags,
                self.prios)
        if self.free:
            slot = self.free.pop()
            for col, v in zip(cols, row, strict=True):
                col[slot] = v
        else:
            slot = len(self.seqs)
            for col, v in zip(cols, row, strict=True):
                col.append(v)
        if expires_at is not None:
            self.exps[slot] = expires_at
        self.live += 1
        return slot

    def take(self, slot: int) -> tuple[int, int, int, int, int, bool, int, float | None]:
        """``(seq, loc, blen, qid, count, redelivered, prio, expires_at)`` of ``slot``, freed."""
        loc = self.locs[slot]
        if not loc:
            raise KeyError(slot)
        row = (self.seqs[slot], loc, self.blens[slot], self.qids[slot], self.counts[slot],
               bool(self.flags[slot]), self.prios[slot], self.exps.pop(slot, None))
        self.live -= 1
        if not self.live:
            self._reset()
        else:
            self.locs[slot] = 0
            self.free.append(slot)
        return row

    def slots(self) -> list[int]:
        """The live rows' slots."""
        if not self.live:
            return []
        return [i for i, loc in enumerate(self.locs) if loc]
