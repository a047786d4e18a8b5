"""A mirror's sync: from nothing (RESET, the queue in batches, SYNCED) or a catch-up from its
own copy (KEEP, what it lacks, SYNCED), read from the queue a batch at a time. Not the
live ops nor who is in sync (``mirror_master.Mirroring``)."""
from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING

from ..persistence.paged import PagedFifo
from .mirror_ops import _SEQ, ENQUEUES, KEEP, RESET, RETURNED, SYNCED, entry_chunks, pack_counts, seq_chunks

if TYPE_CHECKING:
    from .mirror_master import Mirroring

log = logging.getLogger("broker.cluster.mirror")

_SYNC_BATCH = 512  # messages per op while a new mirror synchronises


class Sync:
    """One mirror's sync in progress, sent in batches by seq: each batch is read from the
    queue when it is sent (a paged queue is read back a batch at a time, never all at once:
    one step reading 50,000 messages kept a new leader from renewing its lease)."""

    __slots__ = ("cursor", "exhausted", "finished", "flying", "generation", "pos", "snapshot",
                 "top")

    def __init__(self, generation: int, cursor: int, top: int, snapshot: list | None):
        self.generation = generation
        self.cursor = cursor  # every entry with a seq up to it was sent (or had left)
        self.top = top  # the last seq when the sync began: later ones go as live ops
        # the ready entries in order, taken at the start, for a ready store that cannot be
        # read in steps (in memory: cheap); None: read from the queue at each batch
        self.snapshot = snapshot
        self.pos = 0
        self.flying = 0  # batches not confirmed yet (two at most)
        self.exhausted = False  # every batch was sent
        self.finished = False  # SYNCED sent


def held(m: Mirroring) -> tuple[list[int], dict[int, int]]:
    """The seqs the queue holds (ready and delivered-unsettled), in order, and the
    delivery counts of those that came back (a delivered one: so far), without reading
    a paged message back."""
    ready = m.queue.ready
    if isinstance(ready, PagedFifo):  # from its index: nothing paged is read back
        seqs, counts = ready.seq_counts()
    else:
        seqs, counts = [], {}
        for e in ready:
            seqs.append(e.seq)
            if e.delivery_count:
                counts[e.seq] = e.delivery_count
    for e in m.outside.values():
        seqs.append(e.seq)
        if e.delivery_count > 1:
            counts[e.seq] = e.delivery_count - 1
    seqs.sort()
    return seqs, counts

def snapshot(m: Mirroring) -> list | None:
    """None when the ready store is read a batch at a time (``entries_after``: a paged
    queue, in seq order), else its entries now (in memory: cheap)."""
    ready = m.queue.ready
    if isinstance(ready, PagedFifo):
        seqs = ready.seq_counts()[0]
        if all(a < b for a, b in itertools.pairwise(seqs)):
            return None
    return sorted(ready, key=lambda e: e.seq)

def catch_up(m: Mirroring, node: str, generation: int, top: int) -> None:
    """KEEP (the seqs up to ``top`` the queue still holds: the mirror drops the others,
    they left while it was away), then the messages after ``top`` in batches, then
    SYNCED. Sound because the copy is the queue as it was at one moment (ops apply in
    order, a copy on disk is complete) and seqs only grow: what the queue holds up to
    ``top`` was in the queue then, so the copy has it."""
    m.nodes[node] = "syncing"
    seqs, counts = held(m)
    keep = [seq for seq in seqs if seq <= top]
    head = _SEQ.pack(top)
    bodies = [head + chunk for chunk in seq_chunks(keep)] or [head]
    fail = m.done_for(node)
    m.send_all(node, KEEP, bodies, fail)
    counts = {seq: n for seq, n in counts.items() if seq <= top}
    if m.quorum and counts:  # returns made while it was away
        m.send(node, RETURNED, pack_counts(counts), fail)
    missing = len(seqs) - len(keep)
    sync = Sync(generation, top, m.queue._next_seq - 1, snapshot(m))
    m.syncs[node] = sync
    m.sync_counts[node] = [0, missing]
    m.progress_dirty = True
    log.info("queue %r: mirror %r catches up from its own copy (%d messages kept, %d to "
             "send)", m.queue.name, node, len(keep), missing)
    sync_next(m, node)

