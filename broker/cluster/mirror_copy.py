"""The mirror side of mirrored and quorum queues: a node's copies of queues mastered
elsewhere (``MirrorCopy``), the ops applied to them, kept on disk (``copylog.py``; a quorum
member's fsynced before its confirm) and read back at start. Not the master side
(``mirror_master.py``) nor promotion (``mirror.Mirrors``)."""
from __future__ import annotations

import logging
import os
import struct
import time
from typing import TYPE_CHECKING

import trio

from .copylog import CopyLog, copy_path, replay
from .mirror_ops import (
    _SEQ,
    ENQUEUES,
    KEEP,
    LEAVES,
    LEFT,
    RESET,
    RETURNED,
    SYNCED,
    pack_copy,
    pack_counts,
    pack_seqs,
    unpack_counts,
    unpack_entries,
    unpack_seqs,
)
from .mirror_policy import replica_group

if TYPE_CHECKING:
    from .store import ClusterStore

log = logging.getLogger("broker.cluster.mirror")


# a group fsync that took less than this (in a thread) is done on the event loop next
# time; one that took longer there goes back to a thread (module ``syncer``)
_INLINE_FSYNC_MAX = 0.002


def _fsync_all(fds: list[int]) -> float:
    """fsync each descriptor; the seconds it took."""
    t0 = time.perf_counter()
    for fd in fds:
        os.fsync(fd)
    return time.perf_counter() - t0


def _sync_dir(path: str) -> None:
    """fsync the directory of ``path`` (a rename into it is durable after this)."""
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class MirrorCopy:
    """A mirror node's copy of a queue: the messages in the queue, by seq."""

    __slots__ = ("commit", "counts", "durable", "entries", "epoch", "keep", "keep_max", "loaded",
                 "log", "master", "synced", "was_synced")

    def __init__(self, epoch: int, master: str, durable: bool = False):
        self.epoch = epoch
        self.durable = durable  # a quorum member's copy: fsynced before each confirm
        self.master = master
        # seq -> (exchange, routing key, raw properties, body), in the queue's order
        self.entries: dict[int, tuple[str, str, bytes, bytes]] = {}
        self.counts: dict[int, int] = {}  # seq -> deliveries returned (RETURNED), if any
        self.synced = False
        self.log: CopyLog | None = None  # on disk (copylog.py), when the store has a directory
        # read from disk at start: never promoted until caught up again (it may lack what
        # the master confirmed while this node was away)
        self.loaded = False
        self.was_synced = False  # a loaded copy was complete when written: it may catch up
        self.keep_max: int | None = None  # a catch-up runs: seqs up to this not kept leave
        self.keep: set[int] = set()
        # the leader's commit index as its ops said it (a quorum queue's): what a promoted
        # copy holds up to it is committed; what lies above is not known to be
        self.commit = 0



