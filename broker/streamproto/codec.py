"""RabbitMQ Stream protocol frames, sans-IO: bytes in, command objects out, and back.

A frame is a uint32 size (not counting itself), then ``key:uint16 version:uint16`` and the
command's fields (PROTOCOL.adoc of rabbitmq_stream). ``FrameReader.feed(data)`` returns
every complete frame held so far as ``(key, version, payload)``; ``decode(key, version,
payload)`` turns a client's frame into one of the command classes below. Violations raise
``FrameError`` with the response code the server closes the connection with: a size above
the negotiated frame_max is ``FRAME_TOO_LARGE`` (raised from the size field alone, before
any of the body is held), a body that ends early or carries bytes after its last field, an
unknown key or version is ``UNKNOWN_FRAME``. Array counts and lengths are checked against
the bytes actually in the frame before anything is read, so no buffer is sized by what a
peer declares. The ``encode_*`` functions build what the server sends; ``encode`` builds
any command object (clients' frames too: tests, the bench).

Publish entries are either one message or a sub-entry batch (first bit of the entry set:
compression in bits 4-6, record count, uncompressed and compressed sizes), handed on as
``SubEntry`` with the compressed bytes untouched; ``subentry_records`` opens one.
"""
from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

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

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
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
# order as a dict), ("array", type), "offset_spec" ((type, value)), "versions"
# ([key min max]), "stats" ([string int64]), "opt_props" (props that may be absent).

@dataclass
class Command:
    KEY: ClassVar[int] = 0
    FIELDS: ClassVar[tuple] = ()
    version: int = field(default=1, kw_only=True)


def _cmd(key: int, *spec):
    def wrap(cls):
        cls.KEY = key
        cls.FIELDS = spec
        return cls
    return wrap


@_cmd(DECLARE_PUBLISHER, "u32", "u8", "str", "str")
@dataclass
class DeclarePublisher(Command):
    correlation_id: int
    publisher_id: int
    reference: str | None
    stream: str


@dataclass
class PublishedMessage:
    publishing_id: int
    data: Any  # bytes/memoryview of one message, or a SubEntry
    filter_value: str | None = None


@dataclass
class SubEntry:
    compression: int
    count: int
    uncompressed_size: int
    data: Any  # the compressed bytes as received


@_cmd(PUBLISH)
@dataclass
class Publish(Command):
    publisher_id: int
    messages: list[PublishedMessage]


@_cmd(QUERY_PUBLISHER_SEQUENCE, "u32", "str", "str")
@dataclass
class QueryPublisherSequence(Command):
    correlation_id: int
    reference: str | None
    stream: str


@_cmd(DELETE_PUBLISHER, "u32", "u8")
@dataclass
class DeletePublisher(Command):
    correlation_id: int
    publisher_id: int


@_cmd(SUBSCRIBE, "u32", "u8", "str", "offset_spec", "u16", "opt_props")
@dataclass
class Subscribe(Command):
    correlation_id: int
    subscription_id: int
    stream: str
    offset_spec: tuple[int, int]
    credit: int
    properties: dict[str, str] = field(default_factory=dict)


@_cmd(CREDIT, "u8", "u16")
@dataclass
class Credit(Command):
    subscription_id: int
    credit: int


@_cmd(STORE_OFFSET, "str", "str", "u64")
@dataclass
class StoreOffset(Command):
    reference: str
    stream: str
    offset: int


@_cmd(QUERY_OFFSET, "u32", "str", "str")
@dataclass
class QueryOffset(Command):
    correlation_id: int
    reference: str
    stream: str


@_cmd(UNSUBSCRIBE, "u32", "u8")
@dataclass
class Unsubscribe(Command):
    correlation_id: int
    subscription_id: int


@_cmd(CREATE, "u32", "str", "props")
@dataclass
class Create(Command):
    correlation_id: int
    stream: str
    arguments: dict[str, str]


@_cmd(DELETE, "u32", "str")
@dataclass
class Delete(Command):
    correlation_id: int
    stream: str


@_cmd(METADATA, "u32", ("array", "str"))
@dataclass
class Metadata(Command):
    correlation_id: int
    streams: list[str]


@_cmd(PEER_PROPERTIES, "u32", "props")
@dataclass
class PeerProperties(Command):
    correlation_id: int
    properties: dict[str, str]


@_cmd(SASL_HANDSHAKE, "u32")
@dataclass
class SaslHandshake(Command):
    correlation_id: int


@_cmd(SASL_AUTHENTICATE, "u32", "str", "bytes")
@dataclass
class SaslAuthenticate(Command):
    correlation_id: int
    mechanism: str
    data: bytes | None


@_cmd(TUNE, "u32", "u32")
@dataclass
class Tune(Command):
    frame_max: int
    heartbeat: int