def full_sync(m: Mirroring, node: str, generation: int) -> None:
    """RESET, then the queue's messages in batches of ``ha-sync-batch-size`` (at most
    two batches unconfirmed, so the queue and the link keep serving meanwhile), then
    SYNCED: once that is confirmed the mirror joins the in-sync set. The live ops go
    to it meanwhile; a message that leaves before its batch is sent is skipped."""
    m.nodes[node] = "syncing"
    m.send(node, RESET, b"", m.done_for(node))
    m.syncs[node] = Sync(generation, 0, m.queue._next_seq - 1, snapshot(m))
    m.sync_counts[node] = [0, len(m.queue.ready) + len(m.outside)]
    m.progress_dirty = True
    sync_next(m, node)

def batch_size(m: Mirroring) -> int:
    size = (m.queue.effective_policy_definition or {}).get("ha-sync-batch-size")
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 \
        else _SYNC_BATCH

def next_batch(m: Mirroring, sync: Sync, size: int) -> list:
    """The next entries of a sync: up to ``size`` ready ones after its cursor, and the
    delivered-unsettled ones in the same range of seqs. Each live entry is in one of the
    two when its range is read; one that left before is not needed (its LEFT went
    live), one that comes later goes live."""
    top = sync.top
    if sync.snapshot is None:
        ready = m.queue.ready
        assert isinstance(ready, PagedFifo)  # ``snapshot`` is None for a paged one only
        got = ready.entries_after(sync.cursor, size)
        if len(got) < size or got[-1].seq >= top:
            sync.exhausted = True
        got = [e for e in got if e.seq <= top]
    else:
        low = sync.cursor
        got = [e for e in sync.snapshot[sync.pos:sync.pos + size]
               if e.seq > low and e.seq not in m.gone]
        sync.pos += size
        sync.exhausted = sync.pos >= len(sync.snapshot)
    low = sync.cursor
    high = top if sync.exhausted else got[-1].seq if got else low
    batch = {e.seq: e for e in got}
    for e in m.outside.values():
        if low < e.seq <= high:
            batch[e.seq] = e
    sync.cursor = high
    return [batch[seq] for seq in sorted(batch)]

def sync_next(m: Mirroring, node: str) -> None:
    sync = m.syncs.get(node)
    if sync is None or sync.finished:
        return
    generation = sync.generation
    size = batch_size(m)
    fail = m.done_for(node)
    while sync.flying < 2 and not sync.exhausted:
        batch = next_batch(m, sync, size)
        if not batch:
            continue
        sync.flying += 1
        m.send_all(node, ENQUEUES, entry_chunks(batch),
                       batch_done(m, node, generation, len(batch), fail))
        if m.quorum:  # the delivery counts of what it sent (a delivered one: so far)
            counts = {e.seq: e.delivery_count - (e.seq in m.outside) for e in batch}
            counts = {seq: n for seq, n in counts.items() if n > 0}
            if counts:
                m.send(node, RETURNED, pack_counts(counts), fail)
    if not sync.exhausted or sync.flying:
        return
    sync.finished = True  # every batch confirmed: SYNCED, once
    top = sync.top

    def synced(ok: bool | None) -> None:
        if m.generation.get(node) != generation or m.nodes.get(node) != "syncing":
            return
        m.end_sync(node)
        if ok:
            m.nodes[node] = "in_sync"
            if top > m.acked.get(node, 0):
                m.acked[node] = top
            m.owner.wake()
        else:
            fail(False)
    m.send(node, SYNCED, b"", synced)

def batch_done(m: Mirroring, node: str, generation: int, count: int, fail):
    def done(ok: bool | None) -> None:
        sync = m.syncs.get(node)
        if sync is None or sync.generation != generation:
            return  # cancelled, or an older sync
        if not ok:
            m.end_sync(node)
            fail(ok)
            return
        sync.flying -= 1
        counts = m.sync_counts.get(node)
        if counts is not None:
            counts[0] += count
            m.progress_dirty = True
        sync_next(m, node)
    return done
