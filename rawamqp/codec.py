"""AMQP 0-9-1 wire format: frames, method ids, strings, field tables, basic properties.

Written from the specification and RabbitMQ's errata, never from ``broker/``: this is the
second opinion the tests and the benchmark hold the broker against.

Field values use RabbitMQ's type tags (its ``rabbit_binary_parser``/``_generator``), which
differ from the 0-9-1 grammar: ``s`` is a signed 16-bit int (not a short string), ``l`` a
signed 64-bit int, ``x`` a byte array, and there is no ``U``; ``L`` is read as a signed 64-bit
int, like RabbitMQ does.  The decimal mantissa is an unsigned 32-bit int (spec and RabbitMQ);
a negative one given to the encoder is sent in two's complement, as pika and the Java client do.

=====  ==============  ==========================================================
 tag    wire            Python (encode default / decode)
=====  ==============  ==========================================================
 t      octet 0|1       bool
 b      int8            ``Typed("b", n)``
 B      uint8           ``Typed("B", n)``
 s      int16           ``Typed("s", n)``
 u      uint16          ``Typed("u", n)``
 I      int32           int in [-2**31, 2**31)
 i      uint32          ``Typed("i", n)``
 l      int64           any other int in [-2**63, 2**63)
 L      int64           decode only (RabbitMQ reads it as ``l``)
 f      float32         ``Typed("f", x)``
 d      float64         float
 D      scale, uint32   decimal.Decimal; decoded as (scale, mantissa)
 S      longstr         str, bytes (decoded as str; as bytes if not valid UTF-8)
 x      longstr         bytearray, memoryview (decoded as bytes)
 A      array           list, tuple
 T      uint64 seconds  datetime.datetime; decoded as int
 F      table           dict
 V      nothing         None
=====  ==============  ==========================================================

A plain int goes out as ``I`` when it fits 32 bits, else ``l`` (as pika and the Java client
do); RabbitMQ treats the two as the same integer (a queue declared with x-message-ttl
``I`` 1000 is redeclared fine with ``l`` 1000), so only the width differs.

``Typed(tag, value)`` forces a tag; ``TypedReader`` decodes to ``Typed`` values (a named
tuple, so it compares equal to plain ``(tag, value)`` pairs) which encode back to the same
bytes.
"""
from __future__ import annotations

import datetime
import decimal
import struct
from typing import Any, NamedTuple

__all__ = [
    "BASIC_ACK",
    "BASIC_CANCEL",
    "BASIC_CANCEL_OK",
    "BASIC_CONSUME",
    "BASIC_CONSUME_OK",
    "BASIC_DELIVER",
    "BASIC_GET",
    "BASIC_GET_EMPTY",
    "BASIC_GET_OK",
    "BASIC_NACK",
    "BASIC_PROPERTIES",
    "BASIC_PUBLISH",
    "BASIC_QOS",
    "BASIC_QOS_OK",
    "BASIC_RECOVER",
    "BASIC_RECOVER_ASYNC",
    "BASIC_RECOVER_OK",
    "BASIC_REJECT",
    "BASIC_RETURN",
    "CHANNEL_CLOSE",
    "CHANNEL_CLOSE_OK",
    "CHANNEL_FLOW",
    "CHANNEL_FLOW_OK",
    "CHANNEL_OPEN",
    "CHANNEL_OPEN_OK",
    "CONFIRM_SELECT",
    "CONFIRM_SELECT_OK",
    "CONNECTION_BLOCKED",
    "CONNECTION_CLOSE",
    "CONNECTION_CLOSE_OK",
    "CONNECTION_OPEN",
    "CONNECTION_OPEN_OK",
    "CONNECTION_SECURE",
    "CONNECTION_SECURE_OK",
    "CONNECTION_START",
    "CONNECTION_START_OK",
    "CONNECTION_TUNE",
    "CONNECTION_TUNE_OK",
    "CONNECTION_UNBLOCKED",
    "CONNECTION_UPDATE_SECRET",
    "CONNECTION_UPDATE_SECRET_OK",
    "EXCHANGE_BIND",
    "EXCHANGE_BIND_OK",
    "EXCHANGE_DECLARE",
    "EXCHANGE_DECLARE_OK",
    "EXCHANGE_DELETE",
    "EXCHANGE_DELETE_OK",
    "EXCHANGE_UNBIND",
    "EXCHANGE_UNBIND_OK",
    "FRAME_BODY",
    "FRAME_END",
    "FRAME_END_OCTET",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_METHOD",
    "FRAME_OVERHEAD",
    "PROTOCOL_HEADER",
    "QUEUE_BIND",
    "QUEUE_BIND_OK",
    "QUEUE_DECLARE",
    "QUEUE_DECLARE_OK",
    "QUEUE_DELETE",
    "QUEUE_DELETE_OK",
    "QUEUE_PURGE",
    "QUEUE_PURGE_OK",
    "QUEUE_UNBIND",
    "QUEUE_UNBIND_OK",
    "TX_COMMIT",
    "TX_COMMIT_OK",
    "TX_ROLLBACK",
    "TX_ROLLBACK_OK",
    "TX_SELECT",
    "TX_SELECT_OK",
    "FieldError",
    "Reader",
    "Typed",
    "TypedReader",
    "ack_frame",
    "amqplain_response",
    "array",
    "basic_properties",
    "bits",
    "body_frame",
    "body_frames",
    "content_header",
    "encode_publish",
    "field_value",
    "frame",
    "heartbeat_frame",
    "longstr",
    "method_frame",
    "method_payload",
    "parse_basic_properties",
    "plain_response",
    "shortstr",
    "split_frames",
    "table",
]

