"""The embedded default store: an append-only journal of CRC-checked records.

See docs/durability.md. In short:

* ``data/journal/NNNNNNNN.log`` segments (32 MiB, preallocated) hold records
  (journal_format). The core's calls (enqueue/delivered/remove/save_*) only
  append to an in-memory buffer and return.
* ``run()`` writes the buffer with pwrite and one fdatasync in a worker thread
  (group commit) and then runs the ``when_durable`` callbacks of everything the
  write covered. flush="async" writes every 100 ms and confirms at once.
* A checkpoint (definitions + live entries of every durable queue + the log
  position) is written every ``checkpoint_bytes`` or ``checkpoint_records`` of log
  (whichever comes first) and at shutdown; recovery
  loads it and replays only the records after it. Segments before the
  checkpoint whose messages are all gone are deleted.
* Durable FIFO queues use ``paged.PagedFifo`` (priority queues ``paged.PagedPriority``,
  one per level): beyond a memory budget only a
  compact index stays in memory; bodies are read back from the segments (mmap).
* The store observes its queues' operation stream (``queue_op``). Its own
  bookkeeping: the journal id of each queue (``_qids``) and the stored entries
  that are delivered but not settled (``_out``: unacked, or waiting for a retry),
  which checkpoints and compaction need besides the queues' ``stored_entries()``.
* A failed write: ``broker.on_store_failure``; its confirms are in doubt (they wait),
  new publishes are nacked and never written (entries enqueued while failing are held
  unrecorded until their publish is decided), the write is retried every second (see
  ``base.Store``). The unwritten buffer is bounded (``max_unwritten``: a resource alarm).
* Compaction rewrites an old segment only if at least ``compact_dead_fraction`` of it
  is dead, and only if the disk has room for it.
* Deliveries left unacked keep their message by location only (``StoredMessage``);
  the heap their bodies leave is handed back to the system (``malloc_trim``).
"""
from __future__ import annotations

import errno
import fcntl
import importlib
import json
import logging
import mmap
import os
import time
from array import array
from collections import Counter
from collections.abc import Callable
from functools import partial
from operator import itemgetter
from typing import TYPE_CHECKING, Any, ClassVar

import trio

from ..config import JournalSettings
from ..message import Message
from ..queues.entry import QueueEntry
from ..queues.ops import Op
from ..queues.priority import message_priority
from ..queues.retry import restore_delivery_count
from . import journal_format as jf
from .base import (
    BLOCKS_ON_FAILURE,
    DURABLE,
    PAGES_MESSAGES,
    READS_BACK,
    FlushStats,
    Store,
    StoreUnavailable,
)
from .paged import PagedFifo, PagedPriority
from .records import (
    _MSG_HEAD,
    binding_def,
    decode_message,
    encode_message,
    exchange_def,
    queue_def,
)

if TYPE_CHECKING:
    from ..recovery_progress import RecoveryProgress

log = logging.getLogger("broker.journal")

ASYNC_INTERVAL = 0.1  # seconds between fsyncs with flush="async"
NAN = float("nan")
_ENQUEUE, _DELIVER, _REQUEUE = Op.ENQUEUE, Op.DELIVER, Op.REQUEUE
_T_ENQ, _T_ENQ_REF, _T_REMOVE = jf.T_ENQ, jf.T_ENQ_REF, jf.T_REMOVE
# The smallest T_ENQ record of a body (empty exchange, routing key and properties): what a
# live entry is counted for in a segment's live bytes (a lower bound of what moving it writes)
ENQ_MIN = jf.HDR_SIZE + jf.ENQ.size + _MSG_HEAD.size + 2
DELIVERED_MAX = jf.HDR_SIZE + jf.DELIVERED_N.size  # one T_DELIVERED record at most


UNACKED_PAGE_AFTER = 1.0  # seconds a delivery stays unacked before its message is paged out
# Bodies paged out of unacked deliveries are freed in the middle of the C heap, between
# records that stay, so glibc keeps their pages (about 600 B per 1 KiB delivery) until
# malloc_trim hands free pages back; done once this much was released, off the hot path.
TRIM_AFTER = 8 << 20
# A trim walks the whole heap (0.3 ms for 200 MB freed, 50-65 ms for a 1.6 GB heap here,
# freed or not), holding the main arena's lock: it runs in a worker thread, and the next
# waits this many times as long as the last took (at most 1% of the time).
TRIM_SPACING = 100


