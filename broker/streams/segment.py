"""A stream log's segment and index files, tail check, retention; not chunks or appending.

A stream log's segment and index files: names, magic headers and the index entry; the
binary search over an index with pread; the check of the last segment's tail at open;
retention's removal of old segments.
Not chunk contents (``chunk``) or appending (``log``).

``<first offset, 20 digits>.segment``: an 8-byte file header, then chunks.
``<first offset>.index``: an 8-byte header, then one 28-byte entry per chunk
(``INDEX_ENTRY``: first offset u64, timestamp i64, file position u64, records u32), so
attaching at an offset or a timestamp is a binary search with ``pread``, not a scan.
"""
from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Callable

from .chunk import CHUNK_HEADER, MAGIC_VERSION

log = logging.getLogger("triomq.streams")

SEGMENT_MAGIC = b"TMQSEG\x00\x01"
INDEX_MAGIC = b"TMQIDX\x00\x01"
FILE_HEADER = 8
INDEX_ENTRY = struct.Struct(">QqQI")

IndexEntry = tuple[int, int, int, int]  # first offset, timestamp, file position, records


class Segment:
    __slots__ = ("first_offset", "path")

    def __init__(self, path: str, first_offset: int):
        self.path = path
        self.first_offset = first_offset

    @property
    def index_path(self) -> str:
        return self.path[:-len(".segment")] + ".index"


def segment_name(first_offset: int) -> str:
    return f"{first_offset:020d}"


def last_index_entry(index_path: str) -> IndexEntry | None:
    """The index's last entry (None: an empty index)."""
    fd = os.open(index_path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size < FILE_HEADER + INDEX_ENTRY.size:
            return None
        return INDEX_ENTRY.unpack(os.pread(fd, INDEX_ENTRY.size, size - INDEX_ENTRY.size))
    finally:
        os.close(fd)


def index_search(seg: Segment, pred: Callable[[IndexEntry], bool],
                 committed_offset: int) -> IndexEntry | None:
    """The first index entry of ``seg`` for which ``pred`` is true (entries are sorted for
    it), by binary search with pread; None when there is none up to ``committed_offset``."""
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
        if found is not None and found[0] > committed_offset:
            return None
        return found
    finally:
        os.close(fd)


def recover_tail(segments: list[Segment], seg_fd: int,
                 idx_fd: int) -> tuple[int, int, int, int]:
    """Check the last segment at open: cut a torn index entry, re-index whole chunks
    written after the last index entry, truncate whatever follows the last whole chunk.
    Returns (segment size, index size, next offset, first offset of the last chunk)."""
    seg = segments[-1]
    directory = os.path.dirname(seg.path)
    last_chunk = -1
    seg_size = os.fstat(seg_fd).st_size
    idx_size = os.fstat(idx_fd).st_size
    if idx_size < FILE_HEADER:
        os.ftruncate(idx_fd, 0)
        os.pwrite(idx_fd, INDEX_MAGIC, 0)
        idx_size = FILE_HEADER
    n = (idx_size - FILE_HEADER) // INDEX_ENTRY.size
    pos, offset = FILE_HEADER, seg.first_offset
    # walk back over index entries pointing past the segment or at a bad chunk
    while n:
        first, ts, cpos, nrec = INDEX_ENTRY.unpack(
            os.pread(idx_fd, INDEX_ENTRY.size, FILE_HEADER + (n - 1) * INDEX_ENTRY.size))
        end = _chunk_end(directory, seg_fd, cpos, seg_size)
        if end is not None:
            pos, offset = end, first + nrec
            last_chunk = first
            break
        n -= 1
    idx_end = FILE_HEADER + n * INDEX_ENTRY.size
    if idx_end != idx_size:
        os.ftruncate(idx_fd, idx_end)
    # chunks after the last indexed one (a crash between the two writes)
    while pos < seg_size:
        end = _chunk_end(directory, seg_fd, pos, seg_size)
        if end is None:
            break
        header = CHUNK_HEADER.unpack(os.pread(seg_fd, CHUNK_HEADER.size, pos))
        first, nrec, ts = header[6], header[3], header[4]
        if first != offset:
            break
        os.pwrite(idx_fd, INDEX_ENTRY.pack(first, ts, pos, nrec), idx_end)
        idx_end += INDEX_ENTRY.size
        last_chunk = first
        pos, offset = end, first + nrec
    if pos < seg_size:
        log.warning("stream %s: torn tail of %d bytes after offset %d truncated (%s)",
                    directory, seg_size - pos, offset - 1, os.path.basename(seg.path))
        os.ftruncate(seg_fd, pos)
        os.fsync(seg_fd)
    os.fsync(idx_fd)
    if last_chunk < 0 and len(segments) > 1:
        # an empty last segment: the last chunk is the previous segment's last
        last = last_index_entry(segments[-2].index_path)
        if last is not None:
            last_chunk = last[0]
    return pos, idx_end, offset, last_chunk


def _chunk_end(directory: str, seg_fd: int, pos: int, seg_size: int) -> int | None:
    """The end position of the chunk at ``pos`` if it is whole and its CRC matches."""
    if pos < FILE_HEADER or pos + CHUNK_HEADER.size > seg_size:
        return None
    header = CHUNK_HEADER.unpack(os.pread(seg_fd, CHUNK_HEADER.size, pos))
    if header[0] != MAGIC_VERSION:
        return None
    dlen, tlen, flen = header[8], header[9], header[10]
    end = pos + CHUNK_HEADER.size + flen + dlen + tlen
    if end > seg_size:
        return None
    data = os.pread(seg_fd, dlen, pos + CHUNK_HEADER.size + flen)
    if zlib.crc32(data) != header[7]:
        log.warning("stream %s: chunk at offset %d fails its CRC", directory, header[6])
        return None
    return end


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(directory: str, name: str, data: bytes) -> None:
    """``name`` in ``directory`` replaced atomically and durably by ``data``."""
    path = os.path.join(directory, name)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(directory)


def drop_old_segments(segments: list[Segment], max_bytes: int | None, max_age: float | None,
                      total: int, now: float) -> int:
    """Delete whole segments, oldest first and never the last (the one being written),
    while ``total`` bytes are over ``max_bytes`` or a segment's newest chunk is older than
    ``max_age`` seconds; returns how many went (taken out of ``segments`` too)."""
    removed = 0
    while len(segments) > 1:
        seg = segments[0]
        size = os.path.getsize(seg.path)
        drop = max_bytes is not None and total > max_bytes
        if not drop and max_age is not None:
            newest = last_index_entry(seg.index_path)
            drop = newest is not None and newest[1] / 1000.0 < now - max_age
        if not drop:
            break
        os.unlink(seg.path)
        try:
            os.unlink(seg.index_path)
        except FileNotFoundError:
            pass
        del segments[0]
        total -= size
        removed += 1
    return removed