# ------------------------------------------------------------------ constants
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = b"\xce"
FRAME_END_OCTET = 0xCE
FRAME_OVERHEAD = 8  # 7-octet frame header + frame-end: a body frame holds frame_max - 8

# (class_id, method_id) of every 0-9-1 method, RabbitMQ extensions included
CONNECTION_START = (10, 10)
CONNECTION_START_OK = (10, 11)
CONNECTION_SECURE = (10, 20)
CONNECTION_SECURE_OK = (10, 21)
CONNECTION_TUNE = (10, 30)
CONNECTION_TUNE_OK = (10, 31)
CONNECTION_OPEN = (10, 40)
CONNECTION_OPEN_OK = (10, 41)
CONNECTION_CLOSE = (10, 50)
CONNECTION_CLOSE_OK = (10, 51)
CONNECTION_BLOCKED = (10, 60)
CONNECTION_UNBLOCKED = (10, 61)
CONNECTION_UPDATE_SECRET = (10, 70)
CONNECTION_UPDATE_SECRET_OK = (10, 71)
CHANNEL_OPEN = (20, 10)
CHANNEL_OPEN_OK = (20, 11)
CHANNEL_FLOW = (20, 20)
CHANNEL_FLOW_OK = (20, 21)
CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
EXCHANGE_DECLARE = (40, 10)
EXCHANGE_DECLARE_OK = (40, 11)
EXCHANGE_DELETE = (40, 20)
EXCHANGE_DELETE_OK = (40, 21)
EXCHANGE_BIND = (40, 30)
EXCHANGE_BIND_OK = (40, 31)
EXCHANGE_UNBIND = (40, 40)
EXCHANGE_UNBIND_OK = (40, 51)  # sic: RabbitMQ's (and the errata's) id
QUEUE_DECLARE = (50, 10)
QUEUE_DECLARE_OK = (50, 11)
QUEUE_BIND = (50, 20)
QUEUE_BIND_OK = (50, 21)
QUEUE_PURGE = (50, 30)
QUEUE_PURGE_OK = (50, 31)
QUEUE_DELETE = (50, 40)
QUEUE_DELETE_OK = (50, 41)
QUEUE_UNBIND = (50, 50)
QUEUE_UNBIND_OK = (50, 51)
BASIC_QOS = (60, 10)
BASIC_QOS_OK = (60, 11)
BASIC_CONSUME = (60, 20)
BASIC_CONSUME_OK = (60, 21)
BASIC_CANCEL = (60, 30)
BASIC_CANCEL_OK = (60, 31)
BASIC_PUBLISH = (60, 40)
BASIC_RETURN = (60, 50)
BASIC_DELIVER = (60, 60)
BASIC_GET = (60, 70)
BASIC_GET_OK = (60, 71)
BASIC_GET_EMPTY = (60, 72)
BASIC_ACK = (60, 80)
BASIC_REJECT = (60, 90)
BASIC_RECOVER_ASYNC = (60, 100)
BASIC_RECOVER = (60, 110)
BASIC_RECOVER_OK = (60, 111)
BASIC_NACK = (60, 120)
CONFIRM_SELECT = (85, 10)
CONFIRM_SELECT_OK = (85, 11)
TX_SELECT = (90, 10)
TX_SELECT_OK = (90, 11)
TX_COMMIT = (90, 20)
TX_COMMIT_OK = (90, 21)
TX_ROLLBACK = (90, 30)
TX_ROLLBACK_OK = (90, 31)

