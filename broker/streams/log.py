"""The stream log: an append-only, segmented, chunked log on disk; appending, the commit,
the confirms of a replica group, retention and where a reader starts. Not the chunk layout
(``chunk``), the segment and index files (``segment``), reading (``reader``) or the group
commit task (``store``). Nothing here knows AMQP; records are opaque bytes.

One ``StreamLog`` per stream, in its own directory (``<data-dir>/streams/<vhost>/<name>/``,
see ``stream_dir``), laid out loosely as RabbitMQ's osiris does, so a Stream-protocol
``Deliver`` can send a chunk's bytes as they are: segment files of chunks, an index file
per segment, and ``offsets``: the offsets stored by named consumers (``store_offset``),
JSON, replaced atomically on each commit that changed it.

Segments roll when the next chunk would take the segment past ``max_segment_size``.
Retention (``max_bytes``, ``max_age`` seconds) deletes whole segments, oldest first,
never the one being written, when a segment rolls, at open and on ``apply_retention``.

Durability: ``append`` writes to the OS at once; ``commit`` fsyncs (segment, index,
offsets) and only then moves ``committed_offset``, runs the ``when_durable`` callbacks
and wakes readers, which only ever see committed chunks. ``StreamStore`` runs the group
commit; ``commit()`` commits at once (tools, tests without trio). At open the tail is
checked (``segment.recover_tail``).

Memory does not grow with the stream's length: the log keeps one small record per
segment (its first offset), readers keep a file descriptor and a position.

API (for the AMQP stream queue and the Stream protocol):

* ``StreamLog(directory, max_segment_size=500_000_000, max_bytes=None, max_age=None)``;
  ``close()``.
* ``append_record(record, filter_value=None) -> offset``: into the batch that becomes
  the next chunk; ``append(records, timestamp, filter_values) -> (first, last)``: one
  chunk of simple entries; ``append_encoded(data, num_entries, num_records, ...)``: one
  chunk of already-encoded entries (simple or sub-batch).
* ``when_durable(offset, callback)``: ``callback()`` once ``offset`` is committed (and,
  while the log leads a replica group, on a majority of it: ``set_replicas(nodes,
  group_size)``, ``replica_acked(node, offset)``, ``durable_offset``); its readers then
  read up to ``readable_offset`` (the majority's), a replica's (``reader(start,
  replica=True)``) up to the local commit.
* ``append_replica_chunk(chunk)``: a leader's chunk (header, filter, entries) written
  verbatim at the replica's tail (same offsets, chunk ids, timestamps; ``ReplicaGap``
  when it does not start there). ``Chunk.raw()``: a chunk as the log holds it.
  ``restart_at(offset)``: a replica behind its leader's retention starts again there.
* ``first_offset``, ``next_offset`` (offset the next record gets, batched ones counted),
  ``committed_offset`` (-1: none), ``last_chunk_offset`` (first offset of the last
  committed chunk, -1: none), ``committed_chunk_id`` (the same), ``size_bytes``,
  ``segment_count``, ``message_count`` (committed records still stored).
* ``reader(start) -> Reader``; start: ``"first"``, ``"last"``, ``"next"``, an ``int``
  offset, or ``Timestamp(ms)``. ``await log.wait_committed(offset)`` returns once a chunk
  containing ``offset`` or later is committed (or the log closes: ``log.closed``).
* ``store_offset(reference, offset)``, ``query_offset(reference) -> int | None``:
  persisted with the next commit.
* ``listeners``: callables run (on the loop) after each commit that moved
  ``committed_offset``: how a stream queue learns there is more to deliver.
"""
from __future__ import annotations

import bisect
import json
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterable

from .chunk import (
    CHUNK_HEADER,
    MAGIC_VERSION,
    MAX_ENTRIES,
    Chunk,
    bloom_accepts,
    encode_chunk,
    encode_entries,
    iter_entries,
    make_bloom,
)
from .reader import Reader, Timestamp
from .segment import (
    FILE_HEADER,
    INDEX_ENTRY,
    INDEX_MAGIC,
    SEGMENT_MAGIC,
    Segment,
    drop_old_segments,
    fsync_dir,
    index_search,
    recover_tail,
    replace_file,
    segment_name,
)
from .store import StreamStore, stream_dir

