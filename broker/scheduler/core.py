"""The broker-wide scheduler: a heap of (due, id) over pending scheduled messages.

Pending messages live, per vhost, in an internal durable queue
(``amq.triomq.scheduled``). It stays in ``vhost.queues`` so every store
backend treats it as an ordinary durable queue (definitions, checkpoints), but
clients cannot use it: the ``amq.`` prefix forbids declaring it, it is
exclusively owned by the broker (passive declare, bind, consume, get, purge and
delete give 405 RESOURCE_LOCKED), x-max-length 0 + reject-publish refuses
anything routed to it, and its ready store is a read-only view over the
scheduler's items (length 0 for the dispatcher). Each stored message carries
its own schedule state in ``x-triomq-*`` headers, so storage needs nothing
beyond the ordinary ``Store`` calls (enqueue / remove) and a restart rebuilds
the heap from the recovered entries.

Firing an occurrence: route a copy through the original exchange (no hooks,
no mandatory), then either remove the stored entry (done) or write the next
occurrence *before* removing the old one -- at-least-once across a crash.
One broker timer is armed at the heap's head; nothing ever scans all items.
"""
from __future__ import annotations

import gc
import heapq
import itertools
import logging
import os
import struct
import time

from ..message import Message
from ..queues.args import parse_queue_arguments
from ..queues.entry import QueueEntry
from ..queues.queue import Queue
from .spec import X_DELAY, Schedule

log = logging.getLogger("broker.scheduler")

INTERNAL_QUEUE = "amq.triomq.scheduled"
H_SID = "x-triomq-sid"
H_KIND = "x-triomq-kind"
H_DUE = "x-triomq-due"
H_LEFT = "x-triomq-left"
H_RUN = "x-triomq-run"
H_DELAY = "x-triomq-delay"
H_PERIOD = "x-triomq-period"
H_REPEAT = "x-triomq-repeat"
H_CRON = "x-triomq-cron"
STATE_HEADERS = (H_SID, H_KIND, H_DUE, H_LEFT, H_RUN, H_DELAY, H_PERIOD, H_REPEAT, H_CRON)

FIRE_BATCH = 2000
# Pending items are long-lived, acyclic objects (freed by reference counting): every
# GC_FREEZE_STEP new ones are moved out of the cyclic GC's reach (gc.freeze), so a full
# collection never has to traverse a million pending messages (a multi-100-ms pause
# that would make them late). Unfrozen again when nothing is pending.
GC_FREEZE_STEP = 20_000  # occurrences per timer callback before yielding to connections
EARLY_SLACK = 0.001  # arm 1 ms after the head is due: never early, and under load one
# timer wake-up fires every item due in that millisecond (10 per wake-up at 10,000/s)


class _SystemOwner:
    """Exclusive owner of the internal queues: never a client session."""

    def __repr__(self) -> str:
        return "<triomq scheduler>"


SYSTEM_OWNER = _SystemOwner()


class ScheduledView:
    """The internal queue's ``ready``: empty for the dispatcher, iterable for the
    stores' checkpoints (every pending entry of the vhost)."""

    def __init__(self, scheduler, vhost_name: str):
        self._scheduler = scheduler
        self._vhost = vhost_name

    def __len__(self) -> int:
        return 0

    def __iter__(self):
        vhost = self._vhost
        return iter([i.entry for i in self._scheduler.items.values() if i.stored and i.vhost == vhost])

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


class Item:
    __slots__ = ("sid", "vhost", "entry", "due", "left", "run", "schedule", "cancelled", "stored")

    def __init__(self, sid, vhost, entry, due, left, run, schedule, stored=True):
        self.stored = stored  # entry.message carries x-triomq-* state (it is in a store)
        self.sid = sid
        self.vhost = vhost
        self.entry = entry
        self.due = due
        self.left = left
        self.run = run
        self.schedule = schedule
        self.cancelled = False

    def describe(self) -> dict:
        msg = self.entry.message
        s = self.schedule
        return {"id": self.sid, "vhost": self.vhost, "exchange": msg.exchange,
                "routing_key": msg.routing_key, "due": self.due, "kind": s.kind,
                "delay": s.delay, "period": s.period, "repeat": s.repeat, "cron": s.cron,
                "remaining_in_run": self.left, "persistent": msg.persistent,
                "size": len(msg.body)}


