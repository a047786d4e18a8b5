"""The journal's content as recovery reads it: per queue, its live entries as columns
(checkpoint arrays plus replayed records), definitions and metadata; per segment, live counts.
Does not read files (load.py)."""
from __future__ import annotations

from array import array
from collections import Counter
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from .. import journal_format as jf
from .common import ENQ_MIN, NAN

if TYPE_CHECKING:
    from ...queues.queue import Queue
    from ..journal_format import Buf, ScanResult
    from ..records import BindingDef, ExchangeDef, QueueDef


def _columns(queue: Queue | None = None) -> list[array[Any]]:
    """Empty (seqs, locs, exps, blens, flags) arrays of a checkpoint queue record, plus
    the priorities (T_CKPT_PRIO) for a priority queue."""
    cols: list[array[Any]] = [array("q"), array("q"), array("d"), array("I"), array("B")]
    if queue is not None and queue.opts.max_priority:
        cols.append(array("B"))
    return cols


def _count_live(live: dict[int, int], live_bytes: dict[int, int], locs: array[int],
                blens: array[int]) -> None:
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

    def __init__(self, qdef: QueueDef) -> None:
        self.qdef = qdef
        # (seqs, locs, exps, blens, flags) arrays from the checkpoint
        self.base: tuple[array[Any], ...] | None = None
        # priorities of the base entries (T_CKPT_PRIO), if written
        self.base_prio: array[int] | None = None
        self.removed: set[int] = set()  # seqs of base entries removed after the checkpoint
        self.delivered: dict[int, int] = {}  # seq of a base entry delivered after the checkpoint -> flags
        self.new: dict[int, list[Any]] = {}  # seq -> [loc, exp, prio, blen, flags]

    @property
    def priorities_known(self) -> bool:
        """Whether ``entries()`` has every entry's priority (format-1 checkpoints lack
        those of their entries)."""
        return self.base is None or self.base_prio is not None

    def count(self) -> int:
        if self.base is None:
            return len(self.new)
        return len(self.entries())

    def columns(self, by_level: bool = False) -> tuple[array[Any], ...]:
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

    def _columns_unchanged(self, by_level: bool) -> tuple[array[Any], ...] | None:
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
        extra: dict[int, tuple[Any, ...]] = {}  # seq -> (loc, exp, prio, blen, flags), rows outside the run
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

    def entries(self) -> list[tuple[Any, ...]]:
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

    def __init__(self) -> None:
        self.exchanges: dict[tuple[str, str], ExchangeDef] = {}
        self.queues: dict[int, QueueState] = {}
        self.bindings: dict[tuple[str, str, str, str, str, bytes], BindingDef] = {}
        self.meta: dict[tuple[str, str], str | None] = {}  # (kind, key) -> value JSON text
        self.next_qid = 1
        self.max_msg_id = 0
        self.ckpt_pos = (0, 0)
        # (seg, ScanResult, record count by type)
        self.segments: list[tuple[int, ScanResult, dict[int, int]]] = []
        self.last_seg = 0
        self.last_end = 0
        self.records = 0
        self.skipped: list[tuple[str, int, int, str]] = []  # repair: (file, offset, length, reason)

    def apply(self, rtype: int, payload: Buf, loc: int, prio_of: object = None) -> None:
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

    def queue_defs(self) -> list[QueueDef]:
        return [qs.qdef for qs in self.queues.values()]
