"""Compaction: rewriting the live messages of mostly dead old segments, when the disk has
room for it. Does not checkpoint (checkpoint.py calls it)."""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, cast

from ...queues.priority import message_priority
from .. import journal_format as jf
from ..records import encode_message
from .common import DELIVERED_MAX, ENQ_MIN, log
from .shared import JournalStoreState
from .stored import StoredMessage, _body_len

if TYPE_CHECKING:
    from ...queues.ready import Relocate


class Compaction(JournalStoreState):
    """The store's segment compaction."""

    def _compact(self) -> int:
        """Rewrite the live messages of old, mostly dead segments at the head of the log.

        A segment older than the previous checkpoint keeps its whole file while any of
        its messages lives. If at least ``compact_dead_fraction`` of it is dead and none
        of its messages left since the previous pass, its live entries are appended
        again (same queue and seq, so replay keeps the newest location) and their
        in-memory locations updated, so the next checkpoint deletes the file: compaction
        writes at most ``1 - compact_dead_fraction`` of the bytes it frees. The bytes are
        counted exactly (record headers) before anything is written, and a compaction
        that would not fit in the free space left is not started. A pass moves at most half
        a checkpoint interval of records (the rest waits for the next checkpoint's pass),
        so a kill -9 before its checkpoint leaves a bounded log to replay.
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
        records = dict.fromkeys(cands, 0)  # and the records

        def measure(loc: int, count: int) -> int:
            buf, off = self._buffer_at(loc)
            sizes[loc >> 32] += jf.HDR_SIZE + jf.HDR.unpack_from(buf, off)[0] \
                + (DELIVERED_MAX if count else 0)
            records[loc >> 32] += 2 if count else 1
            return loc  # unchanged: measuring moves nothing

        for q in self._qids:
            delta = now_wall - q.vhost.timers.now()
            for e in q.stored_entries():
                if e.loc and (e.loc >> 32) in cands:
                    entries.append((self._qids[q], e, 0, delta))
            q.relocate_paged(cands, lambda loc, seq, exp, blen, flags: measure(loc, flags))
        for e, q in self._out.items():
            qid = self._qids.get(q)
            if qid is not None and e.loc and (e.loc >> 32) in cands:
                entries.append((qid, e, 1, now_wall - q.vhost.timers.now()))
        for _qid, e, delivered, _delta in entries:
            measure(e.loc, e.delivery_count or delivered or e.redelivered)
        parked = [row for row in self._parked_rows() if (row[3] >> 32) in cands]
        for row in parked:
            measure(row[3], row[7])
        # A kill -9 before the checkpoint that follows replays what this pass appends, on
        # top of the checkpoint interval: oldest segments first, at most half an interval
        # of records (at least one segment, whatever it holds: the bound stays a constant)
        victims: set[int] = set()
        budget = max(1, self.settings.checkpoint_records // 2)
        for s in sorted(s for s, n in sizes.items() if n <= limit):
            if victims and records[s] > budget:
                break
            victims.add(s)
            budget -= records[s]
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

        def move(qid: int, entry_loc: int, seq: int, exp_wall: float | None, prio: int,
                 blen: int, count: int, max_priority: int = 0, two_level: bool = False) -> int:
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
                victims, cast("Relocate", lambda loc, seq, exp, blen, flags, qid=qid,
                              mp=q.opts.max_priority, tl=q.opts.two_level_priority:
                              move(qid, loc, seq, exp, 0, blen, flags, mp, tl)))
        for qid, e, delivered, delta in entries:
            if (e.loc >> 32) not in victims:
                continue
            exp = None if e.expires_at is None else e.expires_at + delta
            e.loc = move(qid, e.loc, e.seq, exp, e.priority, _body_len(e),
                         e.delivery_count or (1 if delivered or e.redelivered else 0))
            if isinstance(e.message, StoredMessage):
                e.message._loc = e.loc  # the old segment goes
        locs = self._parked.locs
        for slot, qid, seq, loc, exp_wall, prio, blen, count in parked:
            if (loc >> 32) in victims:
                locs[slot] = move(qid, loc, seq, exp_wall, prio, blen, count)
        self.compact_written += written
        self._compacted |= victims
        self._prev_seg_bytes = dict(live_bytes)
        if moved:
            log.info("journal: compaction moved %d live messages (%d bytes) out of %d old "
                     "segments", moved, written, len(victims))
        return moved

    def _free_bytes(self) -> int | None:
        try:
            st = os.statvfs(self.jdir)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize
