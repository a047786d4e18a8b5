"""Stream protocol framing, sans-IO: keys, codes, FrameReader, Cursor; not commands or encoding.

Stream protocol framing, sans-IO: the keys and response codes, ``FrameReader`` (whole
frames out of a byte stream) and ``Cursor`` (checked field reads). Not the commands' fields
(``commands``), their encoding (``codec``) or chunks and sub-entries (``subentry``).

A frame is a uint32 size (not counting itself), then ``key:uint16 version:uint16`` and the
command's fields (PROTOCOL.adoc of rabbitmq_stream). ``FrameReader.feed(data)`` returns
every complete frame held so far as ``(key, version, payload)``. Violations raise
``FrameError`` with the response code the server closes the connection with: a size above
the negotiated frame_max is ``FRAME_TOO_LARGE`` (raised from the size field alone, before
any of the body is held); a body that ends early is ``UNKNOWN_FRAME``. Array counts and
lengths are checked against the bytes actually in the frame before anything is read, so no
buffer is sized by what a peer declares.
"""
from __future__ import annotations

import struct

from .. import bigendian

# ---- keys (responses are key | 0x8000) ----
DECLARE_PUBLISHER = 1
PUBLISH = 2
PUBLISH_CONFIRM = 3
PUBLISH_ERROR = 4
QUERY_PUBLISHER_SEQUENCE = 5
DELETE_PUBLISHER = 6
SUBSCRIBE = 7
DELIVER = 8
CREDIT = 9
STORE_OFFSET = 10
QUERY_OFFSET = 11
UNSUBSCRIBE = 12
CREATE = 13
DELETE = 14
METADATA = 15
METADATA_UPDATE = 16
PEER_PROPERTIES = 17
SASL_HANDSHAKE = 18
SASL_AUTHENTICATE = 19
TUNE = 20
OPEN = 21
CLOSE = 22
HEARTBEAT = 23
ROUTE = 24
PARTITIONS = 25
CONSUMER_UPDATE = 26
EXCHANGE_COMMAND_VERSIONS = 27
STREAM_STATS = 28
CREATE_SUPER_STREAM = 29
DELETE_SUPER_STREAM = 30
RESPONSE = 0x8000

# ---- response codes ----
OK = 1
STREAM_DOES_NOT_EXIST = 2
SUBSCRIPTION_ID_ALREADY_EXISTS = 3
SUBSCRIPTION_ID_DOES_NOT_EXIST = 4
STREAM_ALREADY_EXISTS = 5
STREAM_NOT_AVAILABLE = 6
SASL_MECHANISM_NOT_SUPPORTED = 7
AUTHENTICATION_FAILURE = 8
SASL_ERROR = 9
SASL_CHALLENGE = 10
SASL_AUTHENTICATION_FAILURE_LOOPBACK = 11
VIRTUAL_HOST_ACCESS_FAILURE = 12
UNKNOWN_FRAME = 13
FRAME_TOO_LARGE = 14
INTERNAL_ERROR = 15
ACCESS_REFUSED = 16
PRECONDITION_FAILED = 17
PUBLISHER_DOES_NOT_EXIST = 18
NO_OFFSET = 19

# offset specifications of Subscribe
OFFSET_FIRST, OFFSET_LAST, OFFSET_NEXT, OFFSET_OFFSET, OFFSET_TIMESTAMP = 1, 2, 3, 4, 5

# sub-entry compression types
COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD = range(5)

# the chunk header osiris writes and Deliver carries (the magic 5 and version 0 in one byte)
CHUNK_MAGIC_VERSION = 0x50
CHUNK_HEADER = struct.Struct(">bbHIqQQiIII")  # 48 bytes
CHUNK_HEADER_SIZE = CHUNK_HEADER.size

_U8, _U16, _I16, _U32 = bigendian.U8, bigendian.U16, bigendian.I16, bigendian.U32
_I32, _U64, _I64 = bigendian.I32, bigendian.U64, bigendian.I64
_HEAD = struct.Struct(">IHH")
_ENTRY_ID = struct.Struct(">Qi")
_SUBENTRY = struct.Struct(">BHII")


class FrameError(ValueError):
    """A frame the server cannot take: it closes the connection with ``code``."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _unknown(reason: str) -> FrameError:
    return FrameError(UNKNOWN_FRAME, reason)


# ---- reading ----
class Cursor:
    """Reads fields off one frame's payload; every read is checked against what is there."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf, pos: int = 0):
        self.buf = memoryview(buf)
        self.pos = pos
        self.end = len(self.buf)

    def _take(self, st: struct.Struct):
        pos = self.pos
        if pos + st.size > self.end:
            raise _unknown("frame too short")
        self.pos = pos + st.size
        return st.unpack_from(self.buf, pos)[0]

    def u8(self) -> int:
        return self._take(_U8)

    def u16(self) -> int:
        return self._take(_U16)

    def u32(self) -> int:
        return self._take(_U32)

    def i32(self) -> int:
        return self._take(_I32)

    def u64(self) -> int:
        return self._take(_U64)

    def i64(self) -> int:
        return self._take(_I64)

    def raw(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > self.end:
            raise _unknown("length beyond the frame")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def str(self) -> str | None:
        n = self._take(_I16)
        if n == -1:
            return None
        try:
            return str(self.raw(n), "utf-8")
        except UnicodeDecodeError:
            raise _unknown("string not UTF-8") from None

    def bytes(self) -> bytes | None:
        n = self._take(_I32)
        if n == -1:
            return None
        return bytes(self.raw(n))

    def count(self, min_size: int) -> int:
        """An array's element count, refused when its elements cannot fit in the rest."""
        n = self._take(_I32)
        if n < 0 or n * min_size > self.end - self.pos:
            raise _unknown("array longer than the frame")
        return n

    @property
    def remaining(self) -> int:
        return self.end - self.pos


class FrameReader:
    """Splits a byte stream into frames. ``max_frame`` (0: none) bounds one frame's size;
    the buffer only ever holds bytes that arrived."""

    def __init__(self, max_frame: int):
        self.max_frame = max_frame
        self._buf = bytearray()
        self._skip = 0  # bytes of a refused frame still to come

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data) -> list[tuple[int, int, memoryview]]:
        if self._skip:
            n = min(self._skip, len(data))
            self._skip -= n
            data = memoryview(data)[n:]
        buf = self._buf
        buf += data
        frames = []
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            size = _U32.unpack_from(buf, pos)[0]
            if self.max_frame and size > self.max_frame:
                # its bytes are skipped as they come (never held), so that the stream
                # stays in step and the client's answer to the Close can be read
                skip = min(4 + size, end - pos)
                self._skip = 4 + size - skip
                del buf[:pos + skip]
                raise FrameError(FRAME_TOO_LARGE, f"frame of {size} bytes above frame_max "
                                 f"{self.max_frame}")
            if size < 4:
                del buf[:pos]
                raise _unknown("frame shorter than key and version")
            if end - pos - 4 < size:
                break
            key, version = struct.unpack_from(">HH", buf, pos + 4)
            frames.append((key, version, bytes(buf[pos + 8:pos + 4 + size])))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return frames  # type: ignore[return-value]


# ---- command classes ----
# Field types: u8 u16 u32 u64 i64 str bytes, "props" (a [string string] map, kept in