_FH = struct.Struct(">BHI")        # frame header: type, channel, payload size
_CM = struct.Struct(">HH")         # class id, method id
_HDR = struct.Struct(">HHQ")       # content header: class id, weight, body size
_ACK = struct.Struct(">BHIHHQB")   # a whole basic.ack frame but its frame-end
_H = struct.Struct(">H")
_I = struct.Struct(">I")
_Q = struct.Struct(">Q")


class FieldError(ValueError):
    """A field value or table that cannot be encoded or decoded."""


# ------------------------------------------------------------------ strings
def shortstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else bytes(s)
    if len(b) > 255:
        raise ValueError(f"shortstr too long ({len(b)} octets)")
    return bytes((len(b),)) + b


def longstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else bytes(s)
    return _I.pack(len(b)) + b


def bits(*flags) -> bytes:
    """Pack consecutive bit arguments into one octet, first flag in the lowest bit."""
    v = 0
    for i, f in enumerate(flags):
        if f:
            v |= 1 << i
    return bytes((v,))


# ------------------------------------------------------------------ field values
class Typed(NamedTuple):
    """A field value with an explicit type tag, e.g. ``Typed("u", 65535)``.

    Decimals are ``Typed("D", (scale, mantissa))``, arrays ``Typed("A", [values])`` and
    tables ``Typed("F", {key: value})``; the nested values may be ``Typed`` or plain.
    """

    tag: str
    value: Any


_FIXED: dict[str, struct.Struct] = {
    "b": struct.Struct(">b"), "B": struct.Struct(">B"),
    "s": struct.Struct(">h"), "u": struct.Struct(">H"),
    "I": struct.Struct(">i"), "i": struct.Struct(">I"),
    "l": struct.Struct(">q"), "L": struct.Struct(">q"),
    "f": struct.Struct(">f"), "d": struct.Struct(">d"),
    "T": struct.Struct(">Q"),
}
_DECIMAL = struct.Struct(">BI")


def _encode_typed(tag: str, v: Any) -> bytes:
    t = tag.encode()
    st = _FIXED.get(tag)
    if st is not None:
        try:
            return t + st.pack(v)
        except struct.error as e:
            raise FieldError(f"{v!r} does not fit field type {tag!r}: {e}") from None
    if tag == "t":
        return b"t\x01" if v else b"t\x00"
    if tag in ("S", "x"):
        return t + longstr(v)
    if tag == "F":
        return b"F" + table(v)
    if tag == "A":
        return b"A" + array(v)
    if tag == "D":
        if isinstance(v, decimal.Decimal):
            return b"D" + _decimal(v)
        scale, mantissa = v
        if not (-(2**31) <= mantissa < 2**32 and 0 <= scale < 256):
            raise FieldError(f"{v!r} does not fit field type 'D'")
        return b"D" + _DECIMAL.pack(scale, mantissa & 0xFFFFFFFF)
    if tag == "V":
        return b"V"
    raise FieldError(f"unknown field type tag {tag!r}")


