"""Appending records to the in-memory buffer and writing it (pwrite + fdatasync in a worker
thread, group commit), confirms after the write, and a failed write's retry and nacks. Does
not decide what a record holds (hooks.py)."""
from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from .. import journal_format as jf
from .common import ASYNC_INTERVAL, fsync_dir, log
from .shared import JournalStoreState

if TYPE_CHECKING:
    from ...queues.entry import QueueEntry
    from ...queues.queue import Queue


class JournalWriter(JournalStoreState):
    """The store's buffer, writer task and ``when_durable``."""

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

    def when_durable(self, callback: Callable[[], object],
                     on_failure: Callable[[], object] | None = None) -> None:
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
        by_queue: dict[Queue, list[QueueEntry]] = {}
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
                fsync_dir(self.jdir)
            # keep only the newest two segments open
            for old in [s for s in self._fds if s < seg - 1]:
                os.close(self._fds.pop(old))
            self._fds[seg] = fd
        return fd

    def _write_chunks(self, chunks: list[list[Any]]) -> None:
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
