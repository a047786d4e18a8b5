"""Stream chunks and sub-entry batches, sans-IO, opened within bounds; not frames or commands.

Stream chunks and sub-entry batches, sans-IO: entries as osiris stores them, a Deliver's
chunk, and opening a (compressed) batch within a bound. Not frame reading or commands.

A sub-entry batch (first bit of the entry set: compression in bits 4-6, record count,
uncompressed and compressed sizes) is handed on as ``SubEntry`` with the compressed bytes
untouched; ``check_subentry`` walks it in windows without keeping it, ``subentry_records``
opens it.
"""
from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from typing import Any

from .commands import SubEntry
from .frames import (
    _I32,
    _SUBENTRY,
    _U32,
    CHUNK_HEADER,
    CHUNK_HEADER_SIZE,
    CHUNK_MAGIC_VERSION,
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    PRECONDITION_FAILED,
    Cursor,
    FrameError,
    _unknown,
)


def simple_entry(message) -> bytes:
    """One message as an osiris entry: its size (first bit 0) then its bytes."""
    return _U32.pack(len(message)) + bytes(message)


def subentry_entry(s: SubEntry) -> bytes:
    """A sub-entry batch as received in a Publish, as osiris stores it."""
    return _SUBENTRY.pack(0x80 | s.compression << 4, s.count, s.uncompressed_size,
                          len(s.data)) + bytes(s.data)


def encode_chunk(first_offset: int, timestamp_ms: int, entries: list[bytes],
                 num_records: int, epoch: int = 1) -> bytes:
    """An osiris user chunk (header then entries), as Deliver carries it."""
    data = b"".join(entries)
    header = CHUNK_HEADER.pack(CHUNK_MAGIC_VERSION, 0, len(entries), num_records,
                               timestamp_ms, epoch, first_offset,
                               _I32.unpack(_U32.pack(zlib.crc32(data)))[0], len(data), 0, 0)
    return header + data


def decode_chunk(chunk) -> tuple[dict, list[bytes]]:
    """The header fields and the messages of a chunk (sub-entries opened): for tests and
    the bench, which read Deliver frames."""
    cur = Cursor(chunk)
    (magic, ctype, n_entries, n_records, ts, epoch, first, crc, length, trailer,
     _reserved) = CHUNK_HEADER.unpack_from(cur.buf, 0)
    cur.pos = CHUNK_HEADER_SIZE
    data = cur.raw(length)
    if zlib.crc32(data) != crc & 0xFFFFFFFF:
        raise _unknown("chunk CRC mismatch")
    d = Cursor(data)
    messages: list[bytes] = []
    for _ in range(n_entries):
        first_byte = d.buf[d.pos] if d.remaining else 0
        if first_byte & 0x80:
            kind, count, size, clen = _SUBENTRY.unpack_from(d.buf, d.pos)
            d.pos += _SUBENTRY.size
            messages += subentry_records(SubEntry((kind & 0x70) >> 4, count, size,
                                                  d.raw(clen)), size)
        else:
            messages.append(bytes(d.raw(d.u32())))
    return ({"magic_version": magic, "chunk_type": ctype, "num_entries": n_entries,
             "num_records": n_records, "timestamp": ts, "epoch": epoch,
             "first_offset": first, "trailer_length": trailer}, messages)


class CompressionError(FrameError):
    pass


def _codec(kind: int):
    """(decompress(data, max_out) -> bytes) for a compression type, or None when no
    library for it is installed."""
    if kind == COMPRESSION_NONE:
        return lambda data, limit: bytes(data)
    if kind == COMPRESSION_GZIP:
        def gunzip(data, limit):
            # max_length: a gzip bomb stops at the bound
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(bytes(data), limit + 1)
        return gunzip
    if kind == COMPRESSION_ZSTD:
        try:
            import zstandard
        except ImportError:
            return None

        def unzstd(data, limit):
            # read in windows: the output is bounded by ``limit``, not by the frame's header
            reader = zstandard.ZstdDecompressor().stream_reader(bytes(data))
            out = bytearray()
            while len(out) <= limit:
                piece = reader.read(min(65536, limit + 1 - len(out)))
                if not piece:
                    break
                out += piece
            return bytes(out)
        return unzstd
    if kind == COMPRESSION_LZ4:
        try:
            import lz4.frame  # type: ignore[import-untyped]
        except ImportError:
            return None

        def unlz4(data, limit):
            return lz4.frame.LZ4FrameDecompressor().decompress(bytes(data), max_length=limit + 1)
        return unlz4
    # snappy: no well-kept binding of its own (python-snappy is a shim over cramjam)
    return None


def compression_supported(kind: int) -> bool:
    return _codec(kind) is not None


def _open_subentry(s: SubEntry, limit: int):
    """A batch's records area, decompressed within ``limit`` and of its declared size."""
    if s.compression == COMPRESSION_NONE:
        raw = s.data  # as received: no copy
        if s.uncompressed_size > limit:
            raise CompressionError(PRECONDITION_FAILED, "sub-entry batch too large")
    else:
        try:
            codec = _CODECS[s.compression]
        except KeyError:
            codec = _CODECS[s.compression] = _codec(s.compression)
        if codec is None:
            raise CompressionError(PRECONDITION_FAILED,
                                   f"compression type {s.compression} not supported")
        if s.uncompressed_size > limit:
            raise CompressionError(PRECONDITION_FAILED, "sub-entry batch too large")
        try:
            raw = codec(s.data, s.uncompressed_size)
        except CompressionError:
            raise
        except Exception as exc:  # each library has its own errors for corrupt input
            raise CompressionError(PRECONDITION_FAILED,
                                   f"corrupt sub-entry batch: {exc}") from None
    if len(raw) != s.uncompressed_size:
        raise CompressionError(PRECONDITION_FAILED, "sub-entry size mismatch")
    return raw


