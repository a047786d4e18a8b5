"""A stream chunk's layout (header, Bloom filter, entries), no I/O; not files or durability.

A stream chunk as osiris lays it out, with no I/O: the 48-byte header, the Bloom filter of
filter values, the entries (simple, or sub-entry batches). Not files, offsets or durability
(``log``).

A chunk is a 48-byte header (``CHUNK_HEADER``: magic/version 0x50, chunk type 0, entries
(u16), records (u32), timestamp (ms, i64), epoch (u64), first offset (u64), CRC32 of the
data (u32), data length (u32), trailer length (u32, 0), filter size (u8), 3 reserved
bytes), then ``filter size`` bytes of Bloom filter, then the data: the entries, each
either a *simple* entry (u32 size, top bit 0, then the record) or a *sub-batch* (osiris's:
a byte ``1ccc0000`` (c: compression, 0 none, 1 gzip), u16 records, u32 uncompressed
length, u32 length, then the records, each u32 size + bytes). Offsets count records: a
chunk holds ``first offset .. first offset + records - 1``.

``Chunk``: ``first_offset``, ``num_entries``, ``num_records``, ``timestamp``, ``header``
(48 bytes, filter size zeroed: the Stream protocol's chunk header), ``data`` (the
entries), ``bloom``; ``wire()`` = header + data; ``pieces(max_bytes)``: the chunk cut
between entries into valid chunks of at most that size (a small frame_max); ``records()``
yields ``(offset, record bytes)``; ``may_contain(values, match_unfiltered)`` asks the
filter.
"""
from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator

CHUNK_HEADER = struct.Struct(">BBHIqQQIIIB3x")
MAGIC_VERSION = 0x50  # osiris: magic 5, version 0
CHUNK_USER = 0
EPOCH = 1
BLOOM_SIZE = 16  # bytes of Bloom filter per chunk that has filter values (osiris' default)
MAX_ENTRIES = 0xFFFF  # a chunk's entry count is a u16


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
