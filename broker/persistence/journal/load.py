"""Recovery's reads: the checkpoint, then the segments' records replayed after it, into a
``JournalState``; corruption and torn tails found. Does not restore queues (store.py)."""
from __future__ import annotations

import importlib
import json
import mmap
import os
from array import array
from collections import Counter
from operator import itemgetter
from typing import TYPE_CHECKING

from .. import journal_format as jf
from ..base import StoreUnavailable

if TYPE_CHECKING:
    from ...recovery_progress import RecoveryProgress
from .common import _T_ENQ, _T_ENQ_REF, _T_REMOVE
from .state import JournalState


def _read_file(path: str) -> bytes | mmap.mmap:
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
    recs: list[tuple[int, int, memoryview]] = []
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


def _replay(state: JournalState, recs: list[tuple[int, int, memoryview]], seg_base: int) -> None:
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
    scans: list[tuple[int, jf.ScanResult, dict[int, int]]] = []
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
        recs: list[tuple[int, int, memoryview]] = []
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
        for off, n, why in res.skipped:
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