_CODECS: dict[int, Any] = {}


# what the publish path's check inflates at a time: a batch declaring up to max_message_size
# (a gzip bomb of 128 KiB declares 128 MiB) is walked in windows, never held whole
CHECK_WINDOW = 1 << 16


def _pieces(s: SubEntry):
    """The batch's records area in pieces of at most CHECK_WINDOW (as received when not
    compressed), stopping one octet past the declared size."""
    if s.compression == COMPRESSION_NONE:
        yield s.data
        return
    try:
        codec = _CODECS[s.compression]
    except KeyError:
        codec = _CODECS[s.compression] = _codec(s.compression)
    if codec is None:
        raise CompressionError(PRECONDITION_FAILED,
                               f"compression type {s.compression} not supported")
    budget = s.uncompressed_size + 1
    try:
        if s.compression == COMPRESSION_GZIP:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            tail = bytes(s.data)
            while budget > 0:
                piece = d.decompress(tail, min(CHECK_WINDOW, budget))
                if not piece:
                    break
                budget -= len(piece)
                yield piece
                tail = d.unconsumed_tail
        elif s.compression == COMPRESSION_ZSTD:
            import zstandard
            reader = zstandard.ZstdDecompressor().stream_reader(bytes(s.data))
            while budget > 0:
                piece = reader.read(min(CHECK_WINDOW, budget))
                if not piece:
                    break
                budget -= len(piece)
                yield piece
        else:  # lz4
            import lz4.frame
            lz = lz4.frame.LZ4FrameDecompressor()
            data = bytes(s.data)
            while budget > 0 and not lz.eof:
                piece = lz.decompress(data, max_length=min(CHECK_WINDOW, budget))
                data = b""
                if not piece:
                    break
                budget -= len(piece)
                yield piece
    except CompressionError:
        raise
    except Exception as exc:  # each library has its own errors for corrupt input
        raise CompressionError(PRECONDITION_FAILED,
                               f"corrupt sub-entry batch: {exc}") from None


def check_subentry(s: SubEntry, limit: int) -> None:
    """What ``subentry_records`` checks, without copying the records out (the publish
    path: the batch is stored as it came), inflating a window at a time."""
    for _inflated in check_subentry_steps(s, limit):
        pass


def check_subentry_steps(s: SubEntry, limit: int) -> Iterator[int]:
    """``check_subentry`` a window at a time: yields how many bytes each window inflated,
    so that the caller can stop between two and go on later (a bomb's inflating is not
    one hold of the event loop); raises as ``check_subentry`` does."""
    if s.uncompressed_size > limit:
        raise CompressionError(PRECONDITION_FAILED, "sub-entry batch too large")
    unpack = _U32.unpack
    total = records = skip = 0
    head = b""  # a record's length field cut between two pieces
    for piece in _pieces(s):
        total += len(piece)
        if total > s.uncompressed_size:
            break
        pos, end = 0, len(piece)
        while pos < end:
            if skip:
                n = min(skip, end - pos)
                skip -= n
                pos += n
                continue
            take = bytes(piece[pos:pos + 4 - len(head)])
            head += take
            pos += len(take)
            if len(head) == 4:
                skip = unpack(head)[0]
                records += 1
                head = b""
        yield len(piece)
    if total != s.uncompressed_size:
        raise CompressionError(PRECONDITION_FAILED, "sub-entry size mismatch")
    if records != s.count or skip or head:
        raise CompressionError(PRECONDITION_FAILED, "sub-entry records do not add up")


def subentry_records(s: SubEntry, limit: int) -> list[bytes]:
    """The messages of a sub-entry batch. ``limit`` bounds the decompressed size (the
    caller's, e.g. max_message_size, never the declared size alone); a batch that
    decompresses to other than its declared size, or whose records do not add up, raises
    ``CompressionError``."""
    cur = Cursor(_open_subentry(s, limit))
    out = []
    try:
        for _ in range(s.count):
            out.append(bytes(cur.raw(cur.u32())))
    except FrameError:
        raise CompressionError(PRECONDITION_FAILED, "sub-entry records do not add up") from None
    if cur.remaining:
        raise CompressionError(PRECONDITION_FAILED, "sub-entry records do not add up")
    return out


def make_subentry(messages: list[bytes], compression: int = COMPRESSION_NONE) -> SubEntry:
    """A sub-entry batch of ``messages`` (clients' side: tests and the bench)."""
    raw = b"".join(simple_entry(m) for m in messages)
    if compression == COMPRESSION_GZIP:
        data = gzip.compress(raw)
    elif compression == COMPRESSION_NONE:
        data = raw
    else:
        raise ValueError(compression)
    return SubEntry(compression, len(messages), len(raw), data)
