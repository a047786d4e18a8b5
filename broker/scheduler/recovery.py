"""Recovery: rebuilding the scheduler from the entries a store hands back after a restart.

The store recreates each vhost's internal queue as a ``ScheduledQueue`` (through
the queue-variant factory, see ``install``) and hands every stored entry back
with ``queue.enqueue(message, entry=entry)``, as for any durable queue. Each one
carries its schedule state in ``x-triomq-*`` headers: ``adopt`` rebuilds its
slot, id and heap key, and keeps only its journal location (the message is read
once, here, and dropped again). The recovery hook (``finish``) then arms the
timer: overdue entries fire at once, in batches.

A crash between "write the next occurrence" and "remove the fired one" leaves
both stored: the newer (higher seq) wins, so a schedule is never multiplied.
"""
from __future__ import annotations

import logging

from ..queues.entry import QueueEntry
from .packing import read_state
from .scheduled_queue import INTERNAL_QUEUE, ScheduledQueue

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


def finish(scheduler) -> int:
    """After the store has handed everything back: arm the timer. Returns how many
    pending occurrences were recovered."""
    restored, scheduler.recovering = scheduler.recovering, 0
    for vhost in scheduler.broker.vhosts.values():
        q = vhost.queues.get(INTERNAL_QUEUE)
        if q is not None and not isinstance(q, ScheduledQueue):
            log.error("scheduler: %r in vhost %r was recovered as a plain queue (the queue "
                      "variant factory was not consulted); its messages stay unscheduled",
                      INTERNAL_QUEUE, vhost.name)
    for q in scheduler.queues.values():
        q.release_read_maps()
    scheduler.engine.arm()
    if restored:
        log.info("scheduler: recovered %d pending scheduled messages", restored)
    return restored