__all__ = ["CHUNK_HEADER", "FILE_HEADER", "INDEX_ENTRY", "Chunk", "Reader", "ReplicaGap",
           "StreamLog", "StreamStore", "Timestamp", "bloom_accepts", "encode_entries",
           "iter_entries", "stream_dir"]

log = logging.getLogger("triomq.streams")

DEFAULT_MAX_SEGMENT_SIZE = 500_000_000
BATCH_RECORDS = 4096  # append_record: records per chunk at most
BATCH_BYTES = 1 << 20  # ... and bytes (a chunk is read whole by readers)


# A cluster node copying a leader's log subscribes over the Stream protocol with this
# property (chunks come as stored, filter included, never split) and reports what it has
# committed with StoreOffset under this reference prefix + its node name.
REPLICA_PROPERTY = "x-triomq-replica"
REPLICA_REFERENCE = "\x00replica:"


class ReplicaGap(Exception):
    """A replicated chunk does not start at the replica's tail."""

    def __init__(self, first: int, expected: int):
        super().__init__(f"chunk at offset {first}, replica's tail at {expected}")
        self.first, self.expected = first, expected


class StreamLog:
    def __init__(self, directory: str, max_segment_size: int = DEFAULT_MAX_SEGMENT_SIZE,
                 max_bytes: int | None = None, max_age: float | None = None):
        self.directory = directory
        self.max_segment_size = max_segment_size
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.closed = False
        # the commit thread's sync vs close: no fsync of a closed fd, no offsets file
        # written into a directory being deleted
        self._files_lock = threading.Lock()
        self.listeners: list[Callable[[], None]] = []
        self._durable: list[tuple[int, Callable[[], None]]] = []  # (offset, callback), in order
        # a leader's replicas: node -> last offset it reported committed (None: no group)
        self._replicas: dict[str, int] | None = None
        self._group_size = 1
        self._waiters: list = []  # trio Events of readers waiting for a commit
        self._retired: list[int] = []  # fds of rolled segments, closed after the next commit
        self._store: StreamStore | None = None  # the store whose task commits it
        self._offsets_dirty = False
        # segments created (_dir_version) and how many of them the directory's last fsync
        # covered
        self._dir_version = 0
        self._dir_synced = 0
        self.committed_offset = -1
        self.last_chunk_offset = -1
        self._pending_last_chunk = -1
        self._batch: list[bytes] = []
        self._batch_filters: list = []
        self._batch_filtered = False
        self._batch_bytes = 0
        self._batch_ts = 0
        os.makedirs(directory, exist_ok=True)
        self._segments: list[Segment] = []
        self._firsts: list[int] = []
        self._open()

    # ---- open / recovery ----
    def _open(self) -> None:
        names = sorted(n for n in os.listdir(self.directory) if n.endswith(".segment"))
        for n in names:
            self._segments.append(Segment(os.path.join(self.directory, n), int(n[:-8])))
        path = os.path.join(self.directory, "offsets")
        try:
            with open(path) as f:
                self._offsets: dict[str, int] = json.load(f)
        except FileNotFoundError:
            self._offsets = {}
        except ValueError:
            log.error("stream %s: unreadable offsets file, named consumers' offsets lost",
                      self.directory)
            self._offsets = {}
        if not self._segments:
            self._new_segment(0)
        else:
            self._seg_fd = os.open(self._segments[-1].path, os.O_RDWR)
            self._idx_fd = os.open(self._segments[-1].index_path, os.O_RDWR | os.O_CREAT, 0o644)
            (self._seg_size, self._idx_size, self._next,
             self._pending_last_chunk) = recover_tail(self._segments, self._seg_fd, self._idx_fd)
        self._firsts = [s.first_offset for s in self._segments]
        self.committed_offset = self._next - 1
        self.last_chunk_offset = self._pending_last_chunk
        self.apply_retention()

    def _new_segment(self, first_offset: int) -> None:
        seg = Segment(os.path.join(self.directory, segment_name(first_offset) + ".segment"),
                       first_offset)
        self._seg_fd = os.open(seg.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(self._seg_fd, SEGMENT_MAGIC)
        self._idx_fd = os.open(seg.index_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(self._idx_fd, INDEX_MAGIC)
        self._segments.append(seg)
        self._firsts.append(first_offset)
        self._seg_size = self._idx_size = FILE_HEADER
        self._next = first_offset
        # the directory entry is fsynced by the next commit, in its worker thread and before
        # any confirm: a blocking fsync here held the event loop ~10 ms per stream created
        # (a super stream of 1,000 partitions: 11 s); an empty segment lost is made again
        self._dir_version += 1

    # ---- info ----
    @property
    def first_offset(self) -> int:
        return self._segments[0].first_offset

    @property
    def committed_chunk_id(self) -> int:
        return self.last_chunk_offset

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def message_count(self) -> int:
        return max(0, self.committed_offset + 1 - self.first_offset)

    @property
    def size_bytes(self) -> int:
        total = 0
        for seg in self._segments[:-1]:
            try:
                total += os.path.getsize(seg.path)
            except OSError:
                pass
        return total + self._seg_size

    # ---- appending ----
    @property
    def next_offset(self) -> int:
        return self._next + len(self._batch)

    def append_record(self, record: bytes, filter_value: str | bytes | None = None) -> int:
        """Add one record to the batch that becomes the next chunk (written at the next
        commit, or once it holds ``BATCH_RECORDS`` records / ``BATCH_BYTES``); returns its
        offset. Many publishes, one chunk: one header, one index entry, one write."""
        if self.closed:
            raise RuntimeError("stream log closed")
        batch = self._batch
        first = not batch
        if first:
            self._batch_ts = int(time.time() * 1000)
        batch.append(record)
        self._batch_filters.append(filter_value)
        if filter_value is not None:
            self._batch_filtered = True
        self._batch_bytes += len(record) + 4
        offset = self._next + len(batch) - 1
        if len(batch) >= BATCH_RECORDS or self._batch_bytes >= BATCH_BYTES:
            try:
                self.flush_batch()
            except OSError:
                # this record is refused (its publisher is nacked); the rest stays batched
                batch.pop()
                self._batch_filters.pop()
                self._batch_bytes -= len(record) + 4
                raise
        elif first and self._store is not None:
            self._store.dirty(self)
        return offset

    def flush_batch(self) -> None:
        """Write the batch as one chunk (to the OS, not yet durable)."""
        batch = self._batch
        if not batch:
            return
        kept = (batch, self._batch_filters, self._batch_bytes, self._batch_filtered)
        filters = self._batch_filters if self._batch_filtered else ()
        self._batch, self._batch_filters, self._batch_bytes = [], [], 0
        self._batch_filtered = False
        try:
            self._append_chunk(encode_entries(batch), len(batch), len(batch), self._batch_ts,
                               filters)
        except OSError:
            # a failed write (disk full) leaves the batch for the next attempt, which
            # writes the chunk again at the same place
            self._batch, self._batch_filters, self._batch_bytes, self._batch_filtered = kept
            raise

    def append(self, records: list[bytes], timestamp: int | None = None,
               filter_values: Iterable[str | bytes | None] = ()) -> tuple[int, int]:
        return self.append_encoded(encode_entries(records), len(records), len(records),
                                   timestamp, filter_values)

    def append_encoded(self, data: bytes, num_entries: int, num_records: int,
                       timestamp: int | None = None,
                       filter_values: Iterable[str | bytes | None] = ()) -> tuple[int, int]:
        """One chunk of encoded entries; returns its first and last offsets."""
        if self.closed:
            raise RuntimeError("stream log closed")
        self.flush_batch()  # batched records come first
        return self._append_chunk(data, num_entries, num_records, timestamp, filter_values)

    def append_replica_chunk(self, chunk: bytes | memoryview) -> tuple[int, int]:
        """A chunk of another node's log (its leader's), written as it came: header
        (offsets, timestamp, epoch, counts, CRC), Bloom filter and entries byte for byte,
        so this replica has the same chunks at the same offsets. It must start at
        ``next_offset`` (a replica only ever appends what follows its own tail: raises
        ``ReplicaGap`` otherwise) and its CRC must match (``ValueError``)."""
        if self.closed:
            raise RuntimeError("stream log closed")
        if self._batch:
            raise RuntimeError("a replica takes no publishes of its own")
        if len(chunk) < CHUNK_HEADER.size:
            raise ValueError("chunk shorter than its header")
        (mv, _t, n_entries, n_records, ts, _epoch, first, crc, dlen, tlen,
         flen) = CHUNK_HEADER.unpack_from(chunk, 0)
        if mv != MAGIC_VERSION or len(chunk) != CHUNK_HEADER.size + flen + dlen + tlen \
                or not 0 < n_entries <= n_records:
            raise ValueError("not a whole chunk")
        start = CHUNK_HEADER.size + flen
        if zlib.crc32(chunk[start:start + dlen]) != crc:
            raise ValueError(f"chunk at offset {first} fails its CRC")
        if first != self._next:
            raise ReplicaGap(first, self._next)
        return self._write_chunk(bytes(chunk), first, ts, n_records)

    def restart_at(self, offset: int) -> None:
        """Drop every chunk and go on from ``offset`` (named offsets kept): a replica behind
        its leader's first chunk (retention) starts again from that chunk, as osiris does."""
        if self.closed:
            raise RuntimeError("stream log closed")
        if self._batch or offset < self._next:
            raise ValueError(f"a log restarts only past its tail ({self._next}), not at {offset}")
        old = self._segments
        self._retired += (self._seg_fd, self._idx_fd)
        self._segments, self._firsts = [], []
        self._new_segment(offset)
        for seg in old:
            for path in (seg.path, seg.index_path):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        # at once: old segments back after a crash would stand before a gap
        fsync_dir(self.directory)
        self._dir_synced = self._dir_version
        self.committed_offset = offset - 1
        self.last_chunk_offset = self._pending_last_chunk = -1
        log.info("stream %s: restarted at offset %d (its leader's first chunk)",
                 self.directory, offset)

    def _append_chunk(self, data: bytes, num_entries: int, num_records: int,
                      timestamp: int | None, filter_values: Iterable) -> tuple[int, int]:
        if not 0 < num_entries <= MAX_ENTRIES or num_records < num_entries:
            raise ValueError("bad chunk entry/record counts")
        values = list(filter_values)
        bloom = make_bloom(values) if any(v is not None for v in values) else b""
        ts = int(time.time() * 1000) if timestamp is None else timestamp
        first = self._next
        chunk = encode_chunk(data, num_entries, num_records, first, ts, bloom)
        return self._write_chunk(chunk, first, ts, num_records)

    def _write_chunk(self, chunk: bytes, first: int, ts: int, num_records: int) -> tuple[int, int]:
        """Write a whole chunk and its index entry at the tail (rolling first if it does
        not fit the segment)."""
        if self._seg_size > FILE_HEADER and self._seg_size + len(chunk) > self.max_segment_size:
            self._roll()
        pos = self._seg_size
        os.pwrite(self._seg_fd, chunk, pos)
        os.pwrite(self._idx_fd, INDEX_ENTRY.pack(first, ts, pos, num_records), self._idx_size)
        self._seg_size += len(chunk)
        self._idx_size += INDEX_ENTRY.size
        self._next = first + num_records
        self._pending_last_chunk = first
        if self._store is not None:
            self._store.dirty(self)
        return first, first + num_records - 1

    def _roll(self) -> None:
        os.fsync(self._seg_fd)
        os.fsync(self._idx_fd)
        # a commit in a worker thread may still fsync them: closed after the next commit
        self._retired += (self._seg_fd, self._idx_fd)
        self._new_segment(self._next)
        self.apply_retention()

    # ---- durability ----
    @property
    def durable_offset(self) -> int:
        """The last offset a publish may be confirmed for: committed here, and, while the
        log leads a replica group (``set_replicas``), on a majority of the group (the
        replicas count what they reported committed on their own disk)."""
        own = self.committed_offset
        replicas = self._replicas
        if replicas is None:
            return own
        offsets = sorted([own, *(min(o, own) for o in replicas.values())], reverse=True)
        need = self._group_size // 2 + 1  # this node included
        return offsets[need - 1] if len(offsets) >= need else -1

    def set_replicas(self, nodes: list[str] | None, group_size: int = 0) -> None:
        """Lead a replica group of ``group_size`` (this node and ``nodes``): confirms
        (``when_durable``) wait for a majority of it; None: this log alone, as without a
        cluster. A node kept keeps what it reported."""
        if nodes is None:
            self._replicas = None
        else:
            old = self._replicas or {}
            self._replicas = {n: old.get(n, -1) for n in nodes}
            self._group_size = max(group_size, len(nodes) + 1)
        self._release()

    def replica_acked(self, node: str, offset: int) -> None:
        """``node`` has this log up to ``offset`` committed on its own disk."""
        replicas = self._replicas
        if replicas is None or node not in replicas or offset <= replicas[node]:
            return
        before = self.durable_offset
        replicas[node] = offset
        self._release()
        if self.durable_offset > before:  # consumers may read further now
            for listener in list(self.listeners):
                listener()

    @property
    def group_size(self) -> int:
        return self._group_size

    @property
    def replica_offsets(self) -> dict[str, int] | None:
        return None if self._replicas is None else dict(self._replicas)

    def _release(self) -> None:
        durable = self._durable
        if not durable:
            return
        upto = self.durable_offset
        i = 0
        while i < len(durable) and durable[i][0] <= upto:
            i += 1
        if i:
            done, self._durable = durable[:i], durable[i:]
            for _offset, callback in done:
                callback()

    def when_durable(self, offset: int, callback: Callable[[], None]) -> None:
        if offset <= self.durable_offset:
            callback()
        else:
            self._durable.append((offset, callback))

    def begin_commit(self) -> tuple:
        """What the next fsync covers (on the loop): the offsets up to which, the files."""
        self.flush_batch()
        offsets = None
        if self._offsets_dirty:
            offsets = json.dumps(self._offsets).encode()
            self._offsets_dirty = False
        retired, self._retired = self._retired, []
        dir_version = self._dir_version if self._dir_version > self._dir_synced else None
        return (self._next - 1, self._pending_last_chunk, self._seg_fd, self._idx_fd,
                offsets, retired, dir_version)

    def sync_files(self, state: tuple) -> None:
        """The fsyncs (any thread)."""
        _upto, _last, seg_fd, idx_fd, offsets, retired, dir_version = state
        with self._files_lock:
            for fd in retired:
                os.close(fd)
            if self.closed:  # closed (or deleted) since begin_commit: nothing to make durable
                return
            os.fsync(seg_fd)
            os.fsync(idx_fd)
            if dir_version is not None and offsets is None:
                fsync_dir(self.directory)
            if offsets is not None:
                replace_file(self.directory, "offsets", offsets)

    def end_commit(self, state: tuple) -> None:
        """After the fsyncs (on the loop): confirm, wake readers and listeners."""
        upto, last_chunk, dir_version = state[0], state[1], state[6]
        if dir_version is not None:
            self._dir_synced = max(self._dir_synced, dir_version)
        if upto <= self.committed_offset:
            return
        self.committed_offset = upto
        self.last_chunk_offset = last_chunk
        self._release()
        waiters, self._waiters = self._waiters, []
        for event in waiters:
            event.set()
        for listener in list(self.listeners):
            listener()

    def commit(self) -> None:
        """Make everything appended durable now (synchronously)."""
        if self.closed:
            return
        state = self.begin_commit()
        self.sync_files(state)
        self.end_commit(state)

    @property
    def needs_commit(self) -> bool:
        return (self.next_offset - 1 > self.committed_offset or self._offsets_dirty
                or bool(self._retired))

    async def wait_committed(self, offset: int) -> None:
        """Return once ``offset`` (or a later one) is committed, or the log closed."""
        import trio
        while not self.closed and self.committed_offset < offset:
            event = trio.Event()
            self._waiters.append(event)
            await event.wait()

    # ---- named consumers' offsets ----
    def store_offset(self, reference: str, offset: int) -> None:
        if self._offsets.get(reference) != offset:
            self._offsets[reference] = offset
            self._offsets_dirty = True
            if self._store is not None:
                self._store.dirty(self)

    def query_offset(self, reference: str) -> int | None:
        return self._offsets.get(reference)

    # ---- retention ----
    def apply_retention(self, now: float | None = None) -> int:
        """Delete whole segments (never the one being written) while the stream is over
        ``max_bytes`` or their newest chunk is older than ``max_age``; returns how many."""
        if self.max_bytes is None and self.max_age is None:
            return 0
        removed = drop_old_segments(self._segments, self.max_bytes, self.max_age,
                                    self.size_bytes if self.max_bytes is not None else 0,
                                    time.time() if now is None else now)
        if removed:
            del self._firsts[:removed]
            log.info("stream %s: retention removed %d segment(s), first offset now %d",
                     self.directory, removed, self.first_offset)
        return removed

    # ---- reading ----
    def reader(self, start: str | int | Timestamp = "next", replica: bool = False) -> Reader:
        """A reader from ``start``; it reads what ``readable_offset`` allows, or with
        ``replica`` (another node copying this log) everything committed here."""
        return Reader(self, self._resolve(start), replica)

    @property
    def readable_offset(self) -> int:
        """The last offset consumers may read: committed here and, while the log leads a
        replica group, on a majority of it (a consumer never sees a chunk a failover can
        lose), as RabbitMQ's stream readers stop at the commit."""
        return self.committed_offset if self._replicas is None else self.durable_offset

    def _resolve(self, start) -> int:
        """The offset a reader attached at ``start`` reads from (the first offset of a
        chunk for a timestamp and for "last"). The reader returns the whole chunk holding
        it, records before it included: skipping them is the caller's (as RabbitMQ sends
        a Stream-protocol client the whole chunk)."""
        if start == "first":
            return self.first_offset
        if start == "last":
            return self.last_chunk_offset if self.last_chunk_offset >= self.first_offset \
                else self.committed_offset + 1
        if start == "next":
            return self.committed_offset + 1
        if isinstance(start, Timestamp):
            for seg in self._segments:
                found = index_search(seg, lambda e: e[1] >= start.ms, self.committed_offset)
                if found is not None:
                    return found[0]
            return self.committed_offset + 1
        offset = int(start)
        if offset < self.first_offset:
            return self.first_offset
        return min(offset, self.committed_offset + 1)

    def _locate(self, offset: int) -> tuple[Segment, int, int] | None:
        """The segment, file position and first offset of the chunk holding ``offset``."""
        i = bisect.bisect_right(self._firsts, offset) - 1
        if i < 0:
            i = 0
        seg = self._segments[i]
        e = index_search(seg, lambda e: e[0] + e[3] > offset, self.committed_offset)
        if e is None:
            return None
        return seg, e[2], e[0]

    def close(self, commit: bool = True) -> None:
        """Close the files; with ``commit``, what was appended is made durable first."""
        if self.closed:
            return
        if commit and self.needs_commit:
            self.commit()
        self.closed = True
        with self._files_lock:  # (waits for a commit thread's fsyncs, a few ms)
            for fd in (self._seg_fd, self._idx_fd, *self._retired):
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._retired = []
        waiters, self._waiters = self._waiters, []
        for event in waiters:
            event.set()

    def delete(self) -> None:
        """Close and remove the stream's files (the queue was deleted)."""
        self.close(commit=False)
        for name in os.listdir(self.directory):
            os.unlink(os.path.join(self.directory, name))
        os.rmdir(self.directory)
