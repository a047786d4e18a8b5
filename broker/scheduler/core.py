"""The broker-wide scheduler: schedules, fires and removes pending scheduled messages.

Pending messages live, per vhost, in the slot table of an internal durable queue
(``ScheduledQueue``, ``amq.triomq.scheduled``; see scheduled_queue.py). The
pieces, one module each (docs/scheduler.md, module map):

* ``slots``: ``SlotTable``, the per-vhost parallel arrays (the queue's ready store);
* ``ids``: ``SidIndex`` / ``SidMap``, id -> slot;
* ``engine``: ``TimerEngine``, the heap of integer keys and the one broker timer;
* ``packing``: transient blobs, stored state headers, the delivered copy;
* ``scheduled_queue``: the queue variant and the stored copy of each slot;
* ``recovery``: rebuilding from the stored entries after a restart;
* ``views``: ``items``, ``list`` and ``stats`` for management.

Firing an occurrence: route a copy through the original exchange (no hooks,
no mandatory), then either remove the stored entry (done) or write the next
occurrence *before* removing the old one -- at-least-once across a crash.
"""
from __future__ import annotations

import gc
import os
import time
from typing import TYPE_CHECKING

from ..internal_queues import InternalQueues
from ..persistence.base import READS_BACK
from ..publishing import Source
from ..queues.entry import QueueEntry
from . import checkpoint, indexlog, recovery, views
from .engine import TimerEngine
from .ids import SidIndex
from .packing import blob_delivery, pack_blob, stored_delivery, with_state
from .scheduled_queue import INTERNAL_QUEUE, ScheduledQueue
from .slots import K_COMPLEX, K_DELAY, VH_MASK, SlotTable
from .spec import Schedule

if TYPE_CHECKING:
    from ..services import SchedulerServices
    from ..vhost import VirtualHost

__all__ = ["INTERNAL_QUEUE", "ScheduledQueue", "Scheduler"]

# Persistent messages held as QueueEntry objects (stores without read-back, i.e. SQL) are
# long-lived GC-tracked objects: every GC_FREEZE_STEP new ones are moved out of the cyclic
# GC's reach (gc.freeze). Compact slots (bytes, arrays, int keys) are not GC-tracked at all.
GC_FREEZE_STEP = 20_000
RELEASE_MAPS_EVERY = 1.0  # seconds: at most this long's worth of read pages stay mapped