def _decimal(v: decimal.Decimal) -> bytes:
    sign, digits, exponent = v.as_tuple()
    if not isinstance(exponent, int):
        raise FieldError(f"cannot encode {v!r} as a decimal field")
    mantissa = int("".join(map(str, digits)) or "0")
    scale = -exponent
    if scale < 0:  # 12E+3: no negative scales on the wire
        mantissa *= 10 ** -scale
        scale = 0
    if sign:
        mantissa = -mantissa
    if not (-(2**31) <= mantissa < 2**32 and scale < 256):
        raise FieldError(f"cannot encode {v!r} as a decimal field")
    return _DECIMAL.pack(scale, mantissa & 0xFFFFFFFF)


def field_value(v: Any) -> bytes:
    """Tag + encoding of one table/array value (see the module docstring for the mapping)."""
    if isinstance(v, Typed):
        return _encode_typed(v.tag, v.value)
    if isinstance(v, bool):
        return b"t\x01" if v else b"t\x00"
    if isinstance(v, int):
        if -(2**31) <= v < 2**31:
            return b"I" + _FIXED["I"].pack(v)
        if -(2**63) <= v < 2**63:
            return b"l" + _FIXED["l"].pack(v)
        raise FieldError(f"integer {v} does not fit a signed 64-bit field")
    if isinstance(v, (str, bytes)):
        return b"S" + longstr(v)
    if isinstance(v, dict):
        return b"F" + table(v)
    if isinstance(v, (list, tuple)):
        return b"A" + array(v)
    if isinstance(v, float):
        return b"d" + _FIXED["d"].pack(v)
    if v is None:
        return b"V"
    if isinstance(v, (bytearray, memoryview)):
        return b"x" + longstr(v)
    if isinstance(v, decimal.Decimal):
        return b"D" + _decimal(v)
    if isinstance(v, datetime.datetime):
        return b"T" + _Q.pack(int(v.timestamp()))
    raise FieldError(f"unsupported field value {v!r}")


def table(d: dict | None) -> bytes:
    """A field table, length prefix included (``None`` and ``{}`` give the empty table)."""
    if not d:
        return b"\x00\x00\x00\x00"
    body = b"".join([shortstr(k) + field_value(v) for k, v in d.items()])
    return _I.pack(len(body)) + body


def array(items) -> bytes:
    """A field array, length prefix included (without the ``A`` tag)."""
    body = b"".join([field_value(v) for v in items])
    return _I.pack(len(body)) + body


# ------------------------------------------------------------------ frames
def frame(ftype: int, channel: int, payload: bytes, end: bytes = FRAME_END) -> bytes:
    return _FH.pack(ftype, channel, len(payload)) + payload + end


def method_payload(cm: tuple[int, int], args: bytes = b"") -> bytes:
    return _CM.pack(cm[0], cm[1]) + args


def method_frame(channel: int, cm, *args) -> bytes:
    """A method frame: ``method_frame(ch, (class_id, method_id), arguments=b"")``,
    or ``method_frame(ch, class_id, method_id, arguments=b"")``."""
    if isinstance(cm, tuple):
        if len(args) > 1:
            raise TypeError("method_frame(channel, (class, method), arguments)")
        return frame(FRAME_METHOD, channel, _CM.pack(cm[0], cm[1]) + (args[0] if args else b""))
    if not 1 <= len(args) <= 2:
        raise TypeError("method_frame(channel, class_id, method_id, arguments)")
    return frame(FRAME_METHOD, channel, _CM.pack(cm, args[0]) + (args[1] if len(args) == 2 else b""))


def content_header(channel: int, body_size: int, class_id: int = 60, props: bytes = b"\x00\x00") -> bytes:
    """A content header frame; ``props`` is the encoded property list (flags included),
    e.g. from ``basic_properties(...)``."""
    return frame(FRAME_HEADER, channel, _HDR.pack(class_id, 0, body_size) + props)


def body_frame(channel: int, data: bytes) -> bytes:
    return frame(FRAME_BODY, channel, data)


