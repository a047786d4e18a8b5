"""The embedded default store: an append-only journal of CRC-checked records.

See docs/durability.md. In short:

* ``data/journal/NNNNNNNN.log`` segments (32 MiB, preallocated) hold records
  (journal_format). The core's calls (enqueue/delivered/remove/save_*) only
  append to an in-memory buffer and return.
* ``run()`` writes the buffer with pwrite and one fdatasync in a worker thread
  (group commit) and then runs the ``when_durable`` callbacks of everything the
  write covered. flush="async" writes every 100 ms and confirms at once.
* A checkpoint (definitions + live entries of every durable queue + the log
  position) is written every CHECKPOINT_BYTES of log and at shutdown; recovery
  loads it and replays only the records after it. Segments before the
  checkpoint whose messages are all gone are deleted.
* Durable FIFO queues use ``paged.PagedFifo``: beyond a memory budget only a
  compact index stays in memory; bodies are read back from the segments (mmap).
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import mmap
import os
import time
from array import array

import trio

from ..queues.fifo import FifoReady
from . import journal_format as jf
from .base import Store, StoreUnavailable
from .paged import PagedFifo
from .records import (BindingDef, ExchangeDef, QueueDef, binding_def, decode_message,
                      encode_message, exchange_def, queue_def)

log = logging.getLogger("broker.journal")

CHECKPOINT_BYTES = int(os.environ.get("TRIOMQ_JOURNAL_CHECKPOINT_BYTES", 64 * 1024 * 1024))
COMPACT_MAX_LIVE = 2000  # rewrite forward the live messages of old segments holding at most this many
ASYNC_INTERVAL = 0.1  # seconds between fsyncs with flush="async"
NAN = float("nan")


class QueueState:
    """Live entries of one queue while loading (checkpoint arrays + replayed records)."""
    __slots__ = ("qdef", "base", "removed", "delivered", "new")

    def __init__(self, qdef):
        self.qdef = qdef
        self.base = None          # (seqs, locs, exps, blens, flags) arrays from the checkpoint
        self.removed = set()      # seqs of base entries removed after the checkpoint
        self.delivered = set()    # seqs of base entries delivered after the checkpoint
        self.new = {}             # seq -> [loc, exp, prio, blen, flags]

    def count(self) -> int:
        if self.base is None:
            return len(self.new)
        return len(self.entries())

    def entries(self):
        """Sorted (seq, loc, exp, prio, blen, flags)."""
        out = []
        if self.base is not None:
            seqs, locs, exps, blens, flags = self.base
            removed, delivered, newer = self.removed, self.delivered, self.new
            for i in range(len(seqs)):
                s = seqs[i]
                if s in removed or s in newer:  # newer: rewritten forward by compaction
                    continue
                out.append((s, locs[i], exps[i], 0, blens[i], flags[i] | (1 if s in delivered else 0)))
        for s, (loc, exp, prio, blen, fl) in self.new.items():
            out.append((s, loc, NAN if exp is None else exp, prio, blen, fl))
        out.sort(key=lambda t: t[0])
        return out


class JournalState:
    """Everything loaded from disk: definitions, live entries, scan results."""

    def __init__(self):
        self.exchanges: dict = {}   # (vhost, name) -> ExchangeDef
        self.queues: dict = {}      # qid -> QueueState
        self.bindings: dict = {}    # binding_key -> BindingDef
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
        elif rtype == jf.T_REMOVE or rtype == jf.T_DELIVERED:
            qid, seq = jf.QSEQ.unpack_from(payload, 0)
            qs = self.queues.get(qid)
            if qs is None:
                return
            item = qs.new.get(seq)
            if rtype == jf.T_REMOVE:
                if item is not None:
                    del qs.new[seq]
                if qs.base is not None:
                    qs.removed.add(seq)
            else:
                if item is not None:
                    item[4] = 1
                if qs.base is not None:
                    qs.delivered.add(seq)
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
    with open(path, "rb") as f:
        data = f.read()
    recs = []
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
                a.frombytes(bytes(payload[pos:pos + n * size]))
                pos += n * size
                arrs.append(a)
            qs = state.queues.get(qid)
            if qs is not None:
                qs.base = tuple(arrs)
        elif rtype in (jf.T_EXCHANGE, jf.T_QUEUE, jf.T_BINDING):
            state.apply(rtype, payload, 0)
    return True


def load_state(jdir: str, salvage: bool = False, use_checkpoint: bool = True,
               scan_old: bool = False) -> JournalState:
    """Read checkpoint + segments. Raises StoreUnavailable on corruption (unless salvage)."""
    state = JournalState()
    if use_checkpoint:
        try:
            load_checkpoint(jdir, state)
        except StoreUnavailable:
            if not salvage:
                raise
            state = JournalState()
            state.skipped.append((os.path.join(jdir, "checkpoint"), 0, 0, "damaged checkpoint ignored"))
    segs = jf.list_segments(jdir)
    ck_seg, ck_off = state.ckpt_pos
    scans = []
    for seg in segs:
        path = os.path.join(jdir, jf.seg_name(seg))
        replay = seg >= ck_seg
        if not replay and not (scan_old or salvage):
            res = jf.ScanResult(path)
            res.end = os.path.getsize(path)
            scans.append((seg, res, {}))
            continue
        buf = _read_file(path)
        recs = []
        start = ck_off if seg == ck_seg else 0
        # segments before the checkpoint are only checked up to where they end
        res = jf.scan(buf, path, start=start if replay else 0, records=recs, salvage=salvage)
        counts = {}
        if replay:
            for off, rtype, payload in recs:
                state.apply(rtype, payload, jf.make_loc(seg, off))
                counts[rtype] = counts.get(rtype, 0) + 1
            state.records += len(recs)
        else:
            for _off, rtype, _p in recs:
                counts[rtype] = counts.get(rtype, 0) + 1
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

    def __init__(self, data_dir: str, flush: str = "sync", segment_size: int | None = None):
        if segment_size is None:
            segment_size = int(os.environ.get("TRIOMQ_JOURNAL_SEGMENT_SIZE", jf.SEGMENT_SIZE))
        self.data_dir = data_dir
        self.jdir = os.path.join(data_dir, "journal")
        self.flush = flush
        self.segment_size = segment_size
        self.broker = None
        self._state: JournalState | None = None
        self._lock_fd = None
        # writing
        self._seg = 1
        self._off = 0
        self._pending: list = []   # [seg, start offset, bytearray]
        self._inflight: list = []
        self._callbacks: list = []
        self._dirty = None
        self._fds: dict = {}       # used only by the writer thread
        self._maps: dict = {}      # seg -> mmap for reading bodies
        self._last_msg = None
        self._last_msg_loc = 0
        self._seg_live: dict = {}
        self._max_msg_id = 0
        self._bytes_since_ckpt = 0
        self._ckpt_wanted = False
        self._failed: OSError | None = None
        # definitions (for checkpoints)
        self._exchanges: dict = {}
        self._queues: dict = {}    # qid -> QueueDef
        self._bindings: dict = {}
        self._next_qid = 1
        self._ckpt_seg = 0

    # ------------------------------------------------------------------ life cycle
    async def open(self) -> None:
        try:
            os.makedirs(self.jdir, exist_ok=True)
            self._lock_fd = os.open(os.path.join(self.jdir, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreUnavailable(f"cannot open journal in {self.jdir}: {exc.strerror}")
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise StoreUnavailable(f"journal {self.jdir} is in use by another broker process")
        t0 = time.monotonic()
        state = await trio.to_thread.run_sync(load_state, self.jdir)
        self._state = state
        # truncate a torn tail
        for seg, res, _c in state.segments:
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
        from .recovery import restore
        from ..message import set_message_id_floor
        self.broker = broker
        state = self._state
        if state is None:
            return
        self._exchanges = dict(state.exchanges)
        self._bindings = dict(state.bindings)
        restore(broker, list(state.exchanges.values()), state.queue_defs(),
                list(state.bindings.values()), [], {})
        now_wall = time.time()
        total = 0
        live = self._seg_live
        for qid, qs in state.queues.items():
            qd = qs.qdef
            self._queues[qid] = qd
            vhost = broker.vhosts.get(qd.vhost)
            q = vhost.queues.get(qd.name) if vhost is not None else None
            if q is None or not q.durable:
                continue
            q._journal_qid = qid
            entries = qs.entries()
            if not entries:
                continue
            for e in entries:
                s = e[1] >> 32
                live[s] = live.get(s, 0) + 1
            total += len(entries)
            if isinstance(q.ready, FifoReady) and not q.opts.max_priority:
                pf = PagedFifo(self, vhost.timers)
                q.ready = pf
                pf.extend_paged(array("q", [e[0] for e in entries]), array("q", [e[1] for e in entries]),
                                array("d", [e[2] for e in entries]), array("I", [e[4] for e in entries]),
                                array("B", [e[5] for e in entries]))
                q.ready_bytes += sum(e[4] for e in entries)
                q._next_seq = max(q._next_seq, entries[-1][0] + 1)
                q.stats_published += len(entries)
                if any(e[2] == e[2] for e in entries):  # some expiry (not NaN)
                    q._expiry.arm()
            else:
                from ..queues.entry import QueueEntry
                for seq, loc, exp, prio, blen, fl in entries:
                    msg = self.read_message(loc)
                    expires_at = None
                    if exp == exp:
                        expires_at = vhost.timers.now() + (exp - now_wall)
                    if q.opts.max_priority:
                        prio = min(msg.properties.get("priority") or 0, q.opts.max_priority)
                    entry = QueueEntry(msg, seq, expires_at, prio)
                    entry.loc = loc
                    entry.redelivered = bool(fl)
                    q.enqueue(msg, entry=entry)
        set_message_id_floor(self._max_msg_id)
        log.info("journal: recovered %d persistent messages", total)
        if state.records > 10000:
            self._ckpt_wanted = True
        self._state = None

    async def run(self) -> None:
        self._dirty = trio.Event()
        if self._pending or self._callbacks:
            self._dirty.set()
        while True:
            if self.flush == "async":
                await trio.sleep(ASYNC_INTERVAL)
            else:
                await self._dirty.wait()
                self._dirty = trio.Event()
            await self._flush_once()
            if self._failed is None and (self._ckpt_wanted or self._bytes_since_ckpt >= CHECKPOINT_BYTES):
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
        if self._dirty is not None:
            self._dirty.set()
        return (seg << 32) | off

    def when_durable(self, callback, on_failure=None) -> None:
        # A failed write is retried, never skipped; the affected connections are closed
        # with 541 (see _write_failed), so on_failure is not needed here.
        if self.flush == "async":
            callback()
            return
        self._callbacks.append(callback)
        if self._dirty is not None:
            self._dirty.set()

    async def _flush_once(self) -> None:
        chunks = self._pending
        cbs = self._callbacks
        if not chunks and not cbs:
            return
        self._pending = []
        self._callbacks = []
        self._inflight = chunks
        try:
            if chunks:
                await trio.to_thread.run_sync(self._write_chunks, chunks)
        except OSError as exc:
            self._inflight = []
            self._pending = chunks + self._pending
            self._callbacks = cbs + self._callbacks
            self._write_failed(exc)
            await trio.sleep(1.0)
            if self._dirty is not None:
                self._dirty.set()
            return
        self._inflight = []
        if self._failed is not None:
            log.warning("journal: writes succeed again after %s", self._failed)
            self._failed = None
            if self.broker is not None:
                self.broker.set_alarm("journal", False)
        for cb in cbs:
            try:
                cb()
            except Exception:  # pragma: no cover - a confirm for a closed channel
                log.exception("journal: durable callback failed")

    def _write_failed(self, exc: OSError) -> None:
        first = self._failed is None
        self._failed = exc
        reason = "no space left on device" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        if first:
            log.error("journal: write failed (%s); unconfirmed publishes are not confirmed, "
                      "closing connections with 541 and blocking publishers until writes succeed",
                      reason)
        if self.broker is not None:
            self.broker.set_alarm("journal", True)
            for session in list(self.broker.sessions):
                has_pending = any(ch.confirm and ch._unconfirmed for ch in session.channels.values())
                if has_pending or first:
                    try:
                        session.force_close(541, f"INTERNAL_ERROR - journal write failed: {reason}")
                    except Exception:  # pragma: no cover
                        log.exception("journal: could not close a session")

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
    def read_message(self, loc: int):
        seg = loc >> 32
        off = loc & 0xFFFFFFFF
        for chunks in (self._pending, self._inflight):
            for cseg, start, buf in chunks:
                if cseg == seg and start <= off < start + len(buf):
                    return self._decode_at(buf, off - start)
        m = self._maps.get(seg)
        if m is None or off + jf.HDR_SIZE > len(m):
            m = self._map(seg)
        return self._decode_at(m, off)

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
        queue._journal_qid = qid
        self._queues[qid] = qd
        self._append(jf.T_QUEUE, jf.pack_queue(qd, qid))

    def delete_queue(self, vhost, queue) -> None:
        qid = getattr(queue, "_journal_qid", None)
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

    # ------------------------------------------------------------------ messages
    def enqueue(self, queue, entry) -> None:
        qid = getattr(queue, "_journal_qid", None)
        if qid is None:
            self.save_queue(queue.vhost, queue)
            qid = queue._journal_qid
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
        if type(queue.ready) is FifoReady:
            queue.ready = PagedFifo(self, queue.vhost.timers, entries=queue.ready.clear())

    def delivered(self, queue, entry) -> None:
        qid = getattr(queue, "_journal_qid", None)
        if qid is not None and entry.loc:
            self._append(jf.T_DELIVERED, jf.QSEQ.pack(qid, entry.seq))

    def remove(self, queue, entry) -> None:
        loc = entry.loc
        if not loc:
            return
        qid = getattr(queue, "_journal_qid", None)
        if qid is not None:
            self._append(jf.T_REMOVE, jf.QSEQ.pack(qid, entry.seq))
        seg = loc >> 32
        live = self._seg_live
        n = live.get(seg, 0) - 1
        if n > 0:
            live[seg] = n
        else:
            live.pop(seg, None)
            m = self._maps.pop(seg, None)
            if m is not None:  # nothing left to read there: drop its mapped pages from RSS
                try:
                    m.close()
                except BufferError:  # pragma: no cover
                    self._maps[seg] = m
        entry.loc = 0

    # ------------------------------------------------------------------ checkpoints & GC
    def _snapshot(self) -> list:
        """Checkpoint records describing the current state (taken synchronously)."""
        broker = self.broker
        now_wall = time.time()
        per_q: dict = {}
        for vhost in broker.vhosts.values():
            delta = now_wall - vhost.timers.now()
            for q in vhost.queues.values():
                qid = getattr(q, "_journal_qid", None)
                if qid is None or q.store is not self:
                    continue
                cols = per_q.setdefault(qid, [array("q"), array("q"), array("d"), array("I"),
                                              array("B")])
                ready = q.ready
                heads = ready.head_entries() if isinstance(ready, PagedFifo) else list(ready)
                self._add_entries(cols, heads, delta)
                retry = getattr(q, "retry", None)
                if retry is not None and getattr(retry, "waiting", None):
                    # rejected messages waiting for their retry delay (queues/retry.py)
                    self._add_entries(cols, list(retry.waiting), delta, delivered=1)
                if isinstance(ready, PagedFifo) and ready.paged_count:
                    seqs, locs, exps, blens, flags = ready.snapshot_paged()
                    if ready._pinned:
                        keep = [i for i in range(len(locs)) if locs[i]]
                        seqs = array("q", [seqs[i] for i in keep])
                        locs = array("q", [locs[i] for i in keep])
                        exps = array("d", [exps[i] for i in keep])
                        blens = array("I", [blens[i] for i in keep])
                        flags = array("B", [flags[i] for i in keep])
                    for c, a in zip(cols, (seqs, locs, exps, blens, flags)):
                        c.extend(a)
        for session in list(broker.sessions):
            for ch in list(session.channels.values()):
                for u in list(ch.unacked.values()):
                    q = u.queue
                    qid = getattr(q, "_journal_qid", None)
                    if qid is None or q.store is not self or not u.entry.loc:
                        continue
                    cols = per_q.setdefault(qid, [array("q"), array("q"), array("d"), array("I"),
                                                  array("B")])
                    self._add_entries(cols, [u.entry], now_wall - q.vhost.timers.now(), delivered=1)
        recs = [jf.pack_record(jf.T_CKPT_HEAD, json.dumps(
            {"seg": self._seg, "off": self._off, "next_qid": self._next_qid,
             "max_msg_id": self._max_msg_id, "time": now_wall}).encode())]
        for xd in self._exchanges.values():
            recs.append(jf.pack_record(jf.T_EXCHANGE, jf.pack_exchange(xd)))
        for qid, qd in self._queues.items():
            recs.append(jf.pack_record(jf.T_QUEUE, jf.pack_queue(qd, qid)))
        for bd in self._bindings.values():
            recs.append(jf.pack_record(jf.T_BINDING, jf.pack_binding(bd)))
        for qid, cols in per_q.items():
            if qid not in self._queues or not len(cols[0]):
                continue
            recs.append(jf.pack_record(jf.T_CKPT_QUEUE, b"".join(
                [jf.QSEQ.pack(qid, len(cols[0]))] + [c.tobytes() for c in cols])))
        recs.append(jf.pack_record(jf.T_CKPT_END, b""))
        return recs

    @staticmethod
    def _add_entries(cols, entries, delta: float, delivered: int = 0) -> None:
        seqs, locs, exps, blens, flags = cols
        for e in entries:
            if not e.loc:
                continue
            seqs.append(e.seq)
            locs.append(e.loc)
            exps.append(NAN if e.expires_at is None else e.expires_at + delta)
            blens.append(len(e.message.body))
            flags.append(1 if (delivered or e.redelivered or e.delivery_count) else 0)

    def _compact(self) -> int:
        """Rewrite the few live messages of old, mostly-dead segments at the head of the log.

        A segment older than the previous checkpoint whose live entries are at most
        COMPACT_MAX_LIVE keeps a whole 32 MiB file alive; its entries are appended
        again (same queue and seq, so replay keeps the newest location) and their
        in-memory locations updated, so the next checkpoint can delete the file.
        """
        victims = {s for s, n in self._seg_live.items()
                   if s < self._ckpt_seg and s < self._seg - 1 and n <= COMPACT_MAX_LIVE}
        if not victims or self.broker is None:
            return 0
        moved = 0
        live = self._seg_live

        def move(q, entry_loc, seq, exp_wall, prio, blen, delivered):
            nonlocal moved
            old = entry_loc
            msg = self.read_message(old)
            new = self._append(jf.T_ENQ, jf.pack_enq(q._journal_qid, seq, exp_wall, prio, blen, 0)
                               + encode_message(msg))
            if delivered:
                self._append(jf.T_DELIVERED, jf.QSEQ.pack(q._journal_qid, seq))
            s_old = old >> 32
            live[s_old] = live.get(s_old, 0) - 1
            if live[s_old] <= 0:
                live.pop(s_old, None)
            s_new = new >> 32
            live[s_new] = live.get(s_new, 0) + 1
            moved += 1
            return new

        now_wall = time.time()
        entries = []  # (queue, entry, delivered)
        for vhost in self.broker.vhosts.values():
            delta = now_wall - vhost.timers.now()
            for q in vhost.queues.values():
                if getattr(q, "_journal_qid", None) is None or q.store is not self:
                    continue
                ready = q.ready
                heads = ready.head_entries() if isinstance(ready, PagedFifo) else list(ready)
                for e in heads:
                    if e.loc and (e.loc >> 32) in victims:
                        entries.append((q, e, 0, delta))
                retry = getattr(q, "retry", None)
                if retry is not None and getattr(retry, "waiting", None):
                    for e in list(retry.waiting):
                        if e.loc and (e.loc >> 32) in victims:
                            entries.append((q, e, 1, delta))
                if isinstance(ready, PagedFifo) and ready.paged_count:
                    locs = ready._loc
                    for i in range(ready._pi, len(locs)):
                        loc = locs[i]
                        if loc and (loc >> 32) in victims:
                            exp = ready._exp[i]
                            locs[i] = move(q, loc, ready._seq[i], None if exp != exp else exp, 0,
                                           ready._blen[i], ready._flags[i])
        for session in list(self.broker.sessions):
            for ch in list(session.channels.values()):
                for u in list(ch.unacked.values()):
                    e = u.entry
                    if e.loc and (e.loc >> 32) in victims and u.queue.store is self \
                            and getattr(u.queue, "_journal_qid", None) is not None:
                        entries.append((u.queue, e, 1, now_wall - u.queue.vhost.timers.now()))
        for q, e, delivered, delta in entries:
            exp = None if e.expires_at is None else e.expires_at + delta
            e.loc = move(q, e.loc, e.seq, exp, e.priority, len(e.message.body),
                         delivered or e.redelivered or e.delivery_count)
        if moved:
            log.info("journal: compaction moved %d live messages out of %d old segments",
                     moved, len(victims))
        return moved

    async def checkpoint(self) -> None:
        """Write a checkpoint covering everything appended so far, then drop dead segments."""
        if self.broker is None:
            return
        self._ckpt_wanted = False
        self._compact()
        self._bytes_since_ckpt = 0
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
                    os.unlink(os.path.join(self.jdir, jf.seg_name(seg)))
                    dropped.append(seg)
            return dropped

        try:
            dropped = await trio.to_thread.run_sync(write)
        except OSError as exc:
            log.warning("journal: checkpoint failed: %s", exc)
            return
        self._ckpt_seg = ck_seg
        for seg in dropped:
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