class Scheduler:
    def __init__(self, services: SchedulerServices, clock=time.time):
        self.services = services  # the composition root's, never the whole broker
        self.timers = services.timers
        self.tables: list[SlotTable] = []  # indexed by vhost index
        self.sids = SidIndex(self.tables)
        self.engine = TimerEngine(services.timers, clock, self.tables, self._fire,
                                  self._after_batch, services.config.scheduler_fire_batch)
        self.queues: InternalQueues[ScheduledQueue] = InternalQueues(
            lambda vhost: ScheduledQueue(self, vhost))
        self.items = views.ItemsView(self)
        self.fired = 0
        self.scheduled = 0
        self.removed = 0
        self.recovering = 0  # occurrences adopted since the last recovery hook
        self._held_since_freeze = 0
        self._frozen = False
        self._schedules: dict = {}  # interned complex schedules, shared by the tables
        self._journal_reads = 0
        self._maps_released_at = 0.0
        # the timer index on disk (checkpoint.py): operations since the last snapshot, and
        # the snapshot read at start-up (kept until recovery is over)
        self.changes = 0
        self.recovery_reads = 0  # stored entries read back at start-up (not in the index)
        self._index: dict = {}  # sidecar path -> Snapshot | None, during recovery only
        # the index log (indexlog.py): journal-paged occurrences stored since the snapshot
        self.index_log: indexlog.IndexLog | None = None
        self._log_store = None  # the store whose group commits flush the log
        self._log_waiting = False  # a flush callback is registered with that store
        self._vh_keys: dict[str, int] = {}
        self.index_log_records = 0  # index log records read at start-up
        self.recovery_seconds = 0.0  # spent rebuilding from the index and reading back

    @property
    def clock(self):
        return self.engine.clock

    @clock.setter
    def clock(self, clock) -> None:
        self.engine.clock = clock

    @property
    def heap(self) -> list[int]:
        return self.engine.heap

    @property
    def max_lateness(self) -> float:
        return self.engine.max_lateness

    @property
    def pending(self) -> int:
        return sum(t.live for t in self.tables)

    # ---- the internal queues ----
    def table(self, vhost_name: str) -> SlotTable:
        """The slot table of a vhost (created on first use)."""
        for t in self.tables:
            if t.vhost_name == vhost_name:
                return t
        vi = len(self.tables)
        if vi > VH_MASK:
            raise ValueError("too many vhosts with scheduled messages")
        t = SlotTable(vi, vhost_name, self._schedules)
        self.tables.append(t)
        return t

    def new_queue(self, vhost: VirtualHost) -> ScheduledQueue:
        return self.queues.new(vhost)

    def internal_queue(self, vhost: VirtualHost) -> ScheduledQueue:
        return self.queues.of(vhost)

    # ---- ids and slots, for views and recovery ----
    def lookup(self, sid) -> tuple[SlotTable, int] | None:
        return self.sids.lookup(sid)

    def sid_of(self, t: SlotTable, slot: int) -> str:
        return self.sids.sid_of(t, slot)

    def keep_stored(self, t: SlotTable, slot: int, entry: QueueEntry) -> None:
        """Record where a freshly written persistent occurrence lives."""
        if t.queue.keep(slot, entry):  # a store that cannot read messages back: kept whole
            self._held_since_freeze += 1
            if self._held_since_freeze >= GC_FREEZE_STEP:
                self._gc_freeze()
        else:
            self.log_slot(t, slot)

    def log_slot(self, t: SlotTable, slot: int) -> None:
        """Append a journal-paged slot's state to the index log (stored or moved)."""
        seq, loc = t.stored_at(slot)
        if not loc:
            return
        ilog = self.index_log
        if ilog is None:
            ilog = self._open_index_log(t.queue)
            if ilog is None:
                return
        vh = self._vh_keys.get(t.vhost_name)
        if vh is None:
            vh = self._vh_keys[t.vhost_name] = indexlog.vhost_key(t.vhost_name)
        p, n = t.sid_pair(slot)
        k = t.kind[slot]
        cx = None
        if k == K_COMPLEX:
            sched, left, run = t.cx[slot]
            cx = [sched.kind, sched.delay, sched.period, sched.repeat, sched.cron, left, run]
        ilog.add(vh, seq, loc, t.blen_column()[slot], t.due[slot], t.delay[slot],
                 self.sids.prefixes[p], n, k, cx)
        if not self._log_waiting and self._log_store is not None:
            # written right after the group commit that makes the entry durable, before
            # its confirm (flush="async" confirms at once: the index task writes it)
            self._log_waiting = True
            self._log_store.when_durable(self._flush_index_log)

    def _open_index_log(self, q: ScheduledQueue) -> indexlog.IndexLog | None:
        path = q.sidecar_path(checkpoint.FILE_NAME) if q.reads_back else None
        if path is None:
            return None
        snap = self._index.get(path)
        covered = snap.log_gen if snap is not None else checkpoint.covered_log_gen(path)
        self.index_log = indexlog.IndexLog(os.path.dirname(path) or ".", covered + 1)
        store = q.store
        self._log_store = store if store is not None and store.flush != "async" else None
        return self.index_log

    def _flush_index_log(self) -> None:
        self._log_waiting = False
        if self.index_log is not None:
            self.index_log.flush()

    def drop_stored(self, t: SlotTable, slot: int) -> None:
        """Forget the stored copy of a slot (journal location or held entry)."""
        if t.queue.remove_stored(slot):
            self._held_since_freeze -= 1

    def _gc_freeze(self) -> None:
        self._held_since_freeze = 0
        gc.freeze()
        self._frozen = True

    def _gc_maybe_unfreeze(self) -> None:
        if self._frozen and not any(t.live for t in self.tables):
            gc.unfreeze()
            self._frozen = False
            self._held_since_freeze = 0

    # ---- scheduling ----
    def schedule(self, vhost: VirtualHost, message, schedule: Schedule,
                 now: float | None = None) -> views.Item:
        now = self.engine.clock() if now is None else now
        due, left, run = schedule.first(now)
        q = self.internal_queue(vhost)
        t = q.ready
        slot = t.alloc()
        sid = self.sids.assign_new(t, slot)
        t.set_state(slot, schedule, due, left, run)
        if q.store is not None and message.persistent:
            entry = q.write(with_state(message, sid, schedule, due, left, run))
            self.keep_stored(t, slot, entry)
        else:
            t.held[slot] = pack_blob(message)
        self.engine.push(t, slot, due)
        if self.services.audit is not None:
            self.services.audit.scheduled(vhost, message, due)
        self.scheduled += 1
        self.changes += 1
        self.engine.arm()
        return views.Item(self, t, slot, sid)

    def run_due(self, now: float | None = None, limit: int | None = None) -> int:
        return self.engine.run_due(now, limit)

    def _after_batch(self) -> None:
        if self._journal_reads:
            mono = self.timers.now()
            if mono - self._maps_released_at >= RELEASE_MAPS_EVERY:
                self._maps_released_at = mono
                self._journal_reads = 0
                for q in self.queues.values():
                    q.release_read_maps()

    def _fire(self, t: SlotTable, slot: int, due: float, now: float) -> None:
        vhost = self.services.vhosts.get(t.vhost_name)
        q = t.queue
        held = t.held[slot]
        stored_msg = None
        if not isinstance(held, bytes):
            if held is None:
                stored_msg = q.read_stored(slot)
                if stored_msg is not None:
                    self._journal_reads += 1
            else:
                stored_msg = held.message
        if vhost is not None and (stored_msg is not None or isinstance(held, bytes)):
            if stored_msg is None:
                out = blob_delivery(held, t.kind[slot] == K_DELAY, t.delay[slot])
            else:
                out = stored_delivery(stored_msg, t.delivered_as_delayed(slot), t.delay[slot])
            # the publish path past its hooks (the scheduler's own took it when it was
            # published); the trail records it as fired, the targets their enqueues
            audit = self.services.audit
            self.services.publishing.publish(
                Source(vhost, None, "scheduler"), out, hooks=False,
                queues_report=True, on_routed=None if audit is None else
                lambda targets: audit.fired(vhost.name, out, due, targets))
        self.fired += 1
        self.changes += 1
        nxt = None
        if t.kind[slot] == K_COMPLEX:
            sched, left, run = t.cx[slot]
            nxt = sched.following(due, left, run, now)
        if nxt is None:
            self._forget(t, slot)
            self._gc_maybe_unfreeze()
            return
        ndue, nleft, nrun = nxt
        if stored_msg is not None and q.store is not None:
            msg = with_state(stored_msg, self.sid_of(t, slot), sched, ndue, nleft, nrun)
            entry = q.write(msg)  # new occurrence first ...
            self.drop_stored(t, slot)  # ... then forget the fired one
            t.set_state(slot, sched, ndue, nleft, nrun)
            self.keep_stored(t, slot, entry)  # (logs the new state: set first)
        else:
            t.set_state(slot, sched, ndue, nleft, nrun)
        self.engine.push(t, slot, ndue)

    def _forget(self, t: SlotTable, slot: int) -> None:
        """Drop a slot: its stored copy, its id, the slot itself (heap keys go dead)."""
        if not isinstance(t.held[slot], bytes):  # a transient blob has no stored copy
            self.drop_stored(t, slot)
        self.sids.forget(t, slot)
        t.release(slot)

    # ---- management ----
    def list(self, limit: int | None = None) -> list[dict]:
        return views.list_items(self, limit)

    def stats(self) -> dict:
        return views.stats(self)

    def remove(self, sid: str) -> bool:
        found = self.lookup(sid)
        if found is None:
            return False
        t, slot = found
        if self.services.audit is not None:
            self.services.audit.cancelled(t.vhost_name, sid)
        self._forget(t, slot)
        self.removed += 1
        self.changes += 1
        self.engine.maybe_compact(self.pending)
        self._gc_maybe_unfreeze()
        self.engine.arm()
        return True

    def remove_all(self) -> int:
        count = 0
        for t in self.tables:
            for slot in t.live_slots():
                self.drop_stored(t, slot)
                t.release(slot)
                count += 1
        self.sids.clear()
        self.engine.clear()
        self.removed += count
        self.changes += count
        self._gc_maybe_unfreeze()
        self.engine.arm()
        return count

    # ---- recovery ----
    def adopt(self, q: ScheduledQueue, entry: QueueEntry) -> bool:
        """A stored entry handed back to ``q`` by the store's recovery."""
        return recovery.adopt(self, q, entry)

    def restore_paged(self, q: ScheduledQueue, seqs, locs, blens) -> int:
        """A journal's paged index of ``q`` handed back at start-up."""
        return recovery.restore_paged(self, q, seqs, locs, blens)

    def recovered(self) -> int:
        """Recovery hook: the store has handed every stored entry back; arm the timer."""
        self._index.clear()
        return recovery.finish(self)

    # ---- the timer index on disk ----
    def index_path(self) -> str | None:
        """Where the timer index lives (beside the journal), or None for a store
        without a local directory or without read-back (nothing to gain)."""
        for q in self.queues.values():
            if q.reads_back:
                return q.sidecar_path(checkpoint.FILE_NAME)
        store = self.services.store
        if READS_BACK in store.capabilities:
            return store.sidecar_path(checkpoint.FILE_NAME)
        return None

    def recovery_phase(self, name: str, total: int):
        """A phase of the broker's recovery progress."""
        return self.services.recovery.phase(name, total, "messages")

    def merged_index(self, q: ScheduledQueue, ti: checkpoint.TableIndex | None):
        """The snapshot's table of ``q``'s vhost plus the index log's records of it since
        the snapshot; and the id prefixes they use."""
        path = q.sidecar_path(checkpoint.FILE_NAME)
        snap = self._index.get(path)
        prefixes = list(snap.prefixes) if snap is not None else []
        if path is None:
            return ti, prefixes
        key = ("log", path)
        if key not in self._index:
            directory = os.path.dirname(path) or "."
            self._index[key] = indexlog.read(directory, snap.log_gen if snap else 0)
            if self.index_log is None:  # the next snapshot covers what was just read
                self._open_index_log(q)
            self.index_log_records += self._index[key][2]
            self.changes += self._index[key][2]  # not in a snapshot yet: one is due
            # generations the snapshot covers are leftovers of a crash while it was written
            if snap is not None:
                indexlog.drop_upto(directory, snap.log_gen)
        fixed, rows, count = self._index[key]
        if not count:
            return ti, prefixes
        return checkpoint.merge(ti, prefixes, q.ready.vhost_name, fixed, rows), prefixes

    def loaded_index(self, q: ScheduledQueue) -> checkpoint.Snapshot | None:
        """The snapshot on disk beside ``q``'s store, read once per start."""
        path = q.sidecar_path(checkpoint.FILE_NAME)
        if path is None:
            return None
        if path not in self._index:
            self._index[path] = checkpoint.read(path)
        return self._index[path]

    def note_recovery_reads(self, count: int) -> None:
        """Entries read back at start-up are not in the index yet: snapshot soon."""
        self.recovery_reads += count
        self.changes += count

    def index_due(self, now: float, last: float) -> bool:
        """Whether a snapshot is due at ``now`` (monotonic) after one at ``last``."""
        return (now - last >= checkpoint.MIN_INTERVAL and self.changes
                >= max(checkpoint.CHANGES, checkpoint.CHANGES_SHARE * self.pending))

    def take_index(self) -> checkpoint.Snapshot:
        """A snapshot of the journal-paged slots (synchronous, C-level copies); the index
        log moves on to a new generation (the snapshot covers the ones before)."""
        self.changes = 0
        snap = checkpoint.take(self.tables, self.sids.prefixes)
        if self.index_log is not None:
            snap.log_gen = self.index_log.rotate()
        return snap

    def index_written(self, snap: checkpoint.Snapshot) -> None:
        """``snap`` is on disk: the log generations it covers can go."""
        if self.index_log is not None and snap.log_gen:
            self.index_log.drop_upto(snap.log_gen)