class MirrorCopies:
    """This node's copies of queues mastered elsewhere, by (vhost, queue)."""

    def __init__(self, store: ClusterStore):
        self.store = store
        self.copies: dict[tuple[str, str], MirrorCopy] = {}
        self._directory: str | None = None  # where copies are kept on disk (copylog.py)
        # quorum member copies written since their last fsync, and the link confirms that
        # wait for it: one fsync per file for every op that arrived meanwhile (group
        # commit), in a thread, then the confirms (``decided``, ``syncer``)
        self._unsynced: dict[str, CopyLog] = {}
        self._sync_waiting: list = []
        self._sync_wake = trio.Event()
        # the disk answered the last group fsync within _INLINE_FSYNC_MAX: the next one
        # runs on the event loop (no hand-off to a thread and back for each round of ops)
        self.fsync_inline = False
        self.caught_up = 0  # syncs that started from the mirror's own copy (tests, status)

    # ---- copies on disk ----
    def directory(self) -> str | None:
        if self._directory is None:
            path = self.store.sidecar_path("mirror-copies")
            if path is None:
                return None
            os.makedirs(path, exist_ok=True)
            self._directory = path
        return self._directory

    def _new_log(self, vhost: str, queue: str, copy: MirrorCopy) -> None:
        directory = self.directory()
        if directory is None:
            return
        try:
            copy.log = CopyLog.create(copy_path(directory, vhost, queue), {
                "vhost": vhost, "queue": queue, "epoch": copy.epoch, "master": copy.master},
                durable=copy.durable)
        except OSError as exc:
            log.warning("copy of queue %r not kept on disk: %s", queue, exc)
            copy.log = None

    def _write(self, vhost: str, queue: str, copy: MirrorCopy, kind: bytes,
               payload: bytes) -> None:
        if copy.log is None:
            return
        try:
            copy.log.append(kind, payload)
            if copy.durable:
                self._unsynced[copy.log.path] = copy.log
            if copy.log.wants_compaction():
                self._rewrite(vhost, queue, copy)
        except OSError as exc:  # the copy stays good in memory; a restart resyncs it
            log.warning("copy of queue %r not kept on disk: %s", queue, exc)
            copy.log.remove()
            copy.log = None

    def _rewrite(self, vhost: str, queue: str, copy: MirrorCopy) -> None:
        """The file rewritten from the copy (compaction, and the end of a catch-up)."""
        if copy.log is None:
            return
        path = copy.log.path
        copy.log.close()
        tmp = CopyLog.create(path + ".tmp", {"vhost": vhost, "queue": queue,
                                             "epoch": copy.epoch, "master": copy.master})
        body = pack_copy(copy.entries)
        tmp.append(b"E", body)
        copy.counts = {seq: n for seq, n in copy.counts.items() if seq in copy.entries}
        if copy.counts:
            tmp.append(b"C", pack_counts(copy.counts))
        if copy.synced:
            tmp.append(b"S", b"")
        if copy.durable:
            tmp.sync()
        size = tmp.size
        tmp.close()
        os.replace(path + ".tmp", path)
        if copy.durable:
            _sync_dir(path)
        copy.log = CopyLog(path, size, durable=copy.durable)
        copy.log.live = len(body)

    def _forget(self, key: tuple[str, str]) -> None:
        copy = self.copies.pop(key, None)
        if copy is not None and copy.log is not None:
            copy.log.remove()
            copy.log = None

    def load(self) -> None:
        """The copies kept on disk (``ClusterStore.recover``, after the proxies exist): a
        copy of a queue that is a proxy here is kept to catch up from; any other is
        dropped (the queue is gone, or mastered here now)."""
        directory = self.directory()
        broker = self.store.broker
        if directory is None or broker is None:
            return
        from .forward import ProxyQueue
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if not name.endswith(".copy"):
                if name.endswith(".tmp"):
                    os.unlink(path)
                continue
            got = replay(path)
            header = got[0] if got is not None else {}
            vhost = broker.vhosts.get(header.get("vhost"))
            queue = header.get("queue")
            if got is None or vhost is None or not isinstance(vhost.queues.get(queue),
                                                               ProxyQueue):
                os.unlink(path)
                continue
            _header, records, size = got
            copy = MirrorCopy(int(header.get("epoch", 0)), str(header.get("master", "")),
                              durable=self._quorum(vhost.name, str(queue)))
            try:
                for kind, payload in records:
                    if kind == b"E":
                        copy.entries.update(unpack_entries(payload))
                    elif kind == b"L":
                        for seq in unpack_seqs(payload):
                            copy.entries.pop(seq, None)
                            copy.counts.pop(seq, None)
                    elif kind == b"C":
                        copy.counts.update(unpack_counts(payload))
                    elif kind == b"S":
                        copy.was_synced = True
                    elif kind == b"U":
                        copy.was_synced = False
            except (struct.error, UnicodeError):
                os.unlink(path)
                continue
            copy.loaded = True
            copy.log = CopyLog(path, size, durable=copy.durable)
            copy.log.live = sum(len(e[2]) + len(e[3]) for e in copy.entries.values())
            self.copies[(vhost.name, str(queue))] = copy
            log.info("queue %r in vhost %r: copy of epoch %d read from disk (%d messages, %s)",
                     queue, vhost.name, copy.epoch, len(copy.entries),
                     "complete" if copy.was_synced else "incomplete")

    def _quorum(self, vhost: str, queue: str) -> bool:
        broker = self.store.broker
        v = broker.vhosts.get(vhost) if broker is not None else None
        q = v.queues.get(queue) if v is not None else None
        return q is not None and replica_group(q)

    def copy_info(self, vhost: str, queue: str) -> dict | None:
        """What a master's probe is told of this node's copy of a queue."""
        copy = self.copies.get((vhost, queue))
        if copy is None:
            return None
        return {"epoch": copy.epoch, "max_seq": max(copy.entries, default=0),
                "complete": (copy.synced or copy.was_synced) and copy.keep_max is None}
    # ---- mirror role: ops from a master's link (forward.forwarded_publish) ----
    def apply(self, vhost: str, queue: str, header: list, routing_key: str = "",
              body: bytes = b"") -> bool:
        """Apply one op; False (nacked) when it is not of this copy's epoch."""
        try:
            epoch, op, master = int(header[0]), int(header[1]), header[3]
            durable = header[2] == 1  # a quorum queue's op: the copy is fsynced
        except (TypeError, ValueError, IndexError):
            return False
        if isinstance(master, bytes):
            master = master.decode()
        key = (vhost, queue)
        copy = self.copies.get(key)
        if op == RESET:
            if copy is not None and copy.epoch > epoch:
                return False  # a deposed master
            if copy is not None and copy.log is not None:
                copy.log.remove()
            # the flag, or this node's proxy of the queue (from a node that sends 0)
            copy = self.copies[key] = MirrorCopy(epoch, str(master),
                                                 durable=durable or self._quorum(vhost, queue))
            self._new_log(vhost, queue, copy)
            return True
        if copy is None or copy.epoch != epoch:
            return False
        if len(header) > 4:
            try:
                commit = int(header[4])
            except (TypeError, ValueError):
                return False
            if commit > copy.commit:
                copy.commit = commit
        if op == LEFT:
            entries = copy.entries
            try:
                seqs = unpack_seqs(body)
            except struct.error:
                return False
            gone = 0
            for seq in seqs:
                copy.counts.pop(seq, None)
                e = entries.pop(seq, None)
                if e is not None:
                    gone += len(e[2]) + len(e[3])
            if copy.log is not None:
                copy.log.live -= gone
            self._write(vhost, queue, copy, b"L", body)
        elif op == RETURNED:
            try:
                counts = unpack_counts(body)
            except struct.error:
                return False
            for seq, n in counts:
                if seq in copy.entries:
                    copy.counts[seq] = n
            self._write(vhost, queue, copy, b"C", body)
        elif op == LEAVES:  # from a node of an earlier version: the seqs in the route key
            entries = copy.entries
            try:
                seqs = [int(text) for text in routing_key.split(",")]
            except ValueError:
                return False
            for seq in seqs:
                entries.pop(seq, None)
            self._write(vhost, queue, copy, b"L", pack_seqs(seqs))
        elif op == SYNCED:
            copy.synced = True
            if copy.keep_max is not None:  # the end of a catch-up: what left meanwhile goes
                top, keep = copy.keep_max, copy.keep
                for seq in [s for s in copy.entries if s <= top and s not in keep]:
                    del copy.entries[seq]
                    copy.counts.pop(seq, None)
                copy.keep_max, copy.keep = None, set()
                copy.loaded = False
                try:
                    self._rewrite(vhost, queue, copy)
                except OSError as exc:
                    log.warning("copy of queue %r not kept on disk: %s", queue, exc)
                    if copy.log is not None:
                        copy.log.remove()
                    copy.log = None
            else:
                copy.loaded = False
                self._write(vhost, queue, copy, b"S", b"")
        elif op == KEEP:
            try:
                top = _SEQ.unpack_from(body)[0]
                seqs = unpack_seqs(body[_SEQ.size:])
            except struct.error:
                return False
            if copy.keep_max is None:
                copy.keep_max = top
                copy.synced = False
                self._write(vhost, queue, copy, b"U", b"")  # not complete until SYNCED
            copy.keep.update(seqs)
        elif op == ENQUEUES:
            try:
                copy.entries.update(unpack_entries(body))
            except (struct.error, UnicodeError):
                return False
            if copy.log is not None:
                copy.log.live += len(body)
            self._write(vhost, queue, copy, b"E", body)
        else:
            return False
        return True

    def drop_copy(self, vhost: str, queue: str) -> None:
        self._forget((vhost, queue))

    # ---- both roles, in the background ----
    def decided(self, channel, seq: int, ok: bool) -> None:
        """The link's confirm of an applied op: at once, unless a quorum member's copy
        was written since its last fsync (then once the syncer fsynced it)."""
        if ok and self._unsynced:
            self._sync_waiting.append((channel, seq))
            self._sync_wake.set()
            return
        channel.confirm_decided(seq, ok)

    async def syncer(self) -> None:
        """fsync the quorum copies written meanwhile (duplicated descriptors: a copy
        replaced or dropped during the fsync keeps its file open until it is done), then
        confirm what waited for them; a failed fsync nacks them. In a thread, unless the
        disk answered the last one within ``_INLINE_FSYNC_MAX``: then on the event loop,
        which costs the loop that long and saves two thread switches and wake-ups per
        round, which every confirm waited for (measured: a follower's CPU per message
        went from 19-23 to 15-19 us); a slower one sends the next ones back to a thread."""
        while True:
            await self._sync_wake.wait()
            self._sync_wake = trio.Event()
            logs, self._unsynced = list(self._unsynced.values()), {}
            waiting, self._sync_waiting = self._sync_waiting, []
            ok = True
            fds = []
            try:
                fds = [log_.dup() for log_ in logs if not log_.closed]
                if self.fsync_inline:
                    took = _fsync_all(fds)
                else:
                    took = await trio.to_thread.run_sync(_fsync_all, fds)
                self.fsync_inline = took < _INLINE_FSYNC_MAX
            except OSError as exc:
                log.warning("quorum copies not synced to disk: %s", exc)
                ok = False
            finally:
                for fd in fds:
                    os.close(fd)
            for channel, seq in waiting:
                channel.confirm_decided(seq, ok, external=True)