_SIGNED = {ord("b"): struct.Struct(">b"), ord("s"): struct.Struct(">h"),
           ord("I"): struct.Struct(">i"), ord("l"): struct.Struct(">q")}
_X_DELAY_KEY = bytes((len(X_DELAY),)) + X_DELAY.encode()


def negate_x_delay(raw: bytes, delay: int):
    """props_raw with the x-delay header value replaced by -delay, patched in place
    (same width), or None when the encoding is not a plain signed integer."""
    at = raw.find(_X_DELAY_KEY)
    if at < 0:
        return None
    tag_at = at + len(_X_DELAY_KEY)
    if tag_at >= len(raw):
        return None
    packer = _SIGNED.get(raw[tag_at])
    if packer is None:
        return None
    try:
        value = packer.pack(-delay)
    except struct.error:
        return None
    return raw[:tag_at + 1] + value + raw[tag_at + 1 + packer.size:]


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


class Scheduler:
    def __init__(self, broker, clock=time.time):
        self.broker = broker
        self.timers = broker.timers
        self.clock = clock
        self.items: dict[str, Item] = {}
        self.heap: list = []
        self._tie = itertools.count()
        self._seq = itertools.count(1)
        self._sid_prefix = os.urandom(4).hex()
        self._sid_counter = itertools.count(1)
        self.queues: dict[str, Queue] = {}
        self._handle = None
        self._armed_for = None
        self.fired = 0
        self.scheduled = 0
        self.removed = 0
        self.max_lateness = 0.0
        self._since_freeze = 0
        self._frozen = False
        self._schedules: dict = {}

    # ---- storage ----
    def internal_queue(self, vhost) -> Queue:
        q = self.queues.get(vhost.name)
        if q is None:
            q = Queue(vhost, INTERNAL_QUEUE, durable=True, arguments={},
                      opts=parse_queue_arguments({}))
            vhost.add_queue(q)  # attaches the store and saves the definition
            self._lock_down(vhost, q)
        return q

    def _lock_down(self, vhost, q: Queue) -> None:
        q.exclusive_owner = SYSTEM_OWNER
        q.opts.max_length = 0
        q.opts.overflow = "reject-publish"
        q.ready = ScheduledView(self, vhost.name)
        q.ready_bytes = 0
        self.queues[vhost.name] = q

    def _store_enqueue(self, q: Queue, entry: QueueEntry) -> None:  # stored items only
        if q.store is not None and entry.message.persistent:
            q.store.enqueue(q, entry)

    def _store_remove(self, q: Queue, entry: QueueEntry) -> None:
        if q.store is not None and entry.message.persistent:
            q.store.remove(q, entry)

    def _stored_message(self, message, sid: str, sched: Schedule, due: float, left: int,
                        run: float):
        props = dict(message.properties)
        headers = dict(props.get("headers") or {})
        headers[H_SID] = sid.encode()
        headers[H_KIND] = sched.kind.encode()
        headers[H_DELAY] = sched.delay
        headers[H_PERIOD] = sched.period
        headers[H_REPEAT] = sched.repeat
        if sched.cron:
            headers[H_CRON] = sched.cron.encode()
        headers[H_DUE] = int(round(due * 1000))
        headers[H_LEFT] = left
        headers[H_RUN] = int(round(run * 1000))
        props["headers"] = headers
        return message.with_changes(properties=props)

    def _delivery_message(self, item: Item):
        stored = item.entry.message
        if not item.stored:
            # the published message as it came (no state headers): no re-encoding
            raw, props = stored.props_raw, stored.properties
            if item.schedule.kind == "delay":
                patched = negate_x_delay(raw, item.schedule.delay)
                if patched is not None:
                    props = dict(props)
                    headers = dict(props.get("headers") or {})
                    headers[X_DELAY] = -item.schedule.delay
                    props["headers"] = headers
                    return Message(stored.exchange, stored.routing_key, patched, props, stored.body)
            else:
                return Message(stored.exchange, stored.routing_key, raw, props, stored.body)
        props = dict(stored.properties)
        headers = dict(props.get("headers") or {})
        for h in STATE_HEADERS:
            headers.pop(h, None)
        if item.schedule.kind == "delay":
            # as the plugin does: the delivered message says it was delayed by -x-delay
            headers[X_DELAY] = -item.schedule.delay
        props["headers"] = headers
        return stored.with_changes(properties=props)

    # ---- scheduling ----
    def new_sid(self) -> str:
        return f"{self._sid_prefix}-{next(self._sid_counter)}"

    def schedule(self, vhost, message, schedule: Schedule, now: float | None = None) -> Item:
        now = self.clock() if now is None else now
        interned = self._schedules.get(schedule)  # one object per distinct schedule
        if interned is not None:
            schedule = interned
        elif len(self._schedules) < 100_000:
            self._schedules[schedule] = schedule
        due, left, run = schedule.first(now)
        sid = self.new_sid()
        q = self.internal_queue(vhost)
        persisted = q.store is not None and message.persistent
        if persisted:
            message = self._stored_message(message, sid, schedule, due, left, run)
        entry = QueueEntry(message, next(self._seq))
        if persisted:
            q.store.enqueue(q, entry)
        item = Item(sid, vhost.name, entry, due, left, run, schedule, persisted)
        self.items[sid] = item
        heapq.heappush(self.heap, (due, next(self._tie), item))
        self.scheduled += 1
        self._since_freeze += 1
        if self._since_freeze >= GC_FREEZE_STEP:
            self._gc_freeze()
        self._arm()
        return item

    def _gc_freeze(self) -> None:
        self._since_freeze = 0
        if len(self.items) >= GC_FREEZE_STEP:
            gc.freeze()
            self._frozen = True

    def _gc_maybe_unfreeze(self) -> None:
        if self._frozen and not self.items:
            gc.unfreeze()
            self._frozen = False

    def _arm(self) -> None:
        heap = self.heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        if not heap:
            if self._handle is not None:
                self._handle.cancel()
                self._handle = None
                self._armed_for = None
            return
        due = heap[0][0]
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
        if self.heap and self.heap[0][0] <= self.clock():
            # more due than one batch: continue right after other timers / connections
            self._armed_for = self.heap[0][0]
            self._handle = self.timers.call_at(self.timers.now(), self._on_timer)
        else:
            self._arm()

    def run_due(self, now: float | None = None, limit: int = FIRE_BATCH) -> int:
        now = self.clock() if now is None else now
        heap = self.heap
        fired = 0
        while heap and heap[0][0] <= now and fired < limit:
            due, _, item = heapq.heappop(heap)
            if item.cancelled or item.due != due:
                continue
            late = now - due
            if late > self.max_lateness:
                self.max_lateness = late
            self._fire(item, now)
            fired += 1
        return fired

    def _fire(self, item: Item, now: float) -> None:
        vhost = self.broker.vhosts.get(item.vhost)
        q = self.queues.get(item.vhost)
        old = item.entry
        if vhost is not None:
            out = self._delivery_message(item)
            for target in vhost.route(out.exchange, out.routing_key, out):
                target.enqueue(out)
        self.fired += 1
        nxt = item.schedule.following(item.due, item.left, item.run, now)
        if nxt is None:
            self.items.pop(item.sid, None)
            item.cancelled = True
            if not self.items:
                self._gc_maybe_unfreeze()
            if q is not None and item.stored:
                self._store_remove(q, old)
            return
        due, left, run = nxt
        if item.stored and q is not None:
            stored = self._stored_message(old.message, item.sid, item.schedule, due, left, run)
            entry = QueueEntry(stored, next(self._seq))
            self._store_enqueue(q, entry)  # new occurrence first ...
            self._store_remove(q, old)  # ... then forget the fired one
            item.entry = entry
        item.due, item.left, item.run = due, left, run
        heapq.heappush(self.heap, (due, next(self._tie), item))

    # ---- management ----
    def list(self, limit: int | None = None) -> list[dict]:
        items = sorted(self.items.values(), key=lambda i: i.due)
        if limit is not None:
            items = items[:limit]
        return [i.describe() for i in items]

    def remove(self, sid: str) -> bool:
        item = self.items.pop(sid, None)
        if item is None:
            return False
        item.cancelled = True
        q = self.queues.get(item.vhost)
        if q is not None and item.stored:
            self._store_remove(q, item.entry)
        self.removed += 1
        if len(self.heap) > 1024 and len(self.heap) > 2 * len(self.items):
            self._compact()
        self._arm()
        return True

    def remove_all(self) -> int:
        count = 0
        for sid in list(self.items):
            item = self.items.pop(sid)
            item.cancelled = True
            q = self.queues.get(item.vhost)
            if q is not None and item.stored:
                self._store_remove(q, item.entry)
            count += 1
        self.heap.clear()
        self.removed += count
        self._gc_maybe_unfreeze()
        self._arm()
        return count

    def _compact(self) -> None:
        self.heap = [t for t in self.heap if not t[2].cancelled and t[2].due == t[0]]
        heapq.heapify(self.heap)

    def stats(self) -> dict:
        by_kind: dict = {}
        for item in self.items.values():
            by_kind[item.schedule.kind] = by_kind.get(item.schedule.kind, 0) + 1
        nxt = None
        for due, _, item in self.heap[:1]:
            nxt = due
        return {"pending": len(self.items), "pending_by_kind": by_kind, "next_due": nxt,
                "scheduled_total": self.scheduled, "fired_total": self.fired,
                "removed_total": self.removed, "max_lateness_ms": round(self.max_lateness * 1000, 3)}

    # ---- recovery ----
    def recovered(self) -> int:
        """Adopt the internal queues the store recovered and rebuild the heap."""
        restored = 0
        max_seq = 0
        for vhost in self.broker.vhosts.values():
            q = vhost.queues.get(INTERNAL_QUEUE)
            if q is None:
                continue
            entries = q.ready.clear()
            self._lock_down(vhost, q)
            for entry in entries:
                max_seq = max(max_seq, entry.seq)
                if self._restore(vhost, q, entry):
                    restored += 1
        if max_seq:
            self._seq = itertools.count(max_seq + 1)
        if len(self.items) >= GC_FREEZE_STEP:
            self._gc_freeze()
        self._arm()
        if restored:
            log.info("scheduler: recovered %d pending scheduled messages", restored)
        return restored

    def _restore(self, vhost, q: Queue, entry: QueueEntry) -> bool:
        headers = entry.message.headers
        try:
            sid = _text(headers[H_SID])
            kind = _text(headers[H_KIND])
            due = int(headers[H_DUE]) / 1000.0
            left = int(headers[H_LEFT])
            run = int(headers[H_RUN]) / 1000.0
            if kind not in ("delay", "amq"):
                raise ValueError(f"unknown kind {kind!r}")
            cron = _text(headers[H_CRON]) if H_CRON in headers else None
            schedule = Schedule(kind, delay=int(headers[H_DELAY]), period=int(headers[H_PERIOD]),
                                repeat=int(headers[H_REPEAT]), cron=cron)
        except (KeyError, ValueError, TypeError) as exc:
            log.warning("scheduler: dropping unreadable stored entry %s (%s)", entry.seq, exc)
            q.store is not None and q.store.remove(q, entry)
            return False
        existing = self.items.get(sid)
        if existing is not None:
            # crash between "write next occurrence" and "remove fired one": keep the newer
            if existing.entry.seq > entry.seq:
                self._store_remove(q, entry)
                return False
            existing.cancelled = True
            self._store_remove(q, existing.entry)
        item = Item(sid, vhost.name, entry, due, left, run, schedule)
        self.items[sid] = item
        heapq.heappush(self.heap, (due, next(self._tie), item))
        return existing is None