@_cmd(OPEN, "u32", "str")
@dataclass
class Open(Command):
    correlation_id: int
    virtual_host: str


@_cmd(CLOSE, "u32", "u16", "str")
@dataclass
class Close(Command):
    correlation_id: int
    code: int
    reason: str | None


@_cmd(HEARTBEAT)
@dataclass
class Heartbeat(Command):
    pass


@_cmd(ROUTE, "u32", "str", "str")
@dataclass
class Route(Command):
    correlation_id: int
    routing_key: str
    super_stream: str


@_cmd(PARTITIONS, "u32", "str")
@dataclass
class Partitions(Command):
    correlation_id: int
    super_stream: str


@_cmd(EXCHANGE_COMMAND_VERSIONS, "u32", "versions")
@dataclass
class ExchangeCommandVersions(Command):
    correlation_id: int
    versions: list[tuple[int, int, int]]


@_cmd(STREAM_STATS, "u32", "str")
@dataclass
class StreamStats(Command):
    correlation_id: int
    stream: str


@_cmd(CREATE_SUPER_STREAM, "u32", "str", ("array", "str"), ("array", "str"), "props")
@dataclass
class CreateSuperStream(Command):
    correlation_id: int
    name: str
    partitions: list[str]
    binding_keys: list[str]
    arguments: dict[str, str]


@_cmd(DELETE_SUPER_STREAM, "u32", "str")
@dataclass
class DeleteSuperStream(Command):
    correlation_id: int
    name: str


# the two responses a client sends: to the server's Close and to its ConsumerUpdate
@_cmd(CLOSE | RESPONSE, "u32", "u16")
@dataclass
class CloseResponse(Command):
    correlation_id: int
    code: int


@_cmd(CONSUMER_UPDATE | RESPONSE, "u32", "u16", "update_offset_spec")
@dataclass
class ConsumerUpdateResponse(Command):
    correlation_id: int
    code: int
    offset_spec: tuple[int, int]


CLIENT_COMMANDS: dict[int, type[Command]] = {
    cls.KEY: cls for cls in (
        DeclarePublisher, Publish, QueryPublisherSequence, DeletePublisher, Subscribe,
        Credit, StoreOffset, QueryOffset, Unsubscribe, Create, Delete, Metadata,
        PeerProperties, SaslHandshake, SaslAuthenticate, Tune, Open, Close, Heartbeat,
        Route, Partitions, ExchangeCommandVersions, StreamStats, CreateSuperStream,
        DeleteSuperStream, CloseResponse, ConsumerUpdateResponse)}

# versions this server reads (and, for Deliver, writes): ExchangeCommandVersions' answer
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {key & 0x7FFF: (1, 1) for key in CLIENT_COMMANDS}
SUPPORTED_VERSIONS[PUBLISH] = (1, 2)
SUPPORTED_VERSIONS[DELIVER] = (1, 2)
SUPPORTED_VERSIONS[PUBLISH_CONFIRM] = SUPPORTED_VERSIONS[PUBLISH_ERROR] = (1, 1)
SUPPORTED_VERSIONS[METADATA_UPDATE] = SUPPORTED_VERSIONS[CONSUMER_UPDATE] = (1, 1)

_MIN_SIZE = {"u8": 1, "u16": 2, "u32": 4, "u64": 8, "i64": 8, "str": 2, "bytes": 4}


def _read(cur: Cursor, tp) -> Any:
    if isinstance(tp, tuple):  # ("array", element)
        return [_read(cur, tp[1]) for _ in range(cur.count(_MIN_SIZE[tp[1]]))]
    if tp == "props" or tp == "opt_props":
        if tp == "opt_props" and cur.remaining == 0:  # clients before 3.11 send none
            return {}
        props = {}
        for _ in range(cur.count(4)):
            k = cur.str()
            props[k] = cur.str()
        return props
    if tp in ("offset_spec", "update_offset_spec"):
        kind = cur.u16()
        if kind in (OFFSET_FIRST, OFFSET_LAST, OFFSET_NEXT):
            # rstream answers a ConsumerUpdate with a value after every type; RabbitMQ
            # ignores what follows first/last/next there
            if tp == "update_offset_spec" and cur.remaining == 8:
                cur.u64()
            return (kind, 0)
        if kind == OFFSET_OFFSET:
            return (kind, cur.u64())
        if kind == OFFSET_TIMESTAMP:
            return (kind, cur.i64())
        raise _unknown(f"unknown offset specification {kind}")
    if tp == "versions":
        return [(cur.u16(), cur.u16(), cur.u16()) for _ in range(cur.count(6))]
    return getattr(cur, tp)()


