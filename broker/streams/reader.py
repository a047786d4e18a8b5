"""A cursor over a stream log's committed chunks; not appending, committing or where to start.

A cursor over a stream log's committed chunks, one open segment file at a time. Not
appending, committing or offsets' resolution (``log``).

``Reader.next_chunk(accept=None) -> Chunk | None`` (None: nothing committed past it yet;
``accept(bloom) -> bool`` skips chunks by their filter without reading their data, at most
64 per call, ``Reader.more`` then says there is more), ``Reader.next_offset``,
``Reader.close()``.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .chunk import CHUNK_HEADER, Chunk
from .segment import Segment

if TYPE_CHECKING:
    from .log import StreamLog


@dataclass(frozen=True)
class Timestamp:
    """Attach at the first chunk published at or after this time (ms since the epoch)."""
    ms: int

class Reader:
    """A cursor over committed chunks; holds one open segment file at a time."""

    def __init__(self, stream: StreamLog, offset: int, replica: bool = False):
        self.log = stream
        self.replica = replica  # reads up to the local commit, not the majority's
        self.next_offset = offset  # the first offset not yet returned
        self._seg: Segment | None = None
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