def _malloc_trim() -> Callable[[], None] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none (musl, macOS)."""
    try:
        import ctypes
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]

    def release() -> None:
        trim(0)
    return release


# Body lengths above 256 are int objects of their own (28 B each, a twentieth of what a
# paged-out delivery still costs): StoredMessages share one per length, for this many
# distinct lengths (messages of one application mostly have a few).
SHARED_LENGTHS = 4096
_lengths: dict[int, int] = {}


def _shared_length(n: int) -> int:
    got = _lengths.get(n)
    if got is not None:
        return got
    if len(_lengths) < SHARED_LENGTHS:
        _lengths[n] = n
    return n


# Message's slot descriptors, which StoredMessage's properties shadow
_SLOTS: dict[str, Any] = {name: Message.__dict__[name] for name in ("body", "properties", "props_raw")}


class StoredMessage(Message):
    """The message of a delivery left unacknowledged, kept by its journal location only.

    Body, properties and raw properties are read back from the journal on first use (a
    requeue, a dead letter) and kept from then on; id, exchange, routing key and
    persistence stay in memory, so an ack reads nothing. A consumer holding many
    deliveries then costs about what a paged queue entry does, not its payload.

    Each store makes its own subclass (``for_store``) holding the store as a class
    attribute: a slot less per delivery puts the object in a smaller allocator class
    (112 B instead of 128).
    """

    __slots__ = ("_blen", "_loc")
    _blen: int
    _loc: int
    _store: JournalStore

    @classmethod
    def for_store(cls, store: JournalStore) -> type[StoredMessage]:
        return type(cls.__name__, (cls,), {"__slots__": (), "_store": store})

    @classmethod
    def of(cls, message: Message, loc: int) -> StoredMessage:
        m = object.__new__(cls)
        m.id = message.id
        m.exchange = message.exchange
        m.routing_key = message.routing_key
        m.persistent = message.persistent
        m._blen = _shared_length(len(message.body))
        m._loc = loc
        return m

    @property
    def size(self) -> int:
        return self._blen

    def _slot(self, name: str):
        slot = _SLOTS[name]
        try:
            return slot.__get__(self)
        except AttributeError:  # not read back yet
            real = self._store.read_message(self._loc)
            for n, d in _SLOTS.items():
                d.__set__(self, getattr(real, n))
            return slot.__get__(self)


def _lazy(name: str) -> property:
    def get(self: StoredMessage) -> Any:
        return self._slot(name)
    return property(get)


for _name in _SLOTS:  # (set here: a property over a slot of the base class)
    setattr(StoredMessage, _name, _lazy(_name))


def _body_len(entry) -> int:
    msg = entry.message
    return msg._blen if isinstance(msg, StoredMessage) else len(msg.body)


def _columns(queue=None) -> list:
    """Empty (seqs, locs, exps, blens, flags) arrays of a checkpoint queue record, plus
    the priorities (T_CKPT_PRIO) for a priority queue."""
    cols = [array("q"), array("q"), array("d"), array("I"), array("B")]
    if queue is not None and queue.opts.max_priority:
        cols.append(array("B"))
    return cols


def _count_live(live: dict, live_bytes: dict, locs, blens) -> None:
    """Add the live entries at ``locs`` (bodies of ``blens`` bytes) to the per-segment
    counts ``live`` and live-byte lower bounds ``live_bytes``."""
    if len(locs) > 100_000:  # recovery of a long queue: vector operations
        import numpy as np
        at = np.frombuffer(locs, np.int64)
        sizes = np.frombuffer(blens, np.uint32)
        if bool(np.all(at[1:] >= at[:-1])):
            # written in order (a FIFO's backlog): each segment's run found by a binary
            # search, summed slice by slice (reduceat with a widening dtype takes ~0.1 s
            # per million entries; no shifted copy of the locations either)
            first, last = int(at[0]) >> 32, int(at[-1]) >> 32
            ends = np.searchsorted(at, np.arange(first + 1, last + 2, dtype=np.int64) << 32)
            start = 0
            for seg, end in zip(range(first, last + 1), ends.tolist(), strict=True):
                if end > start:
                    n = end - start
                    b = int(sizes[start:end].sum(dtype=np.int64))
                    live[seg] = live.get(seg, 0) + n
                    live_bytes[seg] = live_bytes.get(seg, 0) + b + n * ENQ_MIN
                start = end
            return
        bins = at >> 32
        if bool(np.all(bins[1:] >= bins[:-1])):
            # a FIFO written in order: its segments are runs, summed between boundaries
            starts = np.concatenate(([0], np.flatnonzero(bins[1:] != bins[:-1]) + 1))
            segs = bins[starts].tolist()
            counts = np.diff(np.append(starts, len(bins))).tolist()
            nbytes = np.add.reduceat(sizes, starts, dtype=np.int64).tolist()
        else:
            first = int(bins.min())
            # segment numbers are few and close together: count by bins
            by_bin = np.bincount(bins - first)
            at = np.flatnonzero(by_bin)
            segs = (at + first).tolist()
            counts = by_bin[at].tolist()
            nbytes = np.bincount(bins - first, weights=sizes)[at].astype(np.int64).tolist()
        for seg, n, b in zip(segs, counts, nbytes, strict=True):
            live[seg] = live.get(seg, 0) + n
            live_bytes[seg] = live_bytes.get(seg, 0) + b + n * ENQ_MIN
        return
    segs = list(map((32).__rrshift__, locs))
    for seg, n in Counter(segs).items():
        live[seg] = live.get(seg, 0) + n
    for seg, blen in zip(segs, blens, strict=True):
        live_bytes[seg] = live_bytes.get(seg, 0) + ENQ_MIN + blen


class QueueState:
    """Live entries of one queue while loading (checkpoint arrays + replayed records)."""
    __slots__ = ("base", "base_prio", "delivered", "new", "qdef", "removed")

    def __init__(self, qdef):
        self.qdef = qdef
        self.base = None          # (seqs, locs, exps, blens, flags) arrays from the checkpoint
        self.base_prio = None     # priorities of the base entries (T_CKPT_PRIO), if written
        self.removed = set()      # seqs of base entries removed after the checkpoint
        self.delivered = {}       # seq of a base entry delivered after the checkpoint -> flags
        self.new = {}             # seq -> [loc, exp, prio, blen, flags]

    @property
    def priorities_known(self) -> bool:
        """Whether ``entries()`` has every entry's priority (format-1 checkpoints lack
        those of their entries)."""
        return self.base is None or self.base_prio is not None

    def count(self) -> int:
        if self.base is None:
            return len(self.new)
        return len(self.entries())

    def columns(self, by_level: bool = False) -> tuple:
        """The live entries as ``(seqs, locs, exps, blens, flags, prios)`` arrays in seq
        order (with ``by_level``: grouped by priority from the lowest, seq order kept
        within each), built with vector operations: a checkpoint of ten million entries
        becomes the index without a Python object per entry (``entries()`` makes six)."""
        import numpy as np

        fast = self._columns_unchanged(by_level)
        if fast is not None:
            return fast
        dtypes = (np.int64, np.int64, np.float64, np.uint32, np.uint8)
        if self.base is not None:
            cols = [np.frombuffer(a, dt) for a, dt in zip(self.base, dtypes, strict=True)]
            n = len(cols[0])
            prios = (np.zeros(n, np.uint8) if self.base_prio is None
                     else np.frombuffer(self.base_prio, np.uint8))
            cols.append(prios)
            # newer: rewritten forward by compaction (only seqs the base can hold)
            top = int(cols[0].max()) if n else 0
            skip = self.removed.union(s for s in self.new if s <= top)
            if skip:
                gone = np.sort(np.fromiter(skip, np.int64, len(skip)))
                base_seqs = cols[0]
                if bool(np.all(base_seqs[1:] > base_seqs[:-1])):  # a FIFO's: binary search
                    at = np.minimum(np.searchsorted(base_seqs, gone), n - 1)
                    keep = np.ones(n, bool)
                    keep[at[base_seqs[at] == gone]] = False
                else:
                    keep = ~np.isin(base_seqs, gone)
                cols = [c[keep] for c in cols]
            if self.delivered:
                seqs = cols[0]
                order = np.argsort(seqs, kind="stable")
                d_seqs = np.fromiter(self.delivered, np.int64, len(self.delivered))
                d_flags = np.fromiter(self.delivered.values(), np.uint8, len(self.delivered))
                at = np.searchsorted(seqs, d_seqs, sorter=order)
                at = np.minimum(at, max(len(seqs) - 1, 0))
                if len(seqs):
                    idx = order[at]
                    hit = seqs[idx] == d_seqs
                    flags = cols[4].copy()
                    np.maximum.at(flags, idx[hit], d_flags[hit])
                    cols[4] = flags
        else:
            cols = [np.empty(0, dt) for dt in dtypes] + [np.empty(0, np.uint8)]
        if self.new:
            k = len(self.new)
            # rows [loc, exp, prio, blen, flags]; exp None -> NaN
            rows = np.array([(loc, NAN if exp is None else exp, prio, blen, fl)
                             for loc, exp, prio, blen, fl in self.new.values()], np.float64)
            newer: list[Any] = [np.fromiter(self.new, np.int64, k),
                     np.fromiter(map(itemgetter(0), self.new.values()), np.int64, k),
                     rows[:, 1], rows[:, 3].astype(np.uint32), rows[:, 4].astype(np.uint8),
                     rows[:, 2].astype(np.uint8)]
            cols = [np.concatenate((a, b)) for a, b in zip(cols, newer, strict=True)]
        seqs = cols[0]
        if len(seqs) > 1 and not bool(np.all(seqs[1:] > seqs[:-1])):
            order = np.argsort(seqs, kind="stable")
            cols = [c[order] for c in cols]
        if by_level and len(seqs) > 1 and not bool(np.all(cols[5][1:] >= cols[5][:-1])):
            order = np.argsort(cols[5], kind="stable")
            cols = [c[order] for c in cols]
        out = []
        for code, c in zip("qqdIBB", cols, strict=True):
            a = array(code)
            a.frombytes(np.ascontiguousarray(c).tobytes())
            out.append(a)
        return tuple(out)

    def _columns_unchanged(self, by_level: bool) -> tuple | None:
        """``columns()`` done in place on the checkpoint's arrays, or None when it cannot.

        A checkpoint lists a FIFO queue's entries as one run in seq order, followed by
        the few delivered but unsettled then (``_out``). Since it, a prefix of the run
        may have been consumed and some entries requeued or rewritten (their newer rows
        win) and new ones appended. When everything outside the run sorts before what
        is left of it or after its end, the run is cut and extended in place (a memmove,
        not a copy per column), and only those few rows go through Python."""
        if self.base is None or by_level:
            return None
        import numpy as np
        seqs, locs, exps, blens, flags = self.base
        n = len(seqs)
        if not n:
            return None
        ordered = np.frombuffer(seqs, np.int64)
        descents = np.flatnonzero(ordered[1:] <= ordered[:-1])
        d = int(descents[0]) + 1 if len(descents) else n  # the run: [0, d)
        del descents
        if n - d > max(100_000, n // 100):
            return None
        removed, delivered = self.removed, self.delivered
        extra: dict = {}  # seq -> (loc, exp, prio, blen, flags), rows outside the run
        for i in range(d, n):
            seq = seqs[i]
            if seq not in removed:
                fl = max(flags[i], delivered.get(seq, 0))
                extra[seq] = (locs[i], exps[i], 0, blens[i], fl)
        for seq, (loc, exp, prio, blen, fl) in self.new.items():
            extra[seq] = (loc, NAN if exp is None else exp, prio, blen, fl)
        first, last = seqs[0], seqs[d - 1]
        gone = np.array(sorted({s for s in removed if first <= s <= last}
                               | {s for s in extra if first <= s <= last}), np.int64)
        k = len(gone)
        if k and not np.array_equal(ordered[:k], gone):
            return None  # not a consumed prefix
        head = seqs[k] if k < d else None
        low = sorted(s for s in extra if (s <= last if head is None else s < head))
        high = sorted(s for s in extra if s > last)
        if len(low) + len(high) != len(extra):
            return None  # something falls inside what is left of the run
        if delivered:  # entries of the run delivered since: their flags, in place
            run = ordered[:d]
            d_seqs = np.fromiter(delivered, np.int64, len(delivered))
            d_flags = np.fromiter(delivered.values(), np.uint8, len(delivered))
            at = np.minimum(np.searchsorted(run, d_seqs), d - 1)
            hit = run[at] == d_seqs
            in_place = np.frombuffer(flags, np.uint8)
            np.maximum.at(in_place, at[hit], d_flags[hit])
            del in_place, run
        del ordered  # (views: the arrays cannot change size while one is exported)
        cols = (seqs, locs, exps, blens, flags)
        for a in cols:
            del a[d:]
            del a[:k]
        for rows, front in ((low, True), (high, False)):
            if not rows:
                continue
            picked = [extra[s] for s in rows]
            parts = (rows, [r[0] for r in picked], [r[1] for r in picked],
                     [r[3] for r in picked], [r[4] for r in picked])
            for a, part in zip(cols, parts, strict=True):
                if front:
                    a[0:0] = array(a.typecode, part)
                else:
                    a.extend(part)
        self.base = None  # handed over
        self.new = {}
        return seqs, locs, exps, blens, flags, array("B", bytes(len(seqs)))

    def entries(self):
        """Sorted (seq, loc, exp, prio, blen, flags)."""
        out = []
        if self.base is not None:
            seqs, locs, exps, blens, flags = self.base
            prios = self.base_prio
            removed, delivered, newer = self.removed, self.delivered, self.new
            rows = zip(seqs, locs, exps, bytes(len(seqs)) if prios is None else prios, blens,
                       flags, strict=True)
            skip = removed.union(newer)  # newer: rewritten forward by compaction
            out = [r for r in rows if r[0] not in skip] if skip else list(rows)
            if delivered:
                out = [(*r[:5], delivered[r[0]]) if delivered.get(r[0], 0) > r[5] else r
                       for r in out]
        for s, (loc, exp, prio, blen, fl) in self.new.items():
            out.append((s, loc, NAN if exp is None else exp, prio, blen, fl))
        out.sort(key=itemgetter(0))
        return out


class JournalState:
    """Everything loaded from disk: definitions, live entries, scan results."""

    def __init__(self):
        self.exchanges: dict = {}   # (vhost, name) -> ExchangeDef
        self.queues: dict = {}      # qid -> QueueState
        self.bindings: dict = {}    # binding_key -> BindingDef
        self.meta: dict = {}        # (kind, key) -> value JSON text
        self.next_qid = 1
        self.max_msg_id = 0
        self.ckpt_pos = (0, 0)
        self.segments: list = []    # (seg, ScanResult, record count by type)
        self.last_seg = 0
        self.last_end = 0
        self.records = 0
        self.skipped: list = []     # repair: (file, offset, length, reason)

    def apply(self, rtype, payload, loc, prio_of=None):
        if rtype == jf.T_ENQ or rtype == jf.T_ENQ_REF:
            qid, seq, exp, prio, blen, ref = jf.unpack_enq(payload)
            qs = self.queues.get(qid)
            if qs is None:
                return
            mloc = loc if rtype == jf.T_ENQ else ref
            qs.new[seq] = [mloc, exp, prio, blen, 0]
            if rtype == jf.T_ENQ:
                mid = int.from_bytes(payload[jf.ENQ.size:jf.ENQ.size + 8], "big")
                if mid > self.max_msg_id:
                    self.max_msg_id = mid
        elif rtype == jf.T_REMOVE:
            qid, seq = jf.QSEQ.unpack_from(payload, 0)
            qs = self.queues.get(qid)
            if qs is None:
                return
            if seq in qs.new:
                del qs.new[seq]
            if qs.base is not None:
                qs.removed.add(seq)
        elif rtype == jf.T_DELIVERED:
            qid, seq, count = jf.unpack_delivered(payload)
            qs = self.queues.get(qid)
            if qs is None:
                return
            fl = jf.count_flags(count, True)
            item = qs.new.get(seq)
            if item is not None and fl > item[4]:
                item[4] = fl
            if qs.base is not None and fl > qs.delivered.get(seq, 0):
                qs.delivered[seq] = fl
        elif rtype == jf.T_EXCHANGE:
            xd = jf.unpack_exchange(payload)
            self.exchanges[(xd.vhost, xd.name)] = xd
        elif rtype == jf.T_EXCHANGE_DEL:
            self.exchanges.pop(jf.unpack_name(payload), None)
        elif rtype == jf.T_QUEUE:
            qd, qid = jf.unpack_queue(payload)
            self.queues[qid] = QueueState(qd)
            self.next_qid = max(self.next_qid, qid + 1)
        elif rtype == jf.T_QUEUE_DEL:
            (qid,) = jf.U32.unpack_from(payload, 0)
            self.queues.pop(qid, None)
        elif rtype == jf.T_BINDING:
            bd = jf.unpack_binding(payload)
            self.bindings[jf.binding_key(bd)] = bd
        elif rtype == jf.T_BINDING_DEL:
            bd = jf.unpack_binding(payload)
            self.bindings.pop(jf.binding_key(bd), None)
        elif rtype == jf.T_META:
            kind, key, raw = jf.unpack_meta(payload)
            self.meta[(kind, key)] = raw
        elif rtype == jf.T_META_DEL:
            kind, key, _ = jf.unpack_meta(payload)
            self.meta.pop((kind, key), None)

    def queue_defs(self):
        return [qs.qdef for qs in self.queues.values()]


def _read_file(path: str):
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)


def load_checkpoint(jdir: str, state: JournalState) -> bool:
    path = os.path.join(jdir, "checkpoint")
    if not os.path.exists(path):
        return False
    data = _read_file(path)  # mapped: the arrays are copied once, straight from the file
    recs: list = []
    res = jf.scan(data, path, records=recs)
    if res.corrupt_at is not None or res.torn_at is not None or not recs \
            or recs[-1][1] != jf.T_CKPT_END or recs[0][1] != jf.T_CKPT_HEAD:
        raise StoreUnavailable(f"journal checkpoint {path} is damaged; run "
                               f"'python -m broker repair --data-dir {os.path.dirname(jdir)}'")
    for _off, rtype, payload in recs:
        if rtype == jf.T_CKPT_HEAD:
            head = json.loads(bytes(payload))
            state.ckpt_pos = (head["seg"], head["off"])
            state.next_qid = head["next_qid"]
            state.max_msg_id = head["max_msg_id"]
        elif rtype == jf.T_CKPT_QUEUE:
            qid, n = jf.QSEQ.unpack_from(payload, 0)
            pos = jf.QSEQ.size
            arrs = []
            for code, size in (("q", 8), ("q", 8), ("d", 8), ("I", 4), ("B", 1)):
                a = array(code)
                a.frombytes(payload[pos:pos + n * size])  # one copy: a view of the file
                pos += n * size
                arrs.append(a)
            qs = state.queues.get(qid)
            if qs is not None:
                qs.base = tuple(arrs)
        elif rtype == jf.T_CKPT_PRIO:
            qid, n = jf.QSEQ.unpack_from(payload, 0)
            qs = state.queues.get(qid)
            if qs is not None:
                prios = array("B")
                prios.frombytes(bytes(payload[jf.QSEQ.size:jf.QSEQ.size + n]))
                qs.base_prio = prios
        elif rtype in (jf.T_EXCHANGE, jf.T_QUEUE, jf.T_BINDING, jf.T_META):
            state.apply(rtype, payload, 0)
    return True


def _replay(state: JournalState, recs: list, seg_base: int) -> None:
    """``state.apply`` every record of one segment, with the enqueues and removals -- nearly
    all of a log -- decoded inline (a kill -9 replays up to a checkpoint interval of them)."""
    queues = state.queues
    enq_unpack = jf.ENQ.unpack_from
    qseq_unpack = jf.QSEQ.unpack_from
    enq_size = jf.ENQ.size
    from_bytes = int.from_bytes
    max_id = state.max_msg_id
    for off, rtype, payload in recs:
        if rtype in (_T_ENQ, _T_ENQ_REF):
            qid, seq, exp, prio, blen, ref = enq_unpack(payload, 0)
            qs = queues.get(qid)
            if qs is None:
                continue
            if rtype == _T_ENQ:
                qs.new[seq] = [seg_base | off, None if exp != exp else exp, prio, blen, 0]
                mid = from_bytes(payload[enq_size:enq_size + 8], "big")
                if mid > max_id:
                    max_id = mid
            else:
                qs.new[seq] = [ref, None if exp != exp else exp, prio, blen, 0]
        elif rtype == _T_REMOVE:
            qid, seq = qseq_unpack(payload, 0)
            qs = queues.get(qid)
            if qs is None:
                continue
            qs.new.pop(seq, None)
            if qs.base is not None:
                qs.removed.add(seq)
        else:
            state.max_msg_id = max_id
            state.apply(rtype, payload, seg_base | off)
            max_id = state.max_msg_id
    state.max_msg_id = max_id


REPLAY_SLICE = 50_000  # records replayed between two progress updates


def load_state(jdir: str, salvage: bool = False, use_checkpoint: bool = True,
               scan_old: bool = False, progress: RecoveryProgress | None = None) -> JournalState:
    """Read checkpoint + segments. Raises StoreUnavailable on corruption (unless salvage).

    ``progress`` (the broker's): phases "journal checkpoint" (entries) and "journal log"
    (records replayed after the checkpoint: the work a kill -9 leaves, bounded by
    ``checkpoint_bytes`` of log)."""
    state = JournalState()
    if use_checkpoint:
        try:
            phase = progress.phase("journal checkpoint", unit="entries") if progress else None
            load_checkpoint(jdir, state)
            entries = sum(len(qs.base[0]) for qs in state.queues.values() if qs.base is not None)
            if entries > 100_000:
                # recover() builds long indexes with numpy: imported here, in the worker
                # thread, rather than on the event loop
                importlib.import_module("numpy")
            if phase is not None:
                phase.advance(entries)
                phase.finish()
        except StoreUnavailable:
            if not salvage:
                raise
            state = JournalState()
            state.skipped.append((os.path.join(jdir, "checkpoint"), 0, 0, "damaged checkpoint ignored"))
    segs = jf.list_segments(jdir)
    ck_seg, ck_off = state.ckpt_pos
    scans: list = []
    replaying = progress.phase("journal log", unit="records") if progress else None
    for seg in segs:
        path = os.path.join(jdir, jf.seg_name(seg))
        replay = seg >= ck_seg
        if not replay and not (scan_old or salvage):
            res = jf.ScanResult(path)
            res.end = os.path.getsize(path)
            scans.append((seg, res, {}))
            continue
        buf = _read_file(path)
        recs: list = []
        start = ck_off if seg == ck_seg else 0
        # segments before the checkpoint are only checked up to where they end
        res = jf.scan(buf, path, start=start if replay else 0, records=recs, salvage=salvage)
        counts = dict(Counter(map(itemgetter(1), recs)))
        if replay:
            # in slices, so that progress (and its log line each second) moves within a segment
            for i in range(0, len(recs), REPLAY_SLICE):
                part = recs[i:i + REPLAY_SLICE]
                _replay(state, part, seg << 32)
                if replaying is not None:
                    replaying.advance(len(part))
            state.records += len(recs)
        del recs
        for off, n, why in getattr(res, "skipped", []):
            state.skipped.append((path, off, n, why))
        scans.append((seg, res, counts))
        if not isinstance(buf, bytes):
            try:
                buf.close()
            except BufferError:
                pass
    state.segments = scans
    if replaying is not None:
        replaying.finish()
    # where the data ends; a torn record is only acceptable at the very end
    last_with_data = 0
    for seg, res, _c in scans:
        if res.end > 0 or res.torn_at is not None:
            last_with_data = seg
    for seg, res, _c in scans:
        if res.corrupt_at is not None and not salvage:
            raise StoreUnavailable(
                f"journal corrupt: {res.path} offset {res.corrupt_at}: {res.corrupt_reason}; "
                f"refusing to start (run 'python -m broker repair --data-dir DIR' to salvage)")
        if res.torn_at is not None and seg != last_with_data and not salvage:
            raise StoreUnavailable(
                f"journal corrupt: {res.path} offset {res.torn_at}: damaged record before the "
                f"end of the journal; refusing to start (run 'python -m broker repair')")
    if scans:
        state.last_seg = last_with_data or scans[-1][0]
        for seg, res, _c in scans:
            if seg == state.last_seg:
                state.last_end = res.end
    return state


class JournalStore(Store):
    name = "journal"
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {DURABLE, PAGES_MESSAGES, READS_BACK, BLOCKS_ON_FAILURE})

    def __init__(self, data_dir: str, flush: str = "sync", segment_size: int | None = None,
                 settings: JournalSettings | None = None, jdir: str | None = None):
        settings = settings or JournalSettings()
        if segment_size is None:
            segment_size = settings.segment_size
        self.settings = settings
        self.flush_stats: FlushStats = FlushStats()  # /metrics: fsync latency, group-commit size, errors
        self.data_dir = data_dir
        self.jdir = jdir or os.path.join(data_dir, "journal")
        self.flush = flush
        self.segment_size = segment_size
        self.broker = None
        self._state: JournalState | None = None
        self._lock_fd: int | None = None
        # writing
        self._seg = 1
        self._off = 0
        self._pending: list = []   # [seg, start offset, bytearray]
        self._inflight: list = []
        self._callbacks: list = []  # (callback, on_failure) waiting for the next write
        self._dirty: trio.Event | None = None
        self._fds: dict = {}       # used only by the writer thread
        self._maps: dict = {}      # seg -> mmap for reading bodies
        self._last_msg = None
        self._last_msg_loc = 0
        self._stored = StoredMessage.for_store(self)  # paged-out unacked deliveries' messages
        self._seg_live: dict = {}  # seg -> live entries stored there
        self._seg_bytes: dict = {}  # seg -> their bytes, a lower bound (ENQ_MIN + body each)
        self.compact_written = 0  # bytes compaction wrote (moved messages)
        self.compact_freed = 0    # bytes of the segment files it emptied, once deleted
        self._compacted: set = set()  # segments compaction emptied, not yet deleted
        self._prev_seg_bytes: dict = {}  # _seg_bytes at the previous compaction pass
        self._max_msg_id = 0
        self._bytes_since_ckpt = 0
        self._records_since_ckpt = 0
        self._ckpt_wanted = False
        self._unwritten = 0        # bytes in _pending and _inflight
        self._backlog_full = False  # over settings.max_unwritten: publishers are blocked
        self._failed: OSError | None = None
        # entries enqueued while writes fail, not yet recorded -> queue: a nacked publish
        # takes them back from their queues and is never written (when_durable)
        self._held: dict = {}
        # stored deliveries not yet settled, by age: their messages are paged out once
        # they are UNACKED_PAGE_AFTER old (_page_unacked)
        # (dicts as ordered sets: a settled entry leaves them at once, never kept alive)
        self._fresh_out: dict = {}
        self._aging_out: dict = {}
        self._paged_freed = 0  # body bytes paged out since the last trim (TRIM_AFTER)
        self._trim = _malloc_trim()
        self._trim_next = 0.0  # monotonic time before which no trim starts (TRIM_SPACING)
        # definitions (for checkpoints)
        self._exchanges: dict = {}
        self._queues: dict = {}    # qid -> QueueDef
        self._qids: dict = {}      # Queue -> qid (this store's id of a live queue)
        self._out: dict = {}       # stored QueueEntry delivered, not yet settled -> Queue
        self._bindings: dict = {}
        self._meta: dict = {}      # (kind, key) -> value JSON text (for checkpoints)
        self._next_qid = 1
        self._ckpt_seg = 0

    # ------------------------------------------------------------------ life cycle
    async def open(self) -> None:
        try:
            os.makedirs(self.jdir, exist_ok=True)
            lock_fd = os.open(os.path.join(self.jdir, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
            self._lock_fd = lock_fd
        except OSError as exc:
            raise StoreUnavailable(f"cannot open journal in {self.jdir}: {exc.strerror}") from None
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise StoreUnavailable(f"journal {self.jdir} is in use by another broker process") from None
        t0 = time.monotonic()
        state = await trio.to_thread.run_sync(partial(load_state, self.jdir,
                                                      progress=self.progress))
        self._state = state
        # truncate a torn tail
        for _seg, res, _c in state.segments:
            if res.torn_at is not None:
                path = res.path
                n = res.torn_bytes
                fd = os.open(path, os.O_RDWR)
                try:
                    size = os.fstat(fd).st_size
                    os.pwrite(fd, bytes(min(n, max(0, size - res.torn_at))), res.torn_at)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                log.warning("journal: truncated a torn record at the tail of %s: %d bytes at "
                            "offset %d (partial write from a crash)", path, n, res.torn_at)
        self._seg = state.last_seg or 1
        self._off = state.last_end
        self._next_qid = state.next_qid
        self._max_msg_id = state.max_msg_id
        self._ckpt_seg = state.ckpt_pos[0]
        log.info("journal: loaded %d segments, replayed %d records after checkpoint %s in %.2fs",
                 len(state.segments), state.records, state.ckpt_pos, time.monotonic() - t0)

    def recover(self, broker) -> None:
        from ..message import set_message_id_floor
        from .recovery import restore, restore_meta
        self.broker = broker
        state = self._state
        if state is None:
            return
        self._meta = dict(state.meta)
        restore_meta(broker, [(k, key, raw) for (k, key), raw in state.meta.items()])
        self._exchanges = dict(state.exchanges)
        self._bindings = dict(state.bindings)
        restore(broker, list(state.exchanges.values()), state.queue_defs(),
                list(state.bindings.values()), [], {})
        now_wall = time.time()
        total = 0
        live = self._seg_live
        progress = self.progress
        restoring = progress.phase("journal queues", len(state.queues), unit="queues") \
            if progress is not None else None
        for qid, qs in state.queues.items():
            if restoring is not None:
                restoring.advance()
            qd = qs.qdef
            self._queues[qid] = qd
            vhost = broker.vhosts.get(qd.vhost)
            q = vhost.queues.get(qd.name) if vhost is not None else None
            if q is None or not q.durable or q.store is not self:
                continue
            self._qids[q] = qid
            if q.restores_paged and (not q.opts.max_priority or qs.priorities_known):
                # grouped by level for a priority queue, seq order kept within each
                *cols, prios = qs.columns(by_level=bool(q.opts.max_priority))
                if not len(cols[0]):
                    continue
                total += len(cols[0])
                _count_live(live, self._seg_bytes, cols[1], cols[3])
                if q.opts.max_priority:
                    cols.append(prios)
                q.restore(paged=tuple(cols))
                continue
            entries = qs.entries()
            if not entries:
                continue
            total += len(entries)
            _count_live(live, self._seg_bytes, array("q", [e[1] for e in entries]),
                        array("I", [e[4] for e in entries]))
            q.restore(self._entries_of(q, entries, now_wall))
        set_message_id_floor(self._max_msg_id)
        if restoring is not None:
            restoring.finish()
        log.info("journal: recovered %d persistent messages", total)
        if state.records > 10000:
            self._ckpt_wanted = True
        self._state = None
        del state
        if self._trim is not None:
            # the replay's rows were freed among what stays: hand their pages back, so a
            # restart after a burst ends with the memory it had before the crash
            self._trim()

    def _entries_of(self, q, entries, now_wall: float):
        """QueueEntry objects (messages read back) for recovered index rows."""
        timers = q.vhost.timers
        max_priority = q.opts.max_priority
        two_level = q.opts.two_level_priority
        for seq, loc, exp, prio, _blen, fl in entries:
            msg = self.read_message(loc)
            expires_at = None
            if exp == exp:
                expires_at = timers.now() + (exp - now_wall)
            if max_priority:
                prio = message_priority(msg.properties, max_priority, two_level)
            entry = QueueEntry(msg, seq, expires_at, prio)
            entry.loc = loc
            restore_delivery_count(q, entry, fl)
            yield entry

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._page_unacked)
            await self._run_writer()

    async def _page_unacked(self) -> None:
        """Every UNACKED_PAGE_AFTER seconds, the stored deliveries still unsettled since the
        previous pass keep their messages only by location (StoredMessage)."""
        while True:
            await trio.sleep(UNACKED_PAGE_AFTER)
            due, self._aging_out, self._fresh_out = self._aging_out, self._fresh_out, {}
            freed = 0
            for e in due:
                m = e.message
                if e.loc and type(m) is Message:
                    e.message = self._stored.of(m, e.loc)
                    freed += len(m.body)
            self._paged_freed += freed
            # also once paging goes quiet: the tail of a burst (under TRIM_AFTER, or a trim
            # put off by the spacing) would otherwise stay in the heap for good
            settled = not freed and self._paged_freed > 0
            if (self._paged_freed >= TRIM_AFTER or settled) and self._trim is not None \
                    and time.monotonic() >= self._trim_next:
                self._paged_freed = 0
                started = time.monotonic()
                await trio.to_thread.run_sync(self._trim)
                took = time.monotonic() - started
                self._trim_next = started + took * TRIM_SPACING

    async def _run_writer(self) -> None:
        dirty = self._dirty = trio.Event()
        if self._pending or self._callbacks:
            dirty.set()
        while True:
            if self.flush == "async":
                await trio.sleep(ASYNC_INTERVAL)
            else:
                await dirty.wait()
                dirty = self._dirty = trio.Event()
            await self._flush_once()
            settings = self.settings
            due = (self._ckpt_wanted or self._bytes_since_ckpt >= settings.checkpoint_bytes
                   or self._records_since_ckpt >= settings.checkpoint_records)
            if self._failed is None and due:
                await self.checkpoint()

    async def close(self) -> None:
        try:
            await self._flush_once()
            if self._failed is None and self.broker is not None:
                await self.checkpoint()
        finally:
            def _close():
                for fd in self._fds.values():
                    os.close(fd)
                self._fds.clear()
            await trio.to_thread.run_sync(_close)
            for m in self._maps.values():
                try:
                    m.close()
                except BufferError:
                    pass
            self._maps.clear()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    # ------------------------------------------------------------------ writing
    # ---- offline writing (the repair tool rewrites a journal record by record) ----
    def append_record(self, rtype: int, payload: bytes) -> int:
        """Buffer one record; returns its location. Offline use only (no broker)."""
        return self._append(rtype, payload)

    def write_buffered_and_close(self) -> None:
        """Write and fsync what ``append_record`` buffered, then close the files."""
        self._write_chunks(self._pending)
        self._pending = []
        self._unwritten = 0
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _append(self, rtype: int, payload: bytes) -> int:
        rec = jf.pack_record(rtype, payload)
        n = len(rec)
        off = self._off
        if off and off + n > self.segment_size:
            self._seg += 1
            off = 0
            self._last_msg = None
        seg = self._seg
        pending = self._pending
        if pending and pending[-1][0] == seg:
            pending[-1][2] += rec
        else:
            pending.append([seg, off, bytearray(rec)])
        self._off = off + n
        self._bytes_since_ckpt += n
        self._records_since_ckpt += 1
        self._unwritten += n
        if self._unwritten > self.settings.max_unwritten and not self._backlog_full:
            self._set_backlog(True)
        if self._dirty is not None:
            self._dirty.set()
        return (seg << 32) | off

    def _set_backlog(self, full: bool) -> None:
        """Block publishers while the unwritten buffer is over its bound (a burst faster
        than the disk would otherwise sit in memory): a resource alarm, as the SQL
        store's backlog."""
        self._backlog_full = full
        if self.broker is not None:
            self.broker.on_store_backlog(self, full)

    def when_durable(self, callback, on_failure=None) -> None:
        # A failed write is retried, never skipped: what it held is in doubt and waits.
        # While writes fail, a publish is nacked (on_failure) after its entries -- those
        # enqueued since the previous call: the publish path enqueues, then calls
        # this at once -- are taken back from their queues unwritten, so a nacked
        # message is never delivered, now or after a restart. A callback without
        # on_failure has them recorded and waits for the retry.
        if self._failed is not None and on_failure is not None:
            if self._held:
                self._withdraw_held()
            on_failure()
            return
        if self._held:
            self._record_held()
        if self.flush == "async":
            callback()
            return
        self._callbacks.append((callback, on_failure))
        if self._dirty is not None:
            self._dirty.set()

    def _withdraw_held(self) -> None:
        held, self._held = self._held, {}
        by_queue: dict = {}
        for entry, q in held.items():
            by_queue.setdefault(q, []).append(entry)
        for q, entries in by_queue.items():
            if not q.deleted:
                q.withdraw(entries)

    def _record_held(self) -> None:
        """Write the records of held entries no nack took back (publishes without
        confirms, dead letters) once writes are retried or a callback waits for them."""
        held, self._held = self._held, {}
        for entry, q in held.items():
            if not q.deleted:
                self.enqueue(q, entry)

    async def _flush_once(self) -> None:
        if self._held:
            self._record_held()
        chunks = self._pending
        cbs = self._callbacks
        if not chunks and not cbs:
            return
        self._pending = []
        self._callbacks = []
        self._inflight = chunks
        try:
            if chunks:
                started = time.monotonic()
                await trio.to_thread.run_sync(self._write_chunks, chunks)
                self.flush_stats.observe(time.monotonic() - started, len(cbs))
        except OSError as exc:
            self.flush_stats.errors += 1
            self._inflight = []
            self._pending = chunks + self._pending
            # In doubt: part of the write may be on disk (and would come back after a
            # restart), so its publishes are neither confirmed nor nacked: they wait for
            # the retry, and the broker closes the connections waiting for them.
            self._callbacks = cbs + self._callbacks
            self._write_failed(exc)
            await trio.sleep(1.0)
            if self._dirty is not None:
                self._dirty.set()
            return
        self._inflight = []
        self._unwritten -= sum(len(c[2]) for c in chunks)
        if self._backlog_full and self._unwritten <= self.settings.max_unwritten // 2:
            self._set_backlog(False)
        if self._failed is not None:
            log.warning("journal: writes succeed again after %s", self._failed)
            self._failed = None
            if self.broker is not None:
                self.broker.on_store_recovered(self)
        for cb, _fail in cbs:
            try:
                cb()
            except Exception:  # pragma: no cover - a confirm for a closed channel
                log.exception("journal: durable callback failed")

    def _write_failed(self, exc: OSError) -> None:
        first = self._failed is None
        self._failed = exc
        reason = "no space left on device" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        if first:
            log.error("journal: write failed (%s); publishes in flight are in doubt (their "
                      "connections are closed with 541), new ones are nacked and never stored, "
                      "publishers are blocked until writes succeed", reason)
        if self.broker is not None:
            self.broker.on_store_failure(self, reason)

    def _fd(self, seg: int) -> int:
        fd = self._fds.get(seg)
        if fd is None:
            path = os.path.join(self.jdir, jf.seg_name(seg))
            new = not os.path.exists(path)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if os.fstat(fd).st_size < self.segment_size:
                    os.posix_fallocate(fd, 0, self.segment_size)
            except OSError:
                os.close(fd)
                if new:
                    os.unlink(path)
                raise
            if new:
                dfd = os.open(self.jdir, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
            # keep only the newest two segments open
            for old in [s for s in self._fds if s < seg - 1]:
                os.close(self._fds.pop(old))
            self._fds[seg] = fd
        return fd

    def _write_chunks(self, chunks) -> None:
        # Sync a segment before moving to the next: opening a later segment may close
        # the descriptors of older ones (_fd keeps two open).
        current = None
        for seg, start, buf in chunks:
            if current is not None and seg != current[0]:
                os.fdatasync(current[1])
            fd = self._fd(seg)
            current = (seg, fd)
            view = memoryview(buf)
            pos = 0
            while pos < len(view):
                pos += os.pwrite(fd, view[pos:], start + pos)
        if current is not None:
            os.fdatasync(current[1])

    # ------------------------------------------------------------------ reading
    def sidecar_path(self, name: str) -> str | None:
        return os.path.join(self.jdir, name)

    def read_message(self, loc: int):
        return self._decode_at(*self._buffer_at(loc))

    def release_read_maps(self) -> None:
        """Unmap the segments mapped for reading; they are mapped again on the next read."""
        for seg, m in list(self._maps.items()):
            try:
                m.close()
            except BufferError:  # a view is still exported: keep it
                continue
            del self._maps[seg]

    def _map(self, seg: int):
        old = self._maps.pop(seg, None)
        if old is not None:
            try:
                old.close()
            except BufferError:
                pass
        path = os.path.join(self.jdir, jf.seg_name(seg))
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._maps[seg] = m
        return m

    @staticmethod
    def _decode_at(buf, off: int):
        length, _crc, rtype = jf.HDR.unpack_from(buf, off)
        start = off + jf.HDR_SIZE + jf.ENQ.size
        return decode_message(bytes(buf[start:off + jf.HDR_SIZE + length]))

    # ------------------------------------------------------------------ definitions
    def save_exchange(self, vhost, exchange) -> None:
        xd = exchange_def(vhost, exchange)
        self._exchanges[(xd.vhost, xd.name)] = xd
        self._append(jf.T_EXCHANGE, jf.pack_exchange(xd))

    def delete_exchange(self, vhost, exchange) -> None:
        self._exchanges.pop((vhost.name, exchange.name), None)
        self._append(jf.T_EXCHANGE_DEL, jf.pack_name(vhost.name, exchange.name))

    def save_queue(self, vhost, queue) -> None:
        qd = queue_def(vhost, queue)
        qid = self._next_qid
        self._next_qid += 1
        self._qids[queue] = qid
        self._queues[qid] = qd
        self._append(jf.T_QUEUE, jf.pack_queue(qd, qid))

    def delete_queue(self, vhost, queue) -> None:
        qid = self._qids.pop(queue, None)
        if qid is None:
            return
        self._queues.pop(qid, None)
        self._append(jf.T_QUEUE_DEL, jf.U32.pack(qid))

    def save_binding(self, vhost, binding) -> None:
        bd = binding_def(vhost, binding)
        self._bindings[jf.binding_key(bd)] = bd
        self._append(jf.T_BINDING, jf.pack_binding(bd))

    def delete_binding(self, vhost, binding) -> None:
        bd = binding_def(vhost, binding)
        self._bindings.pop(jf.binding_key(bd), None)
        self._append(jf.T_BINDING_DEL, jf.pack_binding(bd))

    def save_meta(self, kind: str, key: str, value: dict) -> None:
        from .recovery import encode_meta
        raw = encode_meta(value)
        self._meta[(kind, key)] = raw
        self._append(jf.T_META, jf.pack_meta(kind, key, raw))

    def delete_meta(self, kind: str, key: str) -> None:
        if self._meta.pop((kind, key), None) is not None:
            self._append(jf.T_META_DEL, jf.pack_meta(kind, key))

    # ------------------------------------------------------------------ messages
    def queue_op(self, queue, op, entry) -> None:
        if not entry.message.persistent:
            return
        if op is _ENQUEUE:
            if self._failed is not None:
                # writes fail: recorded only once its publish is not nacked (when_durable)
                self._held[entry] = queue
                return
            self.enqueue(queue, entry)
        elif self._held and entry in self._held:
            if op is not _DELIVER and op is not _REQUEUE:
                del self._held[entry]  # left before it was recorded: nothing to write
        elif op is _DELIVER:
            if entry.loc:
                self._out[entry] = queue
                self._fresh_out[entry] = None
                self.delivered(queue, entry)  # every time: the count survives a restart
        else:
            if self._out.pop(entry, None) is not None:
                self._fresh_out.pop(entry, None)
                self._aging_out.pop(entry, None)
            if op is not _REQUEUE:
                self.remove(queue, entry)

    def enqueue(self, queue, entry) -> None:
        qid = self._qids.get(queue)
        if qid is None:
            self.save_queue(queue.vhost, queue)
            qid = self._qids[queue]
        message = entry.message
        expires = None
        if entry.expires_at is not None:
            expires = time.time() + (entry.expires_at - queue.vhost.timers.now())
        blen = len(message.body)
        if message is self._last_msg and (self._last_msg_loc >> 32) == self._seg:
            loc = self._last_msg_loc
            self._append(jf.T_ENQ_REF, jf.pack_enq(qid, entry.seq, expires, entry.priority, blen, loc))
        else:
            loc = self._append(jf.T_ENQ, jf.pack_enq(qid, entry.seq, expires, entry.priority, blen, 0)
                               + encode_message(message))
            self._last_msg = message
            self._last_msg_loc = loc
            if message.id > self._max_msg_id:
                self._max_msg_id = message.id
        entry.loc = loc
        seg = loc >> 32
        live = self._seg_live
        live[seg] = live.get(seg, 0) + 1
        live_bytes = self._seg_bytes
        live_bytes[seg] = live_bytes.get(seg, 0) + ENQ_MIN + blen

    def paged_ready(self, queue, entries) -> PagedFifo | PagedPriority:
        restored = queue.retry.restored if queue.retry is not None else None
        budget = self.settings.queue_memory_budget
        if queue.opts.max_priority:
            return PagedPriority(self, queue.vhost.timers, queue.opts.max_priority, budget,
                                 entries, restored, queue.opts.two_level_priority)
        return PagedFifo(self, queue.vhost.timers, budget=budget, entries=entries,
                         restored=restored)

    def delivered(self, queue, entry) -> None:
        qid = self._qids.get(queue)
        if qid is not None and entry.loc:
            self._append(jf.T_DELIVERED, jf.pack_delivered(qid, entry.seq, entry.delivery_count))

    def remove(self, queue, entry) -> None:
        loc = entry.loc
        if not loc:
            return
        qid = self._qids.get(queue)
        if qid is not None:
            self._append(jf.T_REMOVE, jf.QSEQ.pack(qid, entry.seq))
        seg = loc >> 32
        live = self._seg_live
        n = live.get(seg, 0) - 1
        if n > 0:
            live[seg] = n
            # (a scheduler slot's entry may leave unread: its body length is on disk)
            blen = _body_len(entry) if entry.message is not None else self._stored_body_len(loc)
            self._seg_bytes[seg] -= ENQ_MIN + blen
        else:
            live.pop(seg, None)
            self._seg_bytes.pop(seg, None)
            m = self._maps.pop(seg, None)
            if m is not None:  # nothing left to read there: drop its mapped pages from RSS
                try:
                    m.close()
                except BufferError:  # pragma: no cover
                    self._maps[seg] = m
        entry.loc = 0

    # ------------------------------------------------------------------ checkpoints & GC
    def _snapshot(self) -> list:
        """Checkpoint records describing the current state (taken synchronously).

        A queue's record is returned as ``(rtype, parts)``: the writer thread packs it
        (``pack_record_parts``: the CRC of a 10M-entry index, ~0.3-0.5 s, off the event
        loop), and each column is written as the pieces it comes in -- the stored entries,
        the paged index's copies, the unsettled deliveries -- without joining them (a
        second copy of the index: ~0.4 s at 10M)."""
        now_wall = time.time()
        # qid -> column sets written one after the other: (seqs, locs, exps, blens, flags),
        # plus priorities for a priority queue
        per_q: dict = {}
        for q, qid in self._qids.items():
            cols = _columns(q)
            self._add_entries(cols, q.stored_entries(), now_wall - q.vhost.timers.now())
            sets = per_q.setdefault(qid, [])
            sets.append(cols)
            ready = q.ready
            paged = ready.paged_levels() if isinstance(ready, PagedPriority) else q.paged_index()
            if paged is not None:
                # fresh copies (slices of the index): written as they are
                sets.append(tuple(paged)[:len(cols)])
        out: dict = {}
        for e, q in self._out.items():  # delivered, not settled: comes back redelivered
            qid = self._qids.get(q)
            if qid is not None:
                if qid not in out:
                    out[qid] = _columns(q)
                    per_q.setdefault(qid, []).append(out[qid])
                self._add_entries(out[qid], [e], now_wall - q.vhost.timers.now(), delivered=1)
        recs: list = [jf.pack_record(jf.T_CKPT_HEAD, json.dumps(
            {"seg": self._seg, "off": self._off, "next_qid": self._next_qid,
             "format": jf.FORMAT_VERSION,
             "max_msg_id": self._max_msg_id, "time": now_wall}).encode())]
        for (kind, key), raw in self._meta.items():
            recs.append(jf.pack_record(jf.T_META, jf.pack_meta(kind, key, raw)))
        for xd in self._exchanges.values():
            recs.append(jf.pack_record(jf.T_EXCHANGE, jf.pack_exchange(xd)))
        for qid, qd in self._queues.items():
            recs.append(jf.pack_record(jf.T_QUEUE, jf.pack_queue(qd, qid)))
        for bd in self._bindings.values():
            recs.append(jf.pack_record(jf.T_BINDING, jf.pack_binding(bd)))
        for qid, sets in per_q.items():
            n = sum(len(cs[0]) for cs in sets)
            if qid not in self._queues or not n:
                continue
            # the columns are this snapshot's own copies: written as they are
            parts: list = [jf.QSEQ.pack(qid, n)]
            for i in range(5):
                parts.extend(cs[i] for cs in sets if len(cs[i]))
            recs.append((jf.T_CKPT_QUEUE, parts))
            if len(sets[0]) > 5:
                prios = [cs[5] for cs in sets if len(cs) > 5 and len(cs[5])]
                recs.append((jf.T_CKPT_PRIO,
                             [jf.QSEQ.pack(qid, sum(len(p) for p in prios)), *prios]))
        recs.append(jf.pack_record(jf.T_CKPT_END, b""))
        return recs

    @staticmethod
    def _add_entries(cols, entries, delta: float, delivered: int = 0) -> None:
        seqs, locs, exps, blens, flags = cols[:5]
        prios = cols[5] if len(cols) > 5 else None
        for e in entries:
            if not e.loc:
                continue
            seqs.append(e.seq)
            locs.append(e.loc)
            exps.append(NAN if e.expires_at is None else e.expires_at + delta)
            blens.append(_body_len(e))
            flags.append(jf.count_flags(e.delivery_count, bool(delivered or e.redelivered)))
            if prios is not None:
                prios.append(e.priority)

    def _compact(self) -> int:
        """Rewrite the live messages of old, mostly dead segments at the head of the log.

        A segment older than the previous checkpoint keeps its whole file while any of
        its messages lives. If at least ``compact_dead_fraction`` of it is dead and none
        of its messages left since the previous pass, its live entries are appended
        again (same queue and seq, so replay keeps the newest location) and their
        in-memory locations updated, so the next checkpoint deletes the file: compaction
        writes at most ``1 - compact_dead_fraction`` of the bytes it frees. The bytes are
        counted exactly (record headers) before anything is written, and a compaction
        that would not fit in the free space left is not started.
        """
        if self.broker is None:
            return 0
        limit = int(self.segment_size * (1.0 - self.settings.compact_dead_fraction))
        lower = self._seg_bytes
        # only segments nothing left since the previous pass: one a consumer is draining
        # would be rewritten just before its messages are acked anyway
        prev, self._prev_seg_bytes = self._prev_seg_bytes, dict(lower)
        cands = {s for s in self._seg_live
                 if s < self._ckpt_seg and s < self._seg - 1 and lower.get(s, 0) <= limit
                 and prev.get(s) == lower.get(s)}
        if not cands:
            return 0
        now_wall = time.time()
        entries = []  # (qid, entry, delivered, wall - monotonic)
        sizes = dict.fromkeys(cands, 0)  # exact bytes moving each candidate's entries writes

        def measure(loc, count) -> None:
            buf, off = self._buffer_at(loc)
            sizes[loc >> 32] += jf.HDR_SIZE + jf.HDR.unpack_from(buf, off)[0] \
                + (DELIVERED_MAX if count else 0)

        for q in self._qids:
            delta = now_wall - q.vhost.timers.now()
            for e in q.stored_entries():
                if e.loc and (e.loc >> 32) in cands:
                    entries.append((self._qids[q], e, 0, delta))
            q.relocate_paged(cands, lambda loc, seq, exp, blen, flags: measure(loc, flags) or loc)
        for e, q in self._out.items():
            qid = self._qids.get(q)
            if qid is not None and e.loc and (e.loc >> 32) in cands:
                entries.append((qid, e, 1, now_wall - q.vhost.timers.now()))
        for _qid, e, delivered, _delta in entries:
            measure(e.loc, e.delivery_count or delivered or e.redelivered)
        victims = {s for s, n in sizes.items() if n <= limit}
        if not victims:
            return 0
        planned = sum(sizes[s] for s in victims)
        room = self.segment_size - self._off
        new_segments = 0 if planned <= room else -(-(planned - room) // self.segment_size)
        need = (new_segments + 1) * self.segment_size  # + one of headroom: the log goes on
        free = self._free_bytes()
        if free is not None and free < need:
            log.warning("journal: compaction of %d segments not started: it needs %d bytes "
                        "of disk, %d are free", len(victims), need, free)
            return 0
        moved = 0
        written = 0
        live = self._seg_live
        live_bytes = self._seg_bytes

        def move(qid, entry_loc, seq, exp_wall, prio, blen, count, max_priority=0,
                 two_level=False):
            nonlocal moved, written
            old = entry_loc
            msg = self.read_message(old)
            if max_priority:  # a paged entry: its priority is its message's
                prio = message_priority(msg.properties, max_priority, two_level)
            payload = jf.pack_enq(qid, seq, exp_wall, prio, blen, 0) + encode_message(msg)
            new = self._append(jf.T_ENQ, payload)
            written += jf.HDR_SIZE + len(payload)
            if count:
                payload = jf.pack_delivered(qid, seq, count)
                self._append(jf.T_DELIVERED, payload)
                written += jf.HDR_SIZE + len(payload)
            s_old = old >> 32
            live[s_old] = live.get(s_old, 0) - 1
            live_bytes[s_old] = live_bytes.get(s_old, 0) - ENQ_MIN - blen
            if live[s_old] <= 0:
                live.pop(s_old, None)
                live_bytes.pop(s_old, None)
            s_new = new >> 32
            live[s_new] = live.get(s_new, 0) + 1
            live_bytes[s_new] = live_bytes.get(s_new, 0) + ENQ_MIN + blen
            moved += 1
            return new

        for q, qid in self._qids.items():
            q.relocate_paged(
                victims, lambda loc, seq, exp, blen, flags, qid=qid, mp=q.opts.max_priority,
                tl=q.opts.two_level_priority: move(qid, loc, seq, exp, 0, blen, flags, mp, tl))
        for qid, e, delivered, delta in entries:
            if (e.loc >> 32) not in victims:
                continue
            exp = None if e.expires_at is None else e.expires_at + delta
            e.loc = move(qid, e.loc, e.seq, exp, e.priority, _body_len(e),
                         e.delivery_count or (1 if delivered or e.redelivered else 0))
            if isinstance(e.message, StoredMessage):
                e.message._loc = e.loc  # the old segment goes
        self.compact_written += written
        self._compacted |= victims
        self._prev_seg_bytes = dict(live_bytes)
        if moved:
            log.info("journal: compaction moved %d live messages (%d bytes) out of %d old "
                     "segments", moved, written, len(victims))
        return moved

    def _stored_body_len(self, loc: int) -> int:
        buf, off = self._buffer_at(loc)
        return jf.ENQ.unpack_from(buf, off + jf.HDR_SIZE)[4]

    def _buffer_at(self, loc: int):
        """``(buffer, offset)`` of the record at ``loc``: still buffered, or mapped."""
        seg = loc >> 32
        off = loc & 0xFFFFFFFF
        for chunks in (self._pending, self._inflight):
            for cseg, start, buf in chunks:
                if cseg == seg and start <= off < start + len(buf):
                    return buf, off - start
        m = self._maps.get(seg)
        if m is None or off + jf.HDR_SIZE + jf.ENQ.size > len(m):
            m = self._map(seg)
        return m, off

    def _free_bytes(self) -> int | None:
        try:
            st = os.statvfs(self.jdir)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    async def checkpoint(self) -> None:
        """Write a checkpoint covering everything appended so far, then drop dead segments."""
        if self.broker is None:
            return
        self._ckpt_wanted = False
        self._compact()
        self._bytes_since_ckpt = 0
        self._records_since_ckpt = 0
        recs = self._snapshot()
        ck_seg = self._seg
        await self._flush_once()  # everything the checkpoint covers is on disk first
        if self._failed is not None:
            return
        live = set(self._seg_live)
        path = os.path.join(self.jdir, "checkpoint")

        def write():
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                for r in recs:
                    if type(r) is tuple:  # a queue's columns: packed here (_snapshot)
                        for part in jf.pack_record_parts(*r):
                            f.write(part)
                    else:
                        f.write(r)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            dfd = os.open(self.jdir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
            dropped = []
            for seg in jf.list_segments(self.jdir):
                if seg < ck_seg and seg not in live:
                    fd = self._fds.pop(seg, None)
                    if fd is not None:
                        os.close(fd)
                    seg_path = os.path.join(self.jdir, jf.seg_name(seg))
                    size = os.path.getsize(seg_path)
                    os.unlink(seg_path)
                    dropped.append((seg, size))
            return dropped

        try:
            dropped = await trio.to_thread.run_sync(write)
        except OSError as exc:
            log.warning("journal: checkpoint failed: %s", exc)
            return
        self._ckpt_seg = ck_seg
        for seg, size in dropped:
            if seg in self._compacted:
                self._compacted.discard(seg)
                self.compact_freed += size
            m = self._maps.pop(seg, None)
            if m is not None:
                try:
                    m.close()
                except BufferError:
                    pass
        if dropped:
            log.info("journal: checkpoint at segment %d; removed %d fully acked segments",
                     ck_seg, len(dropped))

    # ------------------------------------------------------------------ tools
    @classmethod
    def inspect(cls, data_dir: str, out) -> int:
        from .tools import inspect_journal
        return inspect_journal(data_dir, out)