def decode(key: int, version: int, payload) -> Command:
    """The command in one client frame (``FrameReader.feed``'s triples)."""
    cls = CLIENT_COMMANDS.get(key)
    if cls is None:
        raise _unknown(f"unknown key {key:#06x}")
    low, high = SUPPORTED_VERSIONS[key & 0x7FFF]
    if not low <= version <= high:
        raise _unknown(f"unsupported version {version} of key {key:#06x}")
    cur = Cursor(payload)
    if cls is Publish:
        return _decode_publish(cur, version)
    values = [_read(cur, tp) for tp in cls.FIELDS]
    if cur.remaining:
        raise _unknown(f"{cur.remaining} bytes after the last field")
    return cls(*values, version=version)


def _decode_publish(cur: Cursor, version: int) -> Publish:
    publisher_id = cur.u8()
    messages = []
    # every entry is at least 12 bytes (publishing id and a size)
    for _ in range(cur.count(12)):
        publishing_id = cur.u64()
        filter_value = cur.str() if version == 2 else None
        if cur.remaining and cur.buf[cur.pos] & 0x80:
            kind, count, size, length = _SUBENTRY.unpack_from(cur.buf, cur.pos) \
                if cur.remaining >= _SUBENTRY.size else (0, 0, 0, -1)
            if length < 0:
                raise _unknown("frame too short")
            cur.pos += _SUBENTRY.size
            data: Any = SubEntry((kind & 0x70) >> 4, count, size, cur.raw(length))
        else:
            n = cur.i32()
            data = cur.raw(n)
        messages.append(PublishedMessage(publishing_id, data, filter_value))
    if cur.remaining:
        raise _unknown(f"{cur.remaining} bytes after the last field")
    return Publish(publisher_id, messages, version=version)


# ---- writing ----
def _w_str(out: list, s: str | None) -> None:
    if s is None:
        out.append(_I16.pack(-1))
        return
    b = s.encode()
    out.append(_I16.pack(len(b)))
    out.append(b)


def _write(out: list, tp, value) -> None:
    if isinstance(tp, tuple):
        out.append(_I32.pack(len(value)))
        for v in value:
            _write(out, tp[1], v)
    elif tp == "props" or tp == "opt_props":
        out.append(_I32.pack(len(value)))
        for k, v in value.items():
            _w_str(out, k)
            _w_str(out, v)
    elif tp in ("offset_spec", "update_offset_spec"):
        kind, v = value
        out.append(_U16.pack(kind))
        if kind == OFFSET_OFFSET:
            out.append(_U64.pack(v))
        elif kind == OFFSET_TIMESTAMP:
            out.append(_I64.pack(v))
    elif tp == "versions":
        out.append(_I32.pack(len(value)))
        for k, lo, hi in value:
            out.append(struct.pack(">HHH", k, lo, hi))
    elif tp == "stats":
        out.append(_I32.pack(len(value)))
        for k, v in value.items():
            _w_str(out, k)
            out.append(_I64.pack(v))
    elif tp == "str":
        _w_str(out, value)
    elif tp == "bytes":
        if value is None:
            out.append(_I32.pack(-1))
        else:
            out.append(_I32.pack(len(value)))
            out.append(bytes(value))
    else:
        out.append({"u8": _U8, "u16": _U16, "u32": _U32, "u64": _U64, "i64": _I64,
                    "i32": _I32}[tp].pack(value))


def frame(key: int, version: int, spec, values) -> bytes:
    """One frame: size, key, version, then ``values`` written as ``spec`` says."""
    out: list = []
    for tp, v in zip(spec, values, strict=True):
        _write(out, tp, v)
    body = b"".join(out)
    return _HEAD.pack(len(body) + 4, key, version) + body


def encode(cmd: Command) -> bytes:
    """Any command object as a frame (what a client sends: tests and the bench)."""
    if isinstance(cmd, Publish):
        out: list = [_U8.pack(cmd.publisher_id), _I32.pack(len(cmd.messages))]
        for m in cmd.messages:
            out.append(_U64.pack(m.publishing_id))
            if cmd.version == 2:
                _w_str(out, m.filter_value)
            if isinstance(m.data, SubEntry):
                s = m.data
                out.append(_SUBENTRY.pack(0x80 | s.compression << 4, s.count,
                                          s.uncompressed_size, len(s.data)))
                out.append(bytes(s.data))
            else:
                out.append(_I32.pack(len(m.data)))
                out.append(bytes(m.data))
        body = b"".join(out)
        return _HEAD.pack(len(body) + 4, PUBLISH, cmd.version) + body
    values = [getattr(cmd, f.name) for f in fields(cmd) if f.name != "version"]
    return frame(cmd.KEY, cmd.version, cmd.FIELDS, values)


