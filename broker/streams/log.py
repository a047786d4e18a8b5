"""The stream log: an append-only, segmented, chunked log on disk.

One ``StreamLog`` per stream, in its own directory (``<data-dir>/streams/<vhost>/<name>/``,
see ``stream_dir``). Nothing here knows AMQP; records are opaque bytes.

On disk (loosely RabbitMQ's osiris layout, so a Stream-protocol ``Deliver`` can send a
chunk's bytes as they are):

* ``<first offset, 20 digits>.segment``: an 8-byte file header, then chunks. A chunk is a
  48-byte header (``CHUNK_HEADER``: magic/version 0x50, chunk type 0, entries (u16),
  records (u32), timestamp (ms, i64), epoch (u64), first offset (u64), CRC32 of the data
  (u32), data length (u32), trailer length (u32, 0), filter size (u8), 3 reserved bytes),
  then ``filter size`` bytes of Bloom filter, then the data: the entries, each either a
  *simple* entry (u32 size, top bit 0, then the record) or a *sub-batch* (osiris's: a byte
  ``1ccc0000`` (c: compression, 0 none, 1 gzip), u16 records, u32 uncompressed length,
  u32 length, then the records, each u32 size + bytes). Offsets count records: a chunk
  holds ``first offset .. first offset + records - 1``.
* ``<first offset>.index``: an 8-byte header, then one 28-byte entry per chunk
  (``INDEX_ENTRY``: first offset u64, timestamp i64, file position u64, records u32), so
  attaching at an offset or a timestamp is a binary search with ``pread``, not a scan.
* ``offsets``: the offsets stored by named consumers (``store_offset``), JSON, replaced
  atomically on each commit that changed it.

Segments roll when the next chunk would take the segment past ``max_segment_size``.
Retention (``max_bytes``, ``max_age`` seconds) deletes whole segments, oldest first,
never the one being written, when a segment rolls, at open and on ``apply_retention``.

Durability: ``append`` writes to the OS at once; ``commit`` fsyncs (segment, index,
offsets) and only then moves ``committed_offset``, runs the ``when_durable`` callbacks
and wakes readers. Readers only ever see committed chunks. ``StreamStore`` runs the
group commit: one trio task that commits every log appended to since the last one, the
fsyncs in a worker thread. A log can also be committed synchronously (``commit()``),
for tools and tests without trio.

At open the tail is checked: chunks past the last index entry are re-indexed if whole
and their CRC matches; a torn or corrupt tail chunk is cut off (truncated) and logged.

Memory does not grow with the stream's length: the log keeps one small record per
segment (its first offset), readers keep a file descriptor and a position.

API (for the AMQP stream queue and the Stream protocol):

* ``StreamLog(directory, max_segment_size=500_000_000, max_bytes=None, max_age=None)``;
  ``close()``.
* ``append_record(record, filter_value=None) -> offset``: into the batch that becomes
  the next chunk at the next commit (AMQP publishes: many publishes, one chunk).
* ``append(records, timestamp=None, filter_values=()) -> (first, last)``: one chunk of
  simple entries; ``filter_values``: the filter value of each record (None: none), for
  the chunk's Bloom filter.
* ``append_encoded(data, num_entries, num_records, timestamp=None, filter_values=())``
  ``-> (first, last)``: one chunk of already-encoded entries (simple or sub-batch).
* ``when_durable(offset, callback)``: ``callback()`` once ``offset`` is committed (and,
  while the log leads a replica group, on a majority of it: ``set_replicas(nodes,
  group_size)``, ``replica_acked(node, offset)``, ``durable_offset``); its readers then
  read up to ``readable_offset`` (the majority's), a replica's (``reader(start,
  replica=True)``) up to the local commit.
* ``append_replica_chunk(chunk)``: a leader's chunk (header, filter, entries) written
  verbatim at the replica's tail (same offsets, chunk ids, timestamps; ``ReplicaGap``
  when it does not start there). ``Chunk.raw()``: a chunk as the log holds it.
* ``first_offset``, ``next_offset`` (offset the next record gets, batched ones counted), ``committed_offset``
  (-1: none), ``last_chunk_offset`` (first offset of the last committed chunk, -1: none),
  ``committed_chunk_id`` (the same), ``size_bytes``, ``segment_count``,
  ``message_count`` (committed records still stored).
* ``reader(start) -> Reader``; start: ``"first"``, ``"last"``, ``"next"``, an ``int``
  offset, or ``Timestamp(ms)``. ``Reader.next_chunk(accept=None) -> Chunk | None`` (None:
  nothing committed past it yet; ``accept(bloom) -> bool`` skips chunks by their filter
  without reading their data, at most 64 per call, ``Reader.more`` then says there is
  more), ``Reader.next_offset``, ``Reader.close()``.
  ``await log.wait_committed(offset)`` returns once a chunk containing ``offset`` or
  later is committed (or the log closes: ``log.closed``).
* ``Chunk``: ``first_offset``, ``num_entries``, ``num_records``, ``timestamp``,
  ``header`` (48 bytes, filter size zeroed: the Stream protocol's chunk header), ``data``
  (the entries), ``bloom``; ``wire()`` = header + data; ``pieces(max_bytes)``: the chunk
  cut between entries into valid chunks of at most that size (a small frame_max); ``records()`` yields
  ``(offset, record bytes)``; ``may_contain(values, match_unfiltered)`` asks the filter.
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
import struct
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("triomq.streams")

DEFAULT_MAX_SEGMENT_SIZE = 500_000_000
SEGMENT_MAGIC = b"TMQSEG\x00\x01"
INDEX_MAGIC = b"TMQIDX\x00\x01"
FILE_HEADER = 8
CHUNK_HEADER = struct.Struct(">BBHIqQQIIIB3x")
INDEX_ENTRY = struct.Struct(">QqQI")
MAGIC_VERSION = 0x50  # osiris: magic 5, version 0
CHUNK_USER = 0
EPOCH = 1
BLOOM_SIZE = 16  # bytes of Bloom filter per chunk that has filter values (osiris' default)
MAX_ENTRIES = 0xFFFF  # a chunk's entry count is a u16
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


@dataclass(frozen=True)
class Timestamp:
    """Attach at the first chunk published at or after this time (ms since the epoch)."""
    ms: int


def stream_dir(data_dir: str, vhost: str, name: str) -> str:
    """The directory of a stream: names are hex-encoded, so any vhost or queue name maps
    to one safe directory name."""
    return os.path.join(data_dir, "streams", vhost.encode("utf-8", "surrogateescape").hex(),
                        name.encode("utf-8", "surrogateescape").hex())


# ---- Bloom filter (per chunk, over the records' filter values) ----

def _bloom_bits(value: bytes) -> tuple[int, int]:
    nbits = BLOOM_SIZE * 8
    return zlib.crc32(value) % nbits, zlib.crc32(value, 0x9E3779B9) % nbits


def make_bloom(values: Iterable[str | bytes | None]) -> bytes:
    """The chunk's filter; an unfiltered record (None) adds the empty value, so that
    ``match_unfiltered`` readers know the chunk has some."""
    bits = bytearray(BLOOM_SIZE)
    for value in values:
        raw = b"" if value is None else value.encode() if isinstance(value, str) else value
        for bit in _bloom_bits(raw):
            bits[bit >> 3] |= 1 << (bit & 7)
    return bytes(bits)


def bloom_may_contain(bloom: bytes, value: bytes) -> bool:
    return all(bloom[b >> 3] & (1 << (b & 7)) for b in _bloom_bits(value))


def bloom_accepts(bloom: bytes, values: Iterable[str | bytes],
                  match_unfiltered: bool = False) -> bool:
    """Whether a chunk with this filter (empty: the chunk has none, so it holds only
    unfiltered records) may hold a record with one of ``values`` or, with
    ``match_unfiltered``, one without a filter value."""
    if not bloom:
        return match_unfiltered
    if match_unfiltered and bloom_may_contain(bloom, b""):
        return True
    return any(bloom_may_contain(bloom, v.encode() if isinstance(v, str) else v)
               for v in values)


# ---- entries ----

def encode_entries(records: Iterable[bytes]) -> bytes:
    """Records as simple entries (u32 size + bytes)."""
    parts = []
    for record in records:
        if len(record) >= 0x80000000:
            raise ValueError("record too large")
        parts.append(struct.pack(">I", len(record)))
        parts.append(record)
    return b"".join(parts)


def iter_entries(data: bytes | memoryview) -> Iterator[bytes]:
    """The records of a chunk's data, sub-batches expanded (uncompressed or gzip)."""
    view = memoryview(data)
    pos, end = 0, len(view)
    while pos + 4 <= end:
        head = view[pos]
        if not head & 0x80:
            (size,) = struct.unpack_from(">I", view, pos)
            pos += 4
            yield bytes(view[pos:pos + size])
            pos += size
            continue
        if pos + 11 > end:
            return
        compression = (head >> 4) & 0x7
        n, _ulen, length = struct.unpack_from(">HII", view, pos + 1)
        pos += 11
        body = bytes(view[pos:pos + length])
        pos += length
        if compression == 1:
            body = zlib.decompress(body, 16 + zlib.MAX_WBITS)
        elif compression != 0:
            # a codec this broker lacks: the records are skipped (counted, never delivered)
            for _ in range(n):
                yield b""
            continue
        bpos = 0
        for _ in range(n):
            (size,) = struct.unpack_from(">I", body, bpos)
            yield body[bpos + 4:bpos + 4 + size]
            bpos += 4 + size


