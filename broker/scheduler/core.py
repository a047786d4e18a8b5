"""The broker-wide scheduler: a heap of compact integer keys over pending scheduled messages.

Pending messages live, per vhost, in an internal durable queue
(``amq.triomq.scheduled``). It stays in ``vhost.queues`` so every store
backend treats it as an ordinary durable queue (definitions, checkpoints), but
clients cannot use it: the ``amq.`` prefix forbids declaring it, it is
exclusively owned by the broker (passive declare, bind, consume, get, purge and
delete give 405 RESOURCE_LOCKED), x-max-length 0 + reject-publish refuses
anything routed to it, and its ready store is the scheduler's slot table
(length 0 for the dispatcher). Each stored message carries its own schedule
state in ``x-triomq-*`` headers, so storage needs nothing beyond the ordinary
``Store`` calls (enqueue / remove) and a restart rebuilds the heap from the
recovered entries.

Memory layout (see docs/scheduler.md): per vhost a ``SlotTable`` of parallel
arrays indexed by slot (due, kind, delay, id, journal seq/location/body length)
plus one Python object per slot: None for a journal-paged persistent message
(read back from the journal with mmap only when due), one ``bytes`` blob
(exchange, routing key, raw properties, body) for a transient one, or the
QueueEntry for a persistent one in a store that cannot read messages back (SQL).
The heap holds one int per occurrence: ``due_us << 48 | vhost_index << 32 | slot``.
Ids are found through an array-backed open-addressing hash (``SidMap``).

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
from array import array
from collections.abc import Mapping
from itertools import compress

from ..amqp.fields import decode_properties, encode_properties
from ..message import Message
from ..persistence.paged import PagedFifo
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

FIRE_BATCH = 2000  # occurrences per timer callback before yielding to connections
# Persistent messages held as QueueEntry objects (stores without read-back, i.e. SQL) are
# long-lived GC-tracked objects: every GC_FREEZE_STEP new ones are moved out of the cyclic
# GC's reach (gc.freeze). Compact slots (bytes, arrays, int keys) are not GC-tracked at all.
GC_FREEZE_STEP = 20_000
EARLY_SLACK = 0.001  # arm 1 ms after the head is due: never early, and under load one
# timer wake-up fires every item due in that millisecond (10 per wake-up at 10,000/s)

# slot kinds
FREE, K_DELAY, K_AMQ, K_COMPLEX = 0, 1, 2, 3  # K_COMPLEX: repeat and/or cron (state in .cx)
SLOT_BITS = 32
VH_BITS = 16
KEY_SHIFT = SLOT_BITS + VH_BITS
SLOT_MASK = (1 << SLOT_BITS) - 1
VH_MASK = (1 << VH_BITS) - 1
NAN = float("nan")
_BLOB = struct.Struct(">BBI")  # exchange length, routing key length, raw properties length


class _SystemOwner:
    """Exclusive owner of the internal queues: never a client session."""

    def __repr__(self) -> str:
        return "<triomq scheduler>"


SYSTEM_OWNER = _SystemOwner()


def pack_blob(message) -> bytes:
    """A transient pending message in one bytes object: what routing needs at due time."""
    ex = message.exchange.encode("utf-8", "surrogateescape")
    rk = message.routing_key.encode("utf-8", "surrogateescape")
    raw = message.props_raw
    return b"".join((_BLOB.pack(len(ex), len(rk), len(raw)), ex, rk, raw, message.body))


def unpack_blob(blob: bytes):
    """(exchange, routing key, raw properties, body)."""
    exl, rkl, pl = _BLOB.unpack_from(blob, 0)
    p = _BLOB.size
    ex = blob[p:p + exl].decode("utf-8", "surrogateescape")
    p += exl
    rk = blob[p:p + rkl].decode("utf-8", "surrogateescape")
    p += rkl
    return ex, rk, blob[p:p + pl], blob[p + pl:]


def blob_message(blob: bytes) -> Message:
    ex, rk, raw, body = unpack_blob(blob)
    return Message(ex, rk, raw, decode_properties(raw), body)


class _Const:
    """An 'array' whose every element is the same value (journal compaction reads it)."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __getitem__(self, i):
        return self.value