# what the server sends: responses (key | 0x8000, correlation id, code, then these fields)
RESPONSE_FIELDS: dict[int, tuple] = {
    PEER_PROPERTIES: ("props",),
    SASL_HANDSHAKE: (("array", "str"),),
    OPEN: ("props",),
    QUERY_PUBLISHER_SEQUENCE: ("u64",),
    QUERY_OFFSET: ("u64",),
    ROUTE: (("array", "str"),),
    PARTITIONS: (("array", "str"),),
    EXCHANGE_COMMAND_VERSIONS: ("versions",),
    STREAM_STATS: ("stats",),
}


def encode_response(key: int, correlation_id: int, code: int, *extra) -> bytes:
    """A response; the extra fields (``RESPONSE_FIELDS``) only when ``code`` is OK, as
    RabbitMQ leaves them out of an error except for the sequence and offset queries."""
    spec = RESPONSE_FIELDS.get(key, ())
    if code != OK and key not in (QUERY_PUBLISHER_SEQUENCE, QUERY_OFFSET):
        spec, extra = (), ()
    elif len(extra) != len(spec):
        spec = spec[:len(extra)]
    return frame(key | RESPONSE, 1, ("u32", "u16", *spec), (correlation_id, code, *extra))


def encode_sasl_response(correlation_id: int, code: int, challenge: bytes | None = None) -> bytes:
    spec: tuple = ("u32", "u16") + (("bytes",) if challenge is not None else ())
    values: tuple = (correlation_id, code) + ((challenge,) if challenge is not None else ())
    return frame(SASL_AUTHENTICATE | RESPONSE, 1, spec, values)


def encode_credit_error(code: int, subscription_id: int) -> bytes:
    """Credit's only answer, sent on a problem (no correlation id)."""
    return frame(CREDIT | RESPONSE, 1, ("u16", "u8"), (code, subscription_id))


def encode_metadata(correlation_id: int, brokers: list[tuple[int, str, int]],
                    streams: list[tuple[str, int, int, list[int]]]) -> bytes:
    out: list = [_U32.pack(correlation_id), _I32.pack(len(brokers))]
    for ref, host, port in brokers:
        out.append(_U16.pack(ref))
        _w_str(out, host)
        out.append(_U32.pack(port))
    out.append(_I32.pack(len(streams)))
    for name, code, leader, replicas in streams:
        _w_str(out, name)
        out.append(struct.pack(">HH", code, leader))
        out.append(_I32.pack(len(replicas)))
        out.extend(_U16.pack(r) for r in replicas)
    body = b"".join(out)
    return _HEAD.pack(len(body) + 4, METADATA | RESPONSE, 1) + body


def encode_tune(frame_max: int, heartbeat: int) -> bytes:
    return frame(TUNE, 1, ("u32", "u32"), (frame_max, heartbeat))


def encode_heartbeat() -> bytes:
    return _HEAD.pack(4, HEARTBEAT, 1)


def encode_close(correlation_id: int, code: int, reason: str) -> bytes:
    return frame(CLOSE, 1, ("u32", "u16", "str"), (correlation_id, code, reason))


def encode_publish_confirm(publisher_id: int, ids: list[int]) -> bytes:
    n = len(ids)
    return (_HEAD.pack(4 + 1 + 4 + 8 * n, PUBLISH_CONFIRM, 1) + _U8.pack(publisher_id)
            + _I32.pack(n) + struct.pack(f">{n}Q", *ids))


def encode_publish_error(publisher_id: int, errors: list[tuple[int, int]]) -> bytes:
    out = [_U8.pack(publisher_id), _I32.pack(len(errors))]
    out.extend(struct.pack(">QH", pid, code) for pid, code in errors)
    body = b"".join(out)
    return _HEAD.pack(len(body) + 4, PUBLISH_ERROR, 1) + body


def encode_metadata_update(code: int, stream: str) -> bytes:
    return frame(METADATA_UPDATE, 1, ("u16", "str"), (code, stream))


def encode_consumer_update(correlation_id: int, subscription_id: int, active: bool) -> bytes:
    return frame(CONSUMER_UPDATE, 1, ("u32", "u8", "u8"),
                 (correlation_id, subscription_id, 1 if active else 0))


def encode_deliver_header(subscription_id: int, chunk_size: int, version: int = 1,
                          committed_offset: int = 0) -> bytes:
    """The bytes before a chunk in a Deliver frame (the chunk itself follows as is)."""
    if version == 2:
        return (_HEAD.pack(4 + 1 + 8 + chunk_size, DELIVER, 2) + _U8.pack(subscription_id)
                + _U64.pack(committed_offset))
    return _HEAD.pack(4 + 1 + chunk_size, DELIVER, 1) + _U8.pack(subscription_id)


# ---- chunks and entries ----
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