def body_frames(channel: int, body: bytes, frame_max: int = 0) -> list[bytes]:
    """The body frames of one message: at most ``frame_max - 8`` octets of body each
    (``frame_max`` 0 = no limit); an empty body has no body frame."""
    if not body:
        return []
    chunk = frame_max - FRAME_OVERHEAD if frame_max else len(body)
    if chunk <= 0:
        raise ValueError(f"frame_max {frame_max} leaves no room for a body")
    return [frame(FRAME_BODY, channel, body[i:i + chunk]) for i in range(0, len(body), chunk)]


def heartbeat_frame() -> bytes:
    return frame(FRAME_HEARTBEAT, 0, b"")


def ack_frame(channel: int, tag: int, multiple: bool = False) -> bytes:
    return _ACK.pack(FRAME_METHOD, channel, 13, 60, 80, tag, 1 if multiple else 0) + FRAME_END


def split_frames(data, pos: int = 0) -> tuple[list[tuple[int, int, bytes]], int]:
    """Cut the complete frames out of a received byte stream.

    Returns ``([(type, channel, payload), ...], end)`` where ``data[end:]`` is the start of
    an incomplete frame (keep it and append the next read).  Raises FieldError on a bad
    frame-end octet.
    """
    out = []
    n = len(data)
    while pos + 7 <= n:
        ftype, channel, size = _FH.unpack_from(data, pos)
        end = pos + 7 + size
        if end >= n:
            break
        if data[end] != FRAME_END_OCTET:
            raise FieldError(f"bad frame end {data[end]:#04x} at offset {end}")
        out.append((ftype, channel, bytes(data[pos + 7:end])))
        pos = end + 1
    return out, pos


# ------------------------------------------------------------------ basic properties
# (name, type) in property-flag order: the first one is flag bit 15
BASIC_PROPERTIES = (
    ("content_type", "shortstr"), ("content_encoding", "shortstr"), ("headers", "table"),
    ("delivery_mode", "octet"), ("priority", "octet"), ("correlation_id", "shortstr"),
    ("reply_to", "shortstr"), ("expiration", "shortstr"), ("message_id", "shortstr"),
    ("timestamp", "longlong"), ("type", "shortstr"), ("user_id", "shortstr"),
    ("app_id", "shortstr"), ("cluster_id", "shortstr"),
)
_PROPERTY_NAMES = frozenset(name for name, _ in BASIC_PROPERTIES)


def basic_properties(**props) -> bytes:
    """Encode basic-class properties (property flags + the present fields), the tail of a
    content header payload.  ``None`` values are left out."""
    unknown = set(props) - _PROPERTY_NAMES
    if unknown:
        raise TypeError(f"unknown basic properties: {sorted(unknown)}")
    flags = 0
    parts = []
    for i, (name, kind) in enumerate(BASIC_PROPERTIES):
        v = props.get(name)
        if v is None:
            continue
        flags |= 1 << (15 - i)
        if kind == "shortstr":
            parts.append(shortstr(v))
        elif kind == "table":
            parts.append(table(v))
        elif kind == "octet":
            parts.append(bytes((v,)))
        else:
            parts.append(_Q.pack(v))
    return _H.pack(flags) + b"".join(parts)


def encode_publish(channel: int, exchange: str, routing_key: str, body: bytes,
                   frame_max: int, delivery_mode: int = 1) -> tuple[bytes, int]:
    """basic.publish + content header (delivery-mode only) + body frames, as one buffer.

    Returns (bytes, offset of body[0] within them) so that a sender can patch the body in
    place (the benchmark stamps a timestamp there)."""
    m = method_frame(channel, BASIC_PUBLISH,
                     b"\x00\x00" + shortstr(exchange) + shortstr(routing_key) + b"\x00")
    h = content_header(channel, len(body), props=basic_properties(delivery_mode=delivery_mode))
    return b"".join([m, h, *body_frames(channel, body, frame_max)]), len(m) + len(h) + 7


# ------------------------------------------------------------------ SASL
def plain_response(user: str = "guest", password: str = "guest") -> bytes:
    return b"\x00" + user.encode() + b"\x00" + password.encode()


