"""Reading messages back from the segments (mmap) by location. Does not write."""
from __future__ import annotations

import mmap
import os
from typing import TYPE_CHECKING

from .. import journal_format as jf
from ..records import decode_message
from .shared import JournalStoreState

if TYPE_CHECKING:
    from ...message import Message
    from ..journal_format import Buf


class JournalReader(JournalStoreState):
    """The store's reads of stored messages."""

    def sidecar_path(self, name: str) -> str | None:
        return os.path.join(self.jdir, name)

    def read_message(self, loc: int) -> Message:
        return self._decode_at(*self._buffer_at(loc))

    def release_read_maps(self) -> None:
        """Unmap the segments mapped for reading; they are mapped again on the next read."""
        for seg, m in list(self._maps.items()):
            try:
                m.close()
            except BufferError:  # a view is still exported: keep it
                continue
            del self._maps[seg]

    def _map(self, seg: int) -> mmap.mmap:
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
    def _decode_at(buf: Buf, off: int) -> Message:
        length, _crc, rtype = jf.HDR.unpack_from(buf, off)
        start = off + jf.HDR_SIZE + jf.ENQ.size
        message: Message = decode_message(bytes(buf[start:off + jf.HDR_SIZE + length]))
        return message

    def _stored_body_len(self, loc: int) -> int:
        buf, off = self._buffer_at(loc)
        blen: int = jf.ENQ.unpack_from(buf, off + jf.HDR_SIZE)[4]
        return blen

    def _buffer_at(self, loc: int) -> tuple[bytearray | mmap.mmap, int]:
        """``(buffer, offset)`` of the record at ``loc``: still buffered, or mapped."""
        seg = loc >> 32
        off = loc & 0xFFFFFFFF
        for chunks in (self._pending, self._inflight):
            for cseg, start, buf in chunks:
                if cseg == seg and start <= off < start + len(buf):
                    return buf, off - start
        m = self._maps.get(seg)
        if m is None or off + jf.HDR_SIZE + jf.ENQ.size > len(m):
            m = self._map(seg)
        return m, off