class SidMap:
    """id -> (vhost index << 32 | slot): open addressing with linear probing over one
    array of values (8 bytes per bucket, load <= 0.7). The id itself is not stored:
    it is (prefix index, number) in the slot table, and the hash is computed from
    that pair, so a probe compares two array items and deletion (backward shift)
    can recompute any entry's home bucket. Value 0 = empty bucket (values are +1)."""
    __slots__ = ("vals", "mask", "n", "ident")

    def __init__(self, ident, capacity: int = 1 << 12):
        self.ident = ident  # value -> (prefix index, number)
        self.vals = array("q", bytes(8 * capacity))
        self.mask = capacity - 1
        self.n = 0

    @staticmethod
    def hkey(p: int, n: int) -> int:
        h = (n * 0x9E3779B97F4A7C15 + p * 0xC2B2AE3D27D4EB4F) & 0xFFFFFFFFFFFFFFFF
        return h ^ (h >> 32)

    def __len__(self) -> int:
        return self.n

    def insert(self, p: int, n: int, value: int) -> None:
        if (self.n + 1) * 10 > (self.mask + 1) * 7:
            self._grow()
        vals = self.vals
        mask = self.mask
        i = self.hkey(p, n) & mask
        while vals[i]:
            i = (i + 1) & mask
        vals[i] = value + 1
        self.n += 1

    def find(self, p: int, n: int) -> int:
        vals, mask, ident = self.vals, self.mask, self.ident
        i = self.hkey(p, n) & mask
        while True:
            v = vals[i]
            if not v:
                return -1
            if ident(v - 1) == (p, n):
                return v - 1
            i = (i + 1) & mask

    def delete(self, p: int, n: int, value: int) -> bool:
        vals, mask, ident = self.vals, self.mask, self.ident
        want = value + 1
        i = self.hkey(p, n) & mask
        while True:
            v = vals[i]
            if not v:
                return False
            if v == want:
                break
            i = (i + 1) & mask
        j = i
        hkey = self.hkey
        while True:  # backward-shift deletion: no tombstones
            j = (j + 1) & mask
            v = vals[j]
            if not v:
                break
            home = hkey(*ident(v - 1)) & mask
            if (i <= j and i < home <= j) or (i > j and (home > i or home <= j)):
                continue
            vals[i] = v
            i = j
        vals[i] = 0
        self.n -= 1
        return True

    def _grow(self) -> None:
        old = self.vals
        cap = (self.mask + 1) * 2
        self.vals = vals = array("q", bytes(8 * cap))
        self.mask = mask = cap - 1
        ident, hkey = self.ident, self.hkey
        for v in old:
            if v:
                i = hkey(*ident(v - 1)) & mask
                while vals[i]:
                    i = (i + 1) & mask
                vals[i] = v

    def clear(self) -> None:
        self.__init__(self.ident)


class SlotTable(PagedFifo):
    """The pending messages of one vhost, and its internal queue's ``ready``.

    For the dispatcher it is empty (length 0, nothing to pop). For the journal it
    looks like a PagedFifo whose whole content is paged: ``_seq``/``_loc``/``_blen``
    describe the journal-paged persistent slots (loc 0 = free or not in the journal),
    so checkpoints and segment compaction handle them like any paged queue (compaction
    updates ``_loc`` in place)."""

    __slots__ = ("vi", "vhost_name", "due", "kind", "delay", "sidp", "sidn", "held", "cx",
                 "free", "live", "n_stored", "scheduler")

    def __init__(self, scheduler, vi: int, vhost_name: str):
        super().__init__(None, None, budget=0)
        self.scheduler = scheduler
        self.vi = vi
        self.vhost_name = vhost_name
        self._exp = _Const(NAN)
        self._flags = _Const(0)
        self.due = array("d")     # wall-clock seconds
        self.kind = array("B")    # FREE / K_DELAY / K_AMQ / K_COMPLEX
        self.delay = array("q")   # ms
        self.sidp = array("H")    # id prefix index (scheduler._prefixes)
        self.sidn = array("q")    # id number (-1: the prefix is the whole id)
        self.held = []            # None (journal) | bytes blob (transient) | QueueEntry
        self.cx: dict = {}        # slot -> (Schedule, left, run) for K_COMPLEX
        self.free = array("I")
        self.live = 0
        self.n_stored = 0         # slots with a journal location

    def alloc(self) -> int:
        if self.free:
            return self.free.pop()
        slot = len(self.kind)
        self.due.append(0.0)
        self.kind.append(FREE)
        self.delay.append(0)
        self.sidp.append(0)
        self.sidn.append(0)
        self.held.append(None)
        self._seq.append(0)
        self._loc.append(0)
        self._blen.append(0)
        return slot

    def release(self, slot: int) -> None:
        self.kind[slot] = FREE
        self.held[slot] = None
        if self._loc[slot]:
            self.n_stored -= 1
        self._loc[slot] = 0
        self._seq[slot] = 0
        self.cx.pop(slot, None)
        self.free.append(slot)
        self.live -= 1

    def live_slots(self):
        kind = self.kind
        return [i for i in range(len(kind)) if kind[i]]

    # ---- the queue's ready store, as the core sees it ----
    def __len__(self) -> int:
        return 0

    def __iter__(self):
        """Stored pending entries (tests, management); materialized from the journal."""
        s = self.scheduler
        for slot in self.live_slots():
            e = s._stored_entry(self, slot)
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


