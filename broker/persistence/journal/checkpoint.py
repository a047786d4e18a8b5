"""Checkpoints: the snapshot of definitions and live entries taken on the trio thread and
written (with its CRC) in a worker thread, then old segments deleted. Does not compact."""
from __future__ import annotations

import json
import os
import time
from array import array
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

import trio

from .. import journal_format as jf
from ..paged import PagedPriority
from .common import NAN, fsync_dir, log
from .shared import JournalStoreState
from .state import _columns
from .stored import _body_len

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from ...queues.entry import QueueEntry


class Checkpoints(JournalStoreState):
    """The store's checkpoint."""

    def _snapshot(self) -> list[bytes | tuple[int, list[Buffer]]]:
        """Checkpoint records describing the current state (taken synchronously).

        A queue's record is returned as ``(rtype, parts)``: the writer thread packs it
        (``pack_record_parts``: the CRC of a 10M-entry index, ~0.3-0.5 s, off the event
        loop), and each column is written as the pieces it comes in -- the stored entries,
        the paged index's copies, the unsettled deliveries -- without joining them (a
        second copy of the index: ~0.4 s at 10M)."""
        now_wall = time.time()
        # qid -> column sets written one after the other: (seqs, locs, exps, blens, flags),
        # plus priorities for a priority queue
        per_q: dict[int, list[Sequence[Any]]] = {}
        qid: int | None
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
        out: dict[int, list[array[Any]]] = {}
        for e, q in self._out.items():  # delivered, not settled: comes back redelivered
            qid = self._qids.get(q)
            if qid is not None:
                if qid not in out:
                    out[qid] = _columns(q)
                    per_q.setdefault(qid, []).append(out[qid])
                self._add_entries(out[qid], [e], now_wall - q.vhost.timers.now(), delivered=1)
        if self._parked.live:  # the same, parked as rows
            by_qid = {qid: q for q, qid in self._qids.items()}
            for _slot, qid, seq, loc, exp_wall, prio, blen, count in self._parked_rows(by_qid):
                if qid not in out:
                    out[qid] = _columns(by_qid[qid])
                    per_q.setdefault(qid, []).append(out[qid])
                row = out[qid]
                row[0].append(seq)
                row[1].append(loc)
                row[2].append(NAN if exp_wall is None else exp_wall)
                row[3].append(blen)
                row[4].append(jf.count_flags(count, True))
                if len(row) > 5:
                    row[5].append(prio)
        recs: list[bytes | tuple[int, list[Buffer]]] = [jf.pack_record(jf.T_CKPT_HEAD, json.dumps(
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
            parts: list[Buffer] = [jf.QSEQ.pack(qid, n)]
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
    def _add_entries(cols: Sequence[array[Any]], entries: Iterable[QueueEntry], delta: float,
                     delivered: int = 0) -> None:
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

        def write() -> list[tuple[int, int]]:
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                for r in recs:
                    if type(r) is tuple:  # a queue's columns: packed here (_snapshot)
                        for part in jf.pack_record_parts(*r):
                            f.write(part)
                    else:
                        f.write(cast(bytes, r))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_dir(self.jdir)
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
