"""The journal store's class: open, recovery into the broker, its tasks and close; its other
behaviour is in the mixins of this package. The embedded default store: an append-only
journal of CRC-checked records.

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
  the heap their bodies leave is handed back to the system (``malloc_trim``). Those a
  channel holds past a consumer-timeout sweep are parked: a row of columns each
  (``parked``), the entry rebuilt when it is settled (``parking``).
"""
from __future__ import annotations

import fcntl
import os
import time
from array import array
from collections.abc import Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from ...message import Message
from ...queues.entry import QueueEntry
from ...queues.priority import message_priority
from ...queues.retry import restore_delivery_count
from ..base import StoreUnavailable
from .checkpoint import Checkpoints
from .common import TRIM_AFTER, TRIM_SPACING, UNACKED_PAGE_AFTER, log
from .compaction import Compaction
from .hooks import JournalHooks
from .load import load_state
from .parking import Parking
from .reader import JournalReader
from .state import _count_live
from .writer import JournalWriter

if TYPE_CHECKING:
    from ...broker import Broker
    from ...queues.queue import Queue


class JournalStore(JournalHooks, Parking, Checkpoints, Compaction, JournalWriter, JournalReader):
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

    def recover(self, broker: Broker) -> None:
        from ...message import set_message_id_floor
        from ..recovery import restore, restore_meta
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

    def _entries_of(self, q: Queue, entries: Iterable[tuple[Any, ...]], now_wall: float
                    ) -> Iterator[QueueEntry]:
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

    async def close(self) -> None:
        try:
            await self._flush_once()
            if self._failed is None and self.broker is not None:
                await self.checkpoint()
        finally:
            def _close() -> None:
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

    @classmethod
    def inspect(cls, data_dir: str, out: Any) -> int:
        from ..tools import inspect_journal
        return inspect_journal(data_dir, out)