class Chunk:
    __slots__ = ("bloom", "data", "first_offset", "header", "num_entries", "num_records",
                 "timestamp")

    def __init__(self, header: bytes, bloom: bytes, data: bytes):
        (_mv, _t, self.num_entries, self.num_records, self.timestamp, _e, self.first_offset,
         _crc, _dl, _tl, _fs) = CHUNK_HEADER.unpack(header)
        # the Stream protocol's chunk header has no filter: its filter size byte is zero
        self.header = header[:44] + b"\x00" + header[45:] if bloom else header
        self.bloom = bloom
        self.data = data

    def raw(self) -> list[bytes]:
        """The chunk as the log holds it (its Bloom filter kept): what a replica appends
        (``append_replica_chunk``)."""
        if not self.bloom:
            return [self.header, self.data]
        return [self.header[:44] + bytes((len(self.bloom),)) + self.header[45:], self.bloom,
                self.data]

    def wire(self) -> bytes:
        """The chunk as a Stream-protocol Deliver carries it (header + entries)."""
        return self.header + self.data

    def pieces(self, max_bytes: int) -> list[tuple[bytes, bytes | memoryview]]:
        """The chunk as (header, data) pieces of at most ``max_bytes`` each (header
        included), cut between entries: each piece is a valid chunk of its own (its
        entries, records, first offset and CRC), so a client whose frame_max is below the
        chunk's size reads it as several chunks. Entries are never cut or opened: an
        entry larger than ``max_bytes`` alone is a piece of its own, larger than asked."""
        size = len(self.header) + len(self.data)
        if size <= max_bytes:
            return [(self.header, self.data)]
        view = memoryview(self.data)
        room = max(1, max_bytes - CHUNK_HEADER.size)
        (mv, ctype, _n, _r, ts, epoch, _f, _crc, _dl, _tl, _fs) = CHUNK_HEADER.unpack(
            self.header)
        out: list[tuple[bytes, bytes | memoryview]] = []
        first = self.first_offset
        start = pos = 0
        entries = records = 0
        end = len(view)

        def cut() -> None:
            data = view[start:pos]
            out.append((CHUNK_HEADER.pack(mv, ctype, entries, records, ts, epoch, first,
                                          zlib.crc32(data), len(data), 0, 0), data))

        while pos < end:
            if view[pos] & 0x80:
                n, _ulen, length = struct.unpack_from(">HII", view, pos + 1)
                step, count = 11 + length, n
            else:
                step, count = 4 + struct.unpack_from(">I", view, pos)[0], 1
            if entries and pos + step - start > room:
                cut()
                first += records
                start, entries, records = pos, 0, 0
            pos += step
            entries += 1
            records += count
        if entries:
            cut()
        return out

    def records(self) -> Iterator[tuple[int, bytes]]:
        offset = self.first_offset
        for record in iter_entries(self.data):
            yield offset, record
            offset += 1

    def may_contain(self, values: Iterable[str | bytes], match_unfiltered: bool = False) -> bool:
        """Whether a record with one of ``values`` (or, with ``match_unfiltered``, without
        a filter value) may be in the chunk (``bloom_accepts``)."""
        return bloom_accepts(self.bloom, values, match_unfiltered)