def amqplain_response(user: str = "guest", password: str = "guest") -> bytes:
    # AMQPLAIN: a field table without its leading length
    return table({"LOGIN": user, "PASSWORD": password})[4:]


# ------------------------------------------------------------------ decoding
class Reader:
    """Sequential reader over a payload (bytes, bytearray or memoryview) from ``pos`` on."""

    __slots__ = ("data", "pos")

    def __init__(self, data, pos: int = 0):
        self.data = data
        self.pos = pos

    def take(self, n: int) -> bytes:
        p = self.pos
        b = bytes(self.data[p:p + n])
        if len(b) != n:
            raise ValueError("short read in payload")
        self.pos = p + n
        return b

    def _unpack(self, st: struct.Struct):
        try:
            (v,) = st.unpack_from(self.data, self.pos)
        except struct.error:
            raise ValueError("short read in payload") from None
        self.pos += st.size
        return v

    def octet(self) -> int:
        return self.take(1)[0]

    def short(self) -> int:
        return self._unpack(_H)

    def long(self) -> int:
        return self._unpack(_I)

    def longlong(self) -> int:
        return self._unpack(_Q)

    def shortstr(self) -> str:
        return self.take(self.octet()).decode("utf-8", "replace")

    def longstr(self) -> bytes:
        return self.take(self.long())

    def bits(self, n: int) -> list[bool]:
        """n consecutive bit arguments packed in one octet (n <= 8)."""
        v = self.octet()
        return [bool(v >> i & 1) for i in range(n)]

    def skip_table(self) -> None:
        n = self._unpack(_I)
        self.pos += n

    def table(self) -> dict:
        n = self.long()
        end = self.pos + n
        if end > len(self.data):
            raise ValueError("table length overruns the payload")
        out = {}
        while self.pos < end:
            k = self.shortstr()
            out[k] = self.value()
        if self.pos != end:
            raise ValueError("table contents overrun its length")
        return out

    def array(self) -> list:
        n = self.long()
        end = self.pos + n
        if end > len(self.data):
            raise ValueError("array length overruns the payload")
        out = []
        while self.pos < end:
            out.append(self.value())
        if self.pos != end:
            raise ValueError("array contents overrun its length")
        return out

    def value(self):
        """One tagged field value (see the module docstring for what each tag gives)."""
        t = chr(self.octet())
        st = _FIXED.get(t)
        if st is not None:
            return self._unpack(st)
        if t == "S":
            b = self.longstr()
            try:
                return b.decode()
            except UnicodeDecodeError:
                return b
        if t == "t":
            return bool(self.octet())
        if t == "F":
            return self.table()
        if t == "A":
            return self.array()
        if t == "x":
            return self.longstr()
        if t == "D":
            return (self.octet(), self._unpack(_I))
        if t == "V":
            return None
        raise ValueError(f"unknown field type {t.encode('latin-1')!r}")


class TypedReader(Reader):
    """Like Reader, but field values come back as ``Typed(tag, value)`` (equal to plain
    ``(tag, value)`` tuples), nested ones too; they encode back to the same octets."""

    __slots__ = ()

    def value(self):
        t = chr(self.data[self.pos]) if self.pos < len(self.data) else ""
        return Typed(t, Reader.value(self))


def parse_basic_properties(payload, typed: bool = False) -> dict:
    """Parse a content header payload of class basic: the present properties by name,
    plus ``_body_size``.  ``typed`` decodes ``headers`` values as
    ``Typed`` pairs.  Continuation flag words (bit 0) are followed."""
    r = (TypedReader if typed else Reader)(payload)
    _class_id, _weight, body_size = r.short(), r.short(), r.longlong()
    flag_words = [r.short()]
    while flag_words[-1] & 1:
        flag_words.append(r.short())
    props: dict[str, Any] = {"_body_size": body_size}
    for i, (name, kind) in enumerate(BASIC_PROPERTIES):
        word, bit = divmod(i, 15)
        if word < len(flag_words) and flag_words[word] & (1 << (15 - bit)):
            props[name] = getattr(r, kind)()
    return props