class Item:
    """A handle on one pending message (management and tests); reads the slot live."""
    __slots__ = ("_s", "_t", "_slot", "sid")

    def __init__(self, scheduler, table: SlotTable, slot: int, sid: str):
        self._s = scheduler
        self._t = table
        self._slot = slot
        self.sid = sid

    @property
    def cancelled(self) -> bool:
        t, slot = self._t, self._slot
        return not t.kind[slot] or self._s._sid_of(t, slot) != self.sid

    def _check(self):
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

    @property
    def schedule(self) -> Schedule:
        t, slot = self._check()
        return self._s._state(t, slot)[0]

    @property
    def left(self) -> int:
        t, slot = self._check()
        return self._s._state(t, slot)[1]

    @property
    def run(self) -> float:
        t, slot = self._check()
        return self._s._state(t, slot)[2]

    @property
    def stored(self) -> bool:
        t, slot = self._check()
        return not isinstance(t.held[slot], bytes)

    @property
    def entry(self) -> QueueEntry:
        t, slot = self._check()
        e = self._s._stored_entry(t, slot)
        if e is None:
            e = QueueEntry(blob_message(t.held[slot]), 0)
        return e

    def describe(self) -> dict:
        msg = self.entry.message
        s, left, _run = self._s._state(self._t, self._slot)
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
        found = self._s._lookup(sid)
        if found is None:
            raise KeyError(sid)
        t, slot = found
        return Item(self._s, t, slot, sid)

    def __len__(self) -> int:
        return sum(t.live for t in self._s._tables)

    def __iter__(self):
        s = self._s
        for t in list(s._tables):
            for slot in t.live_slots():
                yield s._sid_of(t, slot)

    def values(self):
        s = self._s
        return [Item(s, t, slot, s._sid_of(t, slot)) for t in list(s._tables) for slot in t.live_slots()]


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


def _release_read_maps(store) -> None:
    # Reading pending messages back (at recovery, or as they fall due over hours) would
    # otherwise keep every journal segment's pages in the process's RSS.
    release = getattr(store, "release_read_maps", None)
    if release is not None:
        release()


RELEASE_MAPS_EVERY = 1.0  # seconds: at most this long's worth of read pages stay mapped


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def _due_us(due: float) -> int:
    return round(due * 1_000_000)


