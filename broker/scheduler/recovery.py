"""Recovery: rebuilding the scheduler from the entries a store hands back after a restart.

The store recreates each vhost's internal queue as a ``ScheduledQueue`` (through
the queue-variant factory, see ``install``) and hands every stored entry back
with ``queue.enqueue(message, entry=entry)``, as for any durable queue. Each one
carries its schedule state in ``x-triomq-*`` headers: ``adopt`` rebuilds its
slot, id and heap key, and keeps only its journal location (the message is read
once, here, and dropped again). The recovery hook (``finish``) then arms the
timer: overdue entries fire at once, in batches.

A journal hands back the paged index instead (``restore_paged``): the entries the
timer index on disk describes (the snapshot, ``checkpoint``, plus the log of what was
stored since, ``indexlog``) are rebuilt from it in bulk, without reading a message;
only the others (none after a kill -9, unless the log could not be written) are read
back and adopted one by one.

A crash between "write the next occurrence" and "remove the fired one" leaves
both stored: the newer (higher seq) wins, so a schedule is never multiplied.
"""
from __future__ import annotations

import logging
import time
from array import array
from bisect import bisect_left

from ..malloc import trim
from ..queues.entry import QueueEntry
from . import checkpoint
from .packing import read_state
from .scheduled_queue import INTERNAL_QUEUE, ScheduledQueue
from .slots import K_AMQ, K_COMPLEX, K_DELAY
from .spec import Schedule

log = logging.getLogger("broker.scheduler")


def adopt(scheduler, q: ScheduledQueue, entry: QueueEntry) -> bool:
    """Rebuild one pending occurrence from its stored entry; False if dropped."""
    try:
        sid, schedule, due, left, run = read_state(entry.message.headers)
    except (KeyError, ValueError, TypeError) as exc:
        log.warning("scheduler: dropping unreadable stored entry %s (%s)", entry.seq, exc)
        q.forget(entry)
        return False
    found = scheduler.lookup(sid)
    if found is not None:
        # crash between "write next occurrence" and "remove fired one": keep the newer
        t, slot = found
        if t.seq_of(slot) > entry.seq:
            q.forget(entry)
            return False
        scheduler.drop_stored(t, slot)
    else:
        t = q.ready
        slot = t.alloc()
        scheduler.sids.assign(t, slot, sid)
        scheduler.recovering += 1
    t.set_state(slot, schedule, due, left, run)
    scheduler.keep_stored(t, slot, entry)
    scheduler.engine.push(t, slot, due)
    return True


def restore_paged(scheduler, q: ScheduledQueue, seqs, locs, blens) -> int:
    """Adopt a journal's paged index of ``q`` (sorted by seq); returns how many."""
    t = q.ready
    misses = range(len(seqs))
    loaded = 0
    started = time.monotonic()
    phase = scheduler.recovery_phase(f"scheduler index of {t.vhost_name}", len(seqs))
    snap = scheduler.loaded_index(q)
    ti = snap.tables.get(t.vhost_name) if snap is not None else None
    ti, prefixes = scheduler.merged_index(q, ti)
    if ti is not None and not len(t.kind):
        hits, misses = checkpoint.join(ti, seqs, locs, blens)
        loaded = _load(scheduler, t, ti, hits, prefixes)
        if loaded < 0:  # an inconsistent index: read everything back
            loaded, misses = 0, range(len(seqs))
    n = loaded
    phase.advance(loaded)
    for k, i in enumerate(misses):
        n += q.read_back(seqs[i], locs[i])
        if k % 1000 == 999:
            phase.advance(1000)
    phase.finish()
    scheduler.note_recovery_reads(len(misses))
    scheduler.recovery_seconds += time.monotonic() - started
    return n


def _load(scheduler, t, ti: checkpoint.TableIndex, hits, prefixes: list[str]) -> int:
    """Fill the empty table ``t`` with the snapshot rows ``hits`` (all of them in order
    when None); -1 if the rows do not describe valid slots."""
    names = ("seq", "loc", "blen", "due", "kind", "delay", "sidp", "sidn")
    if hits is None:
        cols = [getattr(ti, name) for name in names]  # the index's columns, by name
    else:
        import numpy as np

        cols = []
        for name in names:
            c = getattr(ti, name)
            a = array(c.typecode)
            a.frombytes(np.frombuffer(c, dtype=c.typecode)[hits].tobytes()
                        if len(c) else b"")
            cols.append(a)
    seq, kind, sidp = cols[0], cols[4], cols[6]
    n = len(seq)
    if not n:
        return 0
    n_complex = kind.count(K_COMPLEX)
    if kind.count(K_DELAY) + kind.count(K_AMQ) + n_complex != n or max(sidp) >= len(prefixes):
        return -1
    complex_: list[tuple[int, Schedule, int, float]] = []
    if n_complex:
        for s, (kname, delay, period, repeat, cron, left, run) in ti.complex.items():
            slot = bisect_left(seq, s)
            if slot < n and seq[slot] == s and kind[slot] == K_COMPLEX:
                complex_.append((slot, Schedule(kname, delay=delay, period=period,
                                                repeat=repeat, cron=cron), left, run))
    if len(complex_) != n_complex:
        return -1
    own = scheduler.sids.own_prefixes(prefixes)
    if own != list(range(len(own))):
        cols[6] = array("H", map(own.__getitem__, sidp))
    t.load(*cols)
    for slot, sched, left, run in complex_:
        t.set_complex(slot, sched, left, run)
    scheduler.sids.assign_loaded(t, 0, n)
    scheduler.engine.push_many(t, 0, t.due)
    scheduler.recovering += n
    return n


def finish(scheduler) -> int:
    """After the store has handed everything back: arm the timer. Returns how many
    pending occurrences were recovered."""
    restored, scheduler.recovering = scheduler.recovering, 0
    for vhost in scheduler.services.vhosts.values():
        q = vhost.queues.get(INTERNAL_QUEUE)
        if q is not None and not isinstance(q, ScheduledQueue):
            log.error("scheduler: %r in vhost %r was recovered as a plain queue (the queue "
                      "variant factory was not consulted); its messages stay unscheduled",
                      INTERNAL_QUEUE, vhost.name)
    for q in scheduler.queues.values():
        q.release_read_maps()
    if restored:
        # the merge's temporaries and the store's replay leave freed pages in malloc's
        # heap (about 60 MB for 300,000 pending): hand them back once, not at the peak
        trim()
    scheduler.engine.arm()
    if restored:
        log.info("scheduler: recovered %d pending scheduled messages (%d read back, the rest "
                 "from the timer index; %d index log records read) in %.2f s", restored,
                 scheduler.recovery_reads, scheduler.index_log_records,
                 scheduler.recovery_seconds)
    return restored