def encode_chunk(data: bytes, num_entries: int, num_records: int, first_offset: int,
                 timestamp: int, bloom: bytes = b"") -> bytes:
    header = CHUNK_HEADER.pack(MAGIC_VERSION, CHUNK_USER, num_entries, num_records, timestamp,
                               EPOCH, first_offset, zlib.crc32(data), len(data), 0, len(bloom))
    return header + bloom + data


class _Segment:
    __slots__ = ("first_offset", "path")

    def __init__(self, path: str, first_offset: int):
        self.path = path
        self.first_offset = first_offset

    @property
    def index_path(self) -> str:
        return self.path[:-len(".segment")] + ".index"


def _name(first_offset: int) -> str:
    return f"{first_offset:020d}"


class StreamLog:
    def __init__(self, directory: str, max_segment_size: int = DEFAULT_MAX_SEGMENT_SIZE,
                 max_bytes: int | None = None, max_age: float | None = None):
        self.directory = directory
        self.max_segment_size = max_segment_size
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.closed = False
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
        self._segments: list[_Segment] = []
        self._firsts: list[int] = []
        self._open()

    # ---- open / recovery ----
    def _open(self) -> None:
        names = sorted(n for n in os.listdir(self.directory) if n.endswith(".segment"))
        for n in names:
            self._segments.append(_Segment(os.path.join(self.directory, n), int(n[:-8])))
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
            self._recover_tail()
        self._firsts = [s.first_offset for s in self._segments]
        self.committed_offset = self._next - 1
        self.last_chunk_offset = self._pending_last_chunk
        self.apply_retention()

    def _new_segment(self, first_offset: int) -> None:
        seg = _Segment(os.path.join(self.directory, _name(first_offset) + ".segment"),
                       first_offset)
        self._seg_fd = os.open(seg.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(self._seg_fd, SEGMENT_MAGIC)
        self._idx_fd = os.open(seg.index_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(self._idx_fd, INDEX_MAGIC)
        self._segments.append(seg)
        self._firsts.append(first_offset)
        self._seg_size = FILE_HEADER
        self._idx_size = FILE_HEADER
        self._next = first_offset
        # the directory entry is fsynced by the next commit, in its worker thread and before
        # any confirm: a blocking fsync here held the event loop ~10 ms per stream created
        # (a super stream of 1,000 partitions: 11 s); an empty segment lost is made again
        self._dir_version += 1

    def _recover_tail(self) -> None:
        """Check the last segment: cut a torn index entry, re-index whole chunks written
        after the last index entry, truncate whatever follows the last whole chunk."""
        seg = self._segments[-1]
        seg_size = os.fstat(self._seg_fd).st_size
        idx_size = os.fstat(self._idx_fd).st_size
        if idx_size < FILE_HEADER:
            os.ftruncate(self._idx_fd, 0)
            os.pwrite(self._idx_fd, INDEX_MAGIC, 0)
            idx_size = FILE_HEADER
        n = (idx_size - FILE_HEADER) // INDEX_ENTRY.size
        pos, offset = FILE_HEADER, seg.first_offset
        # walk back over index entries pointing past the segment or at a bad chunk
        while n:
            first, ts, cpos, nrec = INDEX_ENTRY.unpack(
                os.pread(self._idx_fd, INDEX_ENTRY.size, FILE_HEADER + (n - 1) * INDEX_ENTRY.size))
            end = self._chunk_end(cpos, seg_size, check_crc=True)
            if end is not None:
                pos, offset = end, first + nrec
                self._pending_last_chunk = first
                break
            n -= 1
        idx_end = FILE_HEADER + n * INDEX_ENTRY.size
        if idx_end != idx_size:
            os.ftruncate(self._idx_fd, idx_end)
        # chunks after the last indexed one (a crash between the two writes)
        while pos < seg_size:
            end = self._chunk_end(pos, seg_size, check_crc=True)
            if end is None:
                break
            header = CHUNK_HEADER.unpack(os.pread(self._seg_fd, CHUNK_HEADER.size, pos))
            first, nrec, ts = header[6], header[3], header[4]
            if first != offset:
                break
            os.pwrite(self._idx_fd, INDEX_ENTRY.pack(first, ts, pos, nrec), idx_end)
            idx_end += INDEX_ENTRY.size
            self._pending_last_chunk = first
            pos, offset = end, first + nrec
        if pos < seg_size:
            log.warning("stream %s: torn tail of %d bytes after offset %d truncated (%s)",
                        self.directory, seg_size - pos, offset - 1, os.path.basename(seg.path))
            os.ftruncate(self._seg_fd, pos)
            os.fsync(self._seg_fd)
        os.fsync(self._idx_fd)
        self._seg_size = pos
        self._idx_size = idx_end
        self._next = offset
        if self._pending_last_chunk < 0 and len(self._segments) > 1:
            # an empty last segment: the last chunk is the previous segment's last
            prev = self._segments[-2]
            fd = os.open(prev.index_path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                if size >= FILE_HEADER + INDEX_ENTRY.size:
                    self._pending_last_chunk = INDEX_ENTRY.unpack(os.pread(
                        fd, INDEX_ENTRY.size, size - INDEX_ENTRY.size))[0]
            finally:
                os.close(fd)

    def _chunk_end(self, pos: int, seg_size: int, check_crc: bool) -> int | None:
        """The end position of the chunk at ``pos`` if it is whole (and its CRC matches)."""
        if pos < FILE_HEADER or pos + CHUNK_HEADER.size > seg_size:
            return None
        header = CHUNK_HEADER.unpack(os.pread(self._seg_fd, CHUNK_HEADER.size, pos))
        if header[0] != MAGIC_VERSION:
            return None
        dlen, tlen, flen = header[8], header[9], header[10]
        end = pos + CHUNK_HEADER.size + flen + dlen + tlen
        if end > seg_size:
            return None
        if check_crc:
            data = os.pread(self._seg_fd, dlen, pos + CHUNK_HEADER.size + flen)
            if zlib.crc32(data) != header[7]:
                log.warning("stream %s: chunk at offset %d fails its CRC", self.directory,
                            header[6])
                return None
        return end

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
        chunk = bytes(chunk)
        if self._seg_size > FILE_HEADER and self._seg_size + len(chunk) > self.max_segment_size:
            self._roll()
        pos = self._seg_size
        os.pwrite(self._seg_fd, chunk, pos)
        os.pwrite(self._idx_fd, INDEX_ENTRY.pack(first, ts, pos, n_records), self._idx_size)
        self._seg_size += len(chunk)
        self._idx_size += INDEX_ENTRY.size
        self._next = first + n_records
        self._pending_last_chunk = first
        if self._store is not None:
            self._store.dirty(self)
        return first, first + n_records - 1

    def _append_chunk(self, data: bytes, num_entries: int, num_records: int,
                      timestamp: int | None, filter_values: Iterable) -> tuple[int, int]:
        if not 0 < num_entries <= MAX_ENTRIES or num_records < num_entries:
            raise ValueError("bad chunk entry/record counts")
        values = list(filter_values)
        bloom = make_bloom(values) if any(v is not None for v in values) else b""
        ts = int(time.time() * 1000) if timestamp is None else timestamp
        first = self._next
        chunk = encode_chunk(data, num_entries, num_records, first, ts, bloom)
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
        os.fsync(seg_fd)
        os.fsync(idx_fd)
        for fd in retired:
            os.close(fd)
        if dir_version is not None and offsets is None:
            dfd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        if offsets is not None:
            path = os.path.join(self.directory, "offsets")
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(offsets)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            dfd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

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
        removed = 0
        if self.max_bytes is None and self.max_age is None:
            return 0
        now = time.time() if now is None else now
        total = self.size_bytes if self.max_bytes is not None else 0
        while len(self._segments) > 1:
            seg = self._segments[0]
            size = os.path.getsize(seg.path)
            drop = self.max_bytes is not None and total > self.max_bytes
            if not drop and self.max_age is not None:
                newest = self._newest_timestamp(seg)
                drop = newest is not None and newest / 1000.0 < now - self.max_age
            if not drop:
                break
            os.unlink(seg.path)
            try:
                os.unlink(seg.index_path)
            except FileNotFoundError:
                pass
            del self._segments[0]
            del self._firsts[0]
            total -= size
            removed += 1
        if removed:
            log.info("stream %s: retention removed %d segment(s), first offset now %d",
                     self.directory, removed, self.first_offset)
        return removed

    def _newest_timestamp(self, seg: _Segment) -> int | None:
        fd = os.open(seg.index_path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size < FILE_HEADER + INDEX_ENTRY.size:
                return None
            return INDEX_ENTRY.unpack(os.pread(fd, INDEX_ENTRY.size,
                                               size - INDEX_ENTRY.size))[1]
        finally:
            os.close(fd)

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
                found = self._index_search(seg, lambda e: e[1] >= start.ms)
                if found is not None:
                    return found[0]
            return self.committed_offset + 1
        offset = int(start)
        if offset < self.first_offset:
            return self.first_offset
        return min(offset, self.committed_offset + 1)

    def _index_entry(self, seg: _Segment, i: int):
        try:
            fd = os.open(seg.index_path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            raw = os.pread(fd, INDEX_ENTRY.size, FILE_HEADER + i * INDEX_ENTRY.size)
            return INDEX_ENTRY.unpack(raw) if len(raw) == INDEX_ENTRY.size else None
        finally:
            os.close(fd)

    def _index_search(self, seg: _Segment, pred):
        """The first committed index entry of ``seg`` for which ``pred`` is true (entries
        are sorted for it), by binary search with pread."""
        try:
            fd = os.open(seg.index_path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            n = (os.fstat(fd).st_size - FILE_HEADER) // INDEX_ENTRY.size
            lo, hi, found = 0, n, None
            while lo < hi:
                mid = (lo + hi) // 2
                e = INDEX_ENTRY.unpack(os.pread(fd, INDEX_ENTRY.size,
                                                FILE_HEADER + mid * INDEX_ENTRY.size))
                if pred(e):
                    found, hi = e, mid
                else:
                    lo = mid + 1
            if found is not None and found[0] > self.committed_offset:
                return None
            return found
        finally:
            os.close(fd)

    def _locate(self, offset: int) -> tuple[_Segment, int, int] | None:
        """The segment, file position and first offset of the chunk holding ``offset``."""
        i = bisect.bisect_right(self._firsts, offset) - 1
        if i < 0:
            i = 0
        seg = self._segments[i]
        e = self._index_search(seg, lambda e: e[0] + e[3] > offset)
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


class Reader:
    """A cursor over committed chunks; holds one open segment file at a time."""

    def __init__(self, stream: StreamLog, offset: int, replica: bool = False):
        self.log = stream
        self.replica = replica  # reads up to the local commit, not the majority's
        self.next_offset = offset  # the first offset not yet returned
        self._seg: _Segment | None = None
        self._fd: int | None = None
        self._pos = 0

    def _seek(self) -> bool:
        found = self.log._locate(self.next_offset)
        if found is None:
            return False
        seg, pos, _first = found
        if seg is not self._seg:
            self._close_fd()
            try:
                self._fd = os.open(seg.path, os.O_RDONLY)
            except FileNotFoundError:
                return False
            self._seg = seg
        self._pos = pos
        return True

    def next_chunk(self, accept: Callable[[bytes], bool] | None = None,
                   max_skipped: int = 64) -> Chunk | None:
        """The next committed chunk holding ``next_offset`` or later, or None: caught up,
        or (with ``accept``) ``max_skipped`` chunks were skipped -- then ``more`` is true
        and the caller continues later, so one call never reads a whole stream.

        ``accept(bloom)`` (the chunk's filter bytes, empty without one) decides from the
        filter alone whether a chunk is read; a refused chunk's data is never read. A
        reader left behind by retention continues at the first offset still stored."""
        lg = self.log
        limit = lg.committed_offset if self.replica else lg.readable_offset
        if lg.closed or self.next_offset > limit:
            return None
        if self.next_offset < lg.first_offset:
            self.next_offset = lg.first_offset
            self._seg = None
        switches = skipped = 0
        while switches <= len(lg._segments) + 1:  # each segment once at most
            if (self._fd is None or self._seg is None or self._seg not in lg._segments) \
                    and not self._seek():
                return None
            fd = self._fd
            assert fd is not None  # _seek opened it
            raw = os.pread(fd, CHUNK_HEADER.size, self._pos)
            if len(raw) < CHUNK_HEADER.size:
                # end of this segment: the next one starts at next_offset
                self._seg = None
                switches += 1
                continue
            header = CHUNK_HEADER.unpack(raw)
            first, nrec, flen, dlen, tlen = header[6], header[3], header[10], header[8], header[9]
            if first > limit:
                return None
            size = CHUNK_HEADER.size + flen + dlen + tlen
            if first + nrec <= self.next_offset:
                self._pos += size
                continue
            if accept is not None:
                bloom = os.pread(fd, flen, self._pos + CHUNK_HEADER.size) if flen else b""
                if not accept(bloom):
                    self._pos += size
                    self.next_offset = first + nrec
                    skipped += 1
                    if skipped >= max_skipped:
                        return None
                    continue
            body = os.pread(fd, flen + dlen, self._pos + CHUNK_HEADER.size)
            self._pos += size
            self.next_offset = first + nrec
            return Chunk(raw, body[:flen], body[flen:])
        return None

    @property
    def more(self) -> bool:
        """Committed chunks remain past ``next_offset``."""
        lg = self.log
        return not lg.closed and self.next_offset <= (
            lg.committed_offset if self.replica else lg.readable_offset)

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        self._close_fd()
        self._seg = None


class StreamStore:
    """The group commit of every stream log of a broker: ``run`` (a task of the broker's
    nursery) commits the logs appended to since its last round, fsyncs in a worker
    thread, then confirms on the loop. Also the registry of open logs by directory."""

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self.logs: dict[str, StreamLog] = {}
        self._dirty: dict[int, StreamLog] = {}
        self._wake: Any = None  # trio.Event while run() runs
        self.running = False
        # in a cluster: a log opened waits for a replica before it confirms, until its
        # replica group is known (``StreamLog.set_replicas``)
        self.replicated = False

    def open(self, vhost: str, name: str, **settings) -> StreamLog:
        path = stream_dir(self.data_dir, vhost, name)
        lg = self.logs.get(path)
        if lg is None or lg.closed:
            lg = StreamLog(path, **settings)
            lg._store = self
            self.logs[path] = lg
            if self.replicated:
                lg.set_replicas([], 2)
        return lg

    def forget(self, lg: StreamLog) -> None:
        self.logs.pop(lg.directory, None)
        self._dirty.pop(id(lg), None)
        lg._store = None

    def dirty(self, lg: StreamLog) -> None:
        self._dirty[id(lg)] = lg
        if self._wake is not None:
            self._wake.set()
        elif not self.running:
            lg.commit()  # no commit task (tools, tests): commit at once

    def commit_all(self) -> None:
        dirty, self._dirty = self._dirty, {}
        for lg in dirty.values():
            lg.commit()

    async def run(self, task_status=None) -> None:
        import trio
        self.running = True
        self._wake = trio.Event()
        if task_status is not None:
            task_status.started()
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                dirty, self._dirty = self._dirty, {}
                states = []
                failed: list[StreamLog] = []
                for lg in dirty.values():
                    if lg.closed:
                        continue
                    try:
                        states.append((lg, lg.begin_commit()))
                    except OSError:
                        log.exception("stream %s: write failed; retrying in 1 s, its "
                                      "publishes stay unconfirmed meanwhile", lg.directory)
                        failed.append(lg)

                def sync(states=states, failed=failed):
                    done = []
                    for lg, state in states:
                        try:
                            lg.sync_files(state)
                        except OSError:
                            if not lg.closed:  # closed meanwhile (deleted): nothing to confirm
                                log.exception("stream %s: fsync failed; retrying in 1 s, its "
                                              "publishes stay unconfirmed meanwhile",
                                              lg.directory)
                                failed.append(lg)
                            continue
                        done.append((lg, state))
                    return done
                for lg, state in await trio.to_thread.run_sync(sync):
                    if not lg.closed:
                        lg.end_commit(state)
                if failed:
                    await trio.sleep(1)
                    for lg in failed:
                        if not lg.closed:
                            self.dirty(lg)
        finally:
            self._wake = None
            self.running = False
            try:
                self.commit_all()
            except OSError:
                log.exception("streams: the last commit at shutdown failed")