class Scheduler:
    def __init__(self, broker, clock=time.time):
        self.broker = broker
        self.timers = broker.timers
        self.clock = clock
        self.heap: list = []  # int keys: due_us << 48 | vhost index << 32 | slot
        self._tables: list[SlotTable] = []
        self._sids = SidMap(self._ident)
        self._prefixes: list[str] = []
        self._prefix_index: dict[str, int] = {}
        self._seq = itertools.count(1)
        self._sid_prefix = os.urandom(4).hex()
        self._sid_counter = itertools.count(1)
        self._own_prefix = self._prefix_of(self._sid_prefix)
        self.queues: dict[str, Queue] = {}
        self.items = ItemsView(self)
        self._handle = None
        self._armed_for = None
        self.fired = 0
        self.scheduled = 0
        self.removed = 0
        self.max_lateness = 0.0
        self._held_since_freeze = 0
        self._frozen = False
        self._schedules: dict = {}
        self._journal_reads = 0
        self._maps_released_at = 0.0

    # ---- ids ----
    def _prefix_of(self, prefix: str) -> int:
        p = self._prefix_index.get(prefix)
        if p is None:
            p = len(self._prefixes)
            if p > 0xFFFF:
                raise ValueError("too many scheduler id prefixes")
            self._prefixes.append(prefix)
            self._prefix_index[prefix] = p
        return p

    def _split_sid(self, sid: str):
        prefix, sep, num = sid.rpartition("-")
        if sep and num.isdigit() and num.isascii() and str(int(num)) == num and int(num) < 1 << 62:
            return prefix, int(num)
        return sid, -1

    def _sid_of(self, t: SlotTable, slot: int) -> str:
        n = t.sidn[slot]
        prefix = self._prefixes[t.sidp[slot]]
        return prefix if n < 0 else f"{prefix}-{n}"

    def _ident(self, value: int):
        t = self._tables[value >> SLOT_BITS]
        slot = value & SLOT_MASK
        return t.sidp[slot], t.sidn[slot]

    def _lookup(self, sid):
        if not isinstance(sid, str):
            return None
        prefix, n = self._split_sid(sid)
        p = self._prefix_index.get(prefix)
        if p is None:
            return None
        v = self._sids.find(p, n)
        if v < 0:
            return None
        t = self._tables[v >> SLOT_BITS]
        slot = v & SLOT_MASK
        if not t.kind[slot]:
            return None
        return t, slot

    def _set_sid(self, t: SlotTable, slot: int, sid: str) -> None:
        prefix, n = self._split_sid(sid)
        p = self._prefix_of(prefix)
        t.sidp[slot] = p
        t.sidn[slot] = n
        self._sids.insert(p, n, (t.vi << SLOT_BITS) | slot)

    def new_sid(self) -> str:
        return f"{self._sid_prefix}-{next(self._sid_counter)}"

    # ---- storage ----
    def internal_queue(self, vhost) -> Queue:
        q = self.queues.get(vhost.name)
        if q is None:
            q = Queue(vhost, INTERNAL_QUEUE, durable=True, arguments={},
                      opts=parse_queue_arguments({}))
            vhost.add_queue(q)  # attaches the store and saves the definition
            self._lock_down(vhost, q)
        return q

    def _table(self, vhost_name: str) -> SlotTable:
        for t in self._tables:
            if t.vhost_name == vhost_name:
                return t
        vi = len(self._tables)
        if vi > VH_MASK:
            raise ValueError("too many vhosts with scheduled messages")
        t = SlotTable(self, vi, vhost_name)
        self._tables.append(t)
        return t

    def _lock_down(self, vhost, q: Queue) -> None:
        q.exclusive_owner = SYSTEM_OWNER
        q.opts.max_length = 0
        q.opts.overflow = "reject-publish"
        t = q.ready if isinstance(q.ready, SlotTable) else self._table(vhost.name)
        q.ready = t
        q.ready_bytes = 0
        self.queues[vhost.name] = q

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

    def _stored_entry(self, t: SlotTable, slot: int):
        """The stored QueueEntry of a persistent slot (read from the journal), else None."""
        held = t.held[slot]
        if held is None:
            loc = t._loc[slot]
            if not loc:
                return None
            q = self.queues.get(t.vhost_name)
            e = QueueEntry(q.store.read_message(loc), t._seq[slot])
            e.loc = loc
            return e
        if isinstance(held, bytes):
            return None
        return held

    def _store_remove(self, t: SlotTable, slot: int) -> None:
        """Forget the stored copy of a slot (journal location or held entry)."""
        q = self.queues.get(t.vhost_name)
        held = t.held[slot]
        if held is None:
            loc = t._loc[slot]
            if loc and q is not None and q.store is not None:
                e = QueueEntry(None, t._seq[slot])
                e.loc = loc
                q.store.remove(q, e)
        elif not isinstance(held, bytes):
            if q is not None and q.store is not None:
                q.store.remove(q, held)
            self._held_since_freeze -= 1

    def _keep_stored(self, t: SlotTable, slot: int, q: Queue, entry: QueueEntry) -> None:
        """Record where a freshly written persistent occurrence lives."""
        if entry.loc and hasattr(q.store, "read_message"):
            if not t._loc[slot]:
                t.n_stored += 1
            t.held[slot] = None
            t._seq[slot] = entry.seq
            t._loc[slot] = entry.loc
            t._blen[slot] = len(entry.message.body)
        else:
            if t._loc[slot]:
                t.n_stored -= 1
                t._loc[slot] = 0
            t.held[slot] = entry  # a store that cannot read messages back: keep it
            t._seq[slot] = entry.seq
            self._held_since_freeze += 1
            if self._held_since_freeze >= GC_FREEZE_STEP:
                self._gc_freeze()

    def _state(self, t: SlotTable, slot: int):
        """(Schedule, left, run) of a slot."""
        k = t.kind[slot]
        if k == K_COMPLEX:
            return t.cx[slot]
        d = t.delay[slot]
        sched = Schedule("delay" if k == K_DELAY else "amq", delay=d)
        return sched, 1, t.due[slot] - d / 1000.0

    def _set_state(self, t: SlotTable, slot: int, sched: Schedule, due: float, left: int,
                   run: float) -> None:
        t.due[slot] = due
        t.delay[slot] = sched.delay
        if sched.cron or sched.repeat or sched.period:
            t.kind[slot] = K_COMPLEX
            interned = self._schedules.get(sched)  # one object per distinct complex schedule
            if interned is not None:
                sched = interned
            elif len(self._schedules) < 100_000:
                self._schedules[sched] = sched
            t.cx[slot] = (sched, left, run)
        else:
            t.kind[slot] = K_DELAY if sched.kind == "delay" else K_AMQ
            t.cx.pop(slot, None)

    def _push(self, t: SlotTable, slot: int, due: float) -> None:
        heapq.heappush(self.heap, (_due_us(due) << KEY_SHIFT) | (t.vi << SLOT_BITS) | slot)

    def _delivery_message(self, t: SlotTable, slot: int, stored=None):
        """The copy to route now. ``stored``: the stored message, if already read."""
        held = t.held[slot]
        kind = t.kind[slot]
        if isinstance(held, bytes):
            # the published message as it came (no state headers): no re-encoding
            ex, rk, raw, body = unpack_blob(held)
            if kind == K_DELAY:
                delay = t.delay[slot]
                patched = negate_x_delay(raw, delay)
                if patched is not None:
                    return Message(ex, rk, patched, decode_properties(patched), body)
                props = decode_properties(raw)
                headers = dict(props.get("headers") or {})
                headers[X_DELAY] = -delay
                props["headers"] = headers
                return Message(ex, rk, encode_properties(props), props, body)
            return Message(ex, rk, raw, decode_properties(raw), body)
        if stored is None:
            stored = self._stored_entry(t, slot).message
        props = dict(stored.properties)
        headers = dict(props.get("headers") or {})
        for h in STATE_HEADERS:
            headers.pop(h, None)
        if kind == K_DELAY or (kind == K_COMPLEX and t.cx[slot][0].kind == "delay"):
            # as the plugin does: the delivered message says it was delayed by -x-delay
            headers[X_DELAY] = -t.delay[slot]
        props["headers"] = headers
        return stored.with_changes(properties=props)

    # ---- scheduling ----
    def schedule(self, vhost, message, schedule: Schedule, now: float | None = None) -> Item:
        now = self.clock() if now is None else now
        due, left, run = schedule.first(now)
        sid = self.new_sid()
        q = self.internal_queue(vhost)
        t = q.ready
        slot = t.alloc()
        t.live += 1
        n = int(sid.rpartition("-")[2])
        t.sidp[slot] = self._own_prefix
        t.sidn[slot] = n
        self._sids.insert(self._own_prefix, n, (t.vi << SLOT_BITS) | slot)
        self._set_state(t, slot, schedule, due, left, run)
        if q.store is not None and message.persistent:
            stored = self._stored_message(message, sid, schedule, due, left, run)
            entry = QueueEntry(stored, next(self._seq))
            q.store.enqueue(q, entry)
            self._keep_stored(t, slot, q, entry)
        else:
            t.held[slot] = pack_blob(message)
        self._push(t, slot, due)
        self.scheduled += 1
        self._arm()
        return Item(self, t, slot, sid)

    def _gc_freeze(self) -> None:
        self._held_since_freeze = 0
        gc.freeze()
        self._frozen = True

    def _gc_maybe_unfreeze(self) -> None:
        if self._frozen and not any(t.live for t in self._tables):
            gc.unfreeze()
            self._frozen = False
            self._held_since_freeze = 0

    def _head(self):
        """The first live heap key (dropping dead ones), or None."""
        heap = self.heap
        tables = self._tables
        while heap:
            k = heap[0]
            t = tables[(k >> SLOT_BITS) & VH_MASK]
            slot = k & SLOT_MASK
            if t.kind[slot] and _due_us(t.due[slot]) == k >> KEY_SHIFT:
                return k
            heapq.heappop(heap)
        return None

    def _head_due(self):
        k = self._head()
        if k is None:
            return None
        return self._tables[(k >> SLOT_BITS) & VH_MASK].due[k & SLOT_MASK]

    def _arm(self) -> None:
        due = self._head_due()
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
        if self._journal_reads:
            mono = self.timers.now()
            if mono - self._maps_released_at >= RELEASE_MAPS_EVERY:
                self._maps_released_at = mono
                self._journal_reads = 0
                for q in self.queues.values():
                    _release_read_maps(q.store)
        due = self._head_due()
        if due is not None and due <= self.clock():
            # more due than one batch: continue right after other timers / connections
            self._armed_for = due
            self._handle = self.timers.call_at(self.timers.now(), self._on_timer)
        else:
            self._arm()

    def run_due(self, now: float | None = None, limit: int = FIRE_BATCH) -> int:
        now = self.clock() if now is None else now
        now_us = _due_us(now) + 1
        heap = self.heap
        tables = self._tables
        fired = 0
        while heap and fired < limit:
            k = heap[0]
            if k >> KEY_SHIFT > now_us:
                break
            t = tables[(k >> SLOT_BITS) & VH_MASK]
            slot = k & SLOT_MASK
            due = t.due[slot]
            if not t.kind[slot] or _due_us(due) != k >> KEY_SHIFT:
                heapq.heappop(heap)  # removed or rescheduled: a dead key
                continue
            if due > now:
                break  # due within the next microsecond: never early
            heapq.heappop(heap)
            late = now - due
            if late > self.max_lateness:
                self.max_lateness = late
            self._fire(t, slot, due, now)
            fired += 1
        return fired

    def _fire(self, t: SlotTable, slot: int, due: float, now: float) -> None:
        vhost = self.broker.vhosts.get(t.vhost_name)
        q = self.queues.get(t.vhost_name)
        held = t.held[slot]
        stored_msg = None
        if not isinstance(held, bytes):
            if held is None:
                q_store = q.store if q is not None else None
                if q_store is not None and t._loc[slot]:
                    stored_msg = q_store.read_message(t._loc[slot])
                    self._journal_reads += 1
            else:
                stored_msg = held.message
        if vhost is not None and (stored_msg is not None or isinstance(held, bytes)):
            out = self._delivery_message(t, slot, stored_msg)
            for target in vhost.route(out.exchange, out.routing_key, out):
                target.enqueue(out)
        self.fired += 1
        kind = t.kind[slot]
        nxt = None
        if kind == K_COMPLEX:
            sched, left, run = t.cx[slot]
            nxt = sched.following(due, left, run, now)
        if nxt is None:
            self._forget(t, slot)
            self._gc_maybe_unfreeze()
            return
        ndue, nleft, nrun = nxt
        if not isinstance(held, bytes) and q is not None and q.store is not None \
                and stored_msg is not None:
            sid = self._sid_of(t, slot)
            msg = self._stored_message(stored_msg, sid, sched, ndue, nleft, nrun)
            entry = QueueEntry(msg, next(self._seq))
            q.store.enqueue(q, entry)  # new occurrence first ...
            self._store_remove(t, slot)  # ... then forget the fired one
            self._keep_stored(t, slot, q, entry)
        self._set_state(t, slot, sched, ndue, nleft, nrun)
        self._push(t, slot, ndue)

    def _forget(self, t: SlotTable, slot: int) -> None:
        """Drop a slot: its stored copy, its id, the slot itself (heap keys go dead)."""
        self._store_remove(t, slot)
        self._sids.delete(t.sidp[slot], t.sidn[slot], (t.vi << SLOT_BITS) | slot)
        t.release(slot)

    # ---- management ----
    def _all_keys(self):
        for t in self._tables:
            due = t.due
            for slot in t.live_slots():
                yield (due[slot], t, slot)

    def list(self, limit: int | None = None) -> list[dict]:
        keyed = ((due, t.vi, slot, t) for due, t, slot in self._all_keys())
        if limit is not None:
            chosen = heapq.nsmallest(limit, keyed, key=lambda x: (x[0], x[1], x[2]))
        else:
            chosen = sorted(keyed, key=lambda x: (x[0], x[1], x[2]))
        return [Item(self, t, slot, self._sid_of(t, slot)).describe() for _d, _v, slot, t in chosen]

    def remove(self, sid: str) -> bool:
        found = self._lookup(sid)
        if found is None:
            return False
        t, slot = found
        self._forget(t, slot)
        self.removed += 1
        live = sum(x.live for x in self._tables)
        if len(self.heap) > 1024 and len(self.heap) > 2 * live:
            self._compact()
        self._gc_maybe_unfreeze()
        self._arm()
        return True

    def remove_all(self) -> int:
        count = 0
        for t in self._tables:
            for slot in t.live_slots():
                self._store_remove(t, slot)
                t.release(slot)
                count += 1
        self._sids.clear()
        self.heap.clear()
        self.removed += count
        self._gc_maybe_unfreeze()
        self._arm()
        return count

    def _compact(self) -> None:
        tables = self._tables
        keep = []
        for k in self.heap:
            t = tables[(k >> SLOT_BITS) & VH_MASK]
            slot = k & SLOT_MASK
            if t.kind[slot] and _due_us(t.due[slot]) == k >> KEY_SHIFT:
                keep.append(k)
        heapq.heapify(keep)
        self.heap = keep

    def stats(self) -> dict:
        by_kind: dict = {}
        for t in self._tables:
            n = t.kind.count(K_DELAY)
            a = t.kind.count(K_AMQ)
            for sched, _l, _r in t.cx.values():
                if sched.kind == "delay":
                    n += 1
                else:
                    a += 1
            if n:
                by_kind["delay"] = by_kind.get("delay", 0) + n
            if a:
                by_kind["amq"] = by_kind.get("amq", 0) + a
        return {"pending": sum(t.live for t in self._tables), "pending_by_kind": by_kind,
                "next_due": self._head_due(),
                "scheduled_total": self.scheduled, "fired_total": self.fired,
                "removed_total": self.removed, "max_lateness_ms": round(self.max_lateness * 1000, 3)}

    # ---- recovery ----
    def recovered(self) -> int:
        """Adopt the internal queues the store recovered and rebuild the heap.

        Journal: the internal queue comes back paged (index only); each message is read
        once to learn its schedule state and then dropped from memory again."""
        restored = 0
        max_seq = 0
        for vhost in self.broker.vhosts.values():
            q = vhost.queues.get(INTERNAL_QUEUE)
            if q is None:
                continue
            ready = q.ready
            if isinstance(ready, SlotTable):
                continue
            self._lock_down(vhost, q)
            t = q.ready
            if isinstance(ready, PagedFifo):
                for entry in ready.head_entries():
                    max_seq = max(max_seq, entry.seq)
                    restored += self._restore(t, q, entry)
                seqs, locs = ready._seq, ready._loc
                pinned = ready._pinned
                for i in range(ready._pi, len(seqs)):
                    seq, loc = seqs[i], locs[i]
                    max_seq = max(max_seq, seq)
                    if loc:
                        entry = QueueEntry(q.store.read_message(loc), seq)
                        entry.loc = loc
                    else:
                        entry = pinned.pop(seq)
                    restored += self._restore(t, q, entry)
                    del entry
            else:
                for entry in ready.clear():
                    max_seq = max(max_seq, entry.seq)
                    restored += self._restore(t, q, entry)
        if max_seq:
            self._seq = itertools.count(max_seq + 1)
        for q in self.queues.values():
            _release_read_maps(q.store)
        self._arm()
        if restored:
            log.info("scheduler: recovered %d pending scheduled messages", restored)
        return restored

    def _restore(self, t: SlotTable, q: Queue, entry: QueueEntry) -> int:
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
            return 0
        found = self._lookup(sid)
        if found is not None:
            # crash between "write next occurrence" and "remove fired one": keep the newer
            ot, oslot = found
            if ot._seq[oslot] > entry.seq:
                if q.store is not None:
                    q.store.remove(q, entry)
                return 0
            self._store_remove(ot, oslot)
            slot = oslot
            t = ot
        else:
            slot = t.alloc()
            t.live += 1
            self._set_sid(t, slot, sid)
        self._set_state(t, slot, schedule, due, left, run)
        self._keep_stored(t, slot, q, entry)
        self._push(t, slot, due)
        return 0 if found is not None else 1
