"""Field tables, arrays and basic properties, with RabbitMQ's type tags.

RabbitMQ's tags differ from the 0-9-1 errata in a few places (it uses 's' for a
signed 16-bit short and 'l' for a signed 64-bit long); we follow RabbitMQ since
that is what every client speaks.
"""
from __future__ import annotations

import datetime
import decimal
import struct
from typing import Any, Final, TypeAlias

from .. import bigendian

# A field table as decoded from / encoded to the wire. Values are arbitrary wire data
# (bytes for 'S', int, bool, Decimal, nested tables and lists, ...) checked by whoever
# reads them, so they are ``Any``; a TypedDict would not fit the dict-mutating callers.
FieldTable: TypeAlias = dict[str, Any]
# Decoded basic properties (``PROPERTY_FIELDS`` names -> str / int / FieldTable).
Properties: TypeAlias = dict[str, Any]
# What the decoders read from: a frame payload or a slice of one.
ReadableBuffer: TypeAlias = bytes | bytearray | memoryview

_B, _b, _h, _H = bigendian.U8, bigendian.I8, bigendian.I16, bigendian.U16
_i, _I, _q, _Q = bigendian.I32, bigendian.U32, bigendian.I64, bigendian.U64
_f, _d = bigendian.F32, bigendian.F64


class FieldError(ValueError):
    pass


class Long(int):
    """An integer that must be encoded as a signed 64-bit 'l' (as RabbitMQ's x-death count)."""


class Timestamp(int):
    """Seconds since the epoch, encoded with tag 'T'."""


def decode_table(buf: ReadableBuffer, offset: int) -> tuple[FieldTable, int]:
    """The field table at ``offset`` and the offset after it.

    A flat loop over the table's own values (the hot path: publish headers are mostly
    flat); a nested table or array goes to ``_decode_nested``, which never recurses.
    """
    (length,) = _I.unpack_from(buf, offset)
    offset += 4
    end = offset + length
    if end > len(buf):
        raise FieldError("table length overruns the frame")
    table: FieldTable = {}
    while offset < end:
        n = buf[offset]
        offset += 1
        key = bytes(buf[offset:offset + n]).decode("utf-8", "surrogateescape")
        offset += n
        tag = buf[offset]
        if tag == 0x46 or tag == 0x41:  # 'F', 'A'
            table[key], offset = _decode_nested(buf, offset)
        else:
            table[key], offset = _decode_value(buf, offset)
    if offset != end:
        raise FieldError("table contents overrun its length")
    return table, end


def _decode_nested(buf: ReadableBuffer, offset: int) -> tuple[Any, int]:
    """The table ('F') or array ('A') whose tag is at ``offset``, and the offset after it.

    Decoded with an explicit stack, not recursion: any depth a frame can hold is
    accepted, as RabbitMQ accepts it (a 128 KiB frame holds 18,000 levels), at the
    cost of one stack entry per open container.
    """
    size = len(buf)
    stack: list[tuple[Any, int, bool]] = []
    root: Any = None
    cur: Any = None
    is_table = False
    end = offset
    key = ""
    tag = buf[offset]
    while True:
        if tag == 0x46 or tag == 0x41:  # open a container
            (n,) = _I.unpack_from(buf, offset + 1)
            offset += 5
            if offset + n > size:
                raise FieldError("table length overruns the frame" if tag == 0x46
                                 else "array length overruns the frame")
            value: Any = {} if tag == 0x46 else []
            if cur is None:
                root = value
            else:
                if is_table:
                    cur[key] = value
                else:
                    cur.append(value)
                stack.append((cur, end, is_table))
            cur, end, is_table = value, offset + n, tag == 0x46
        else:
            value, offset = _decode_value(buf, offset)
            if is_table:
                cur[key] = value
            else:
                cur.append(value)
        while offset >= end:  # close every container that ends here
            if offset != end:
                raise FieldError("table contents overrun its length" if is_table
                                 else "array contents overrun its length")
            if not stack:
                return root, end
            cur, end, is_table = stack.pop()
        if is_table:
            n = buf[offset]
            offset += 1
            key = bytes(buf[offset:offset + n]).decode("utf-8", "surrogateescape")
            offset += n
        tag = buf[offset]


def _decode_value(buf: ReadableBuffer, offset: int) -> tuple[Any, int]:
    """A scalar value (its tag at ``offset``); tables and arrays are ``decode_table``'s."""
    tag = buf[offset]
    offset += 1
    if tag == 0x53:  # 'S'
        (n,) = _I.unpack_from(buf, offset)
        offset += 4
        if offset + n > len(buf):
            raise FieldError("long string overruns the frame")
        return bytes(buf[offset:offset + n]), offset + n
    if tag == 0x49:  # 'I'
        return _i.unpack_from(buf, offset)[0], offset + 4
    if tag == 0x74:  # 't'
        return bool(buf[offset]), offset + 1
    if tag == 0x6C:  # 'l'
        return Long(_q.unpack_from(buf, offset)[0]), offset + 8
    if tag == 0x54:  # 'T'
        return Timestamp(_Q.unpack_from(buf, offset)[0]), offset + 8
    if tag == 0x62:  # 'b'
        return _b.unpack_from(buf, offset)[0], offset + 1
    if tag == 0x42:  # 'B'
        return buf[offset], offset + 1
    if tag == 0x73:  # 's'
        return _h.unpack_from(buf, offset)[0], offset + 2
    if tag == 0x75:  # 'u'
        return _H.unpack_from(buf, offset)[0], offset + 2
    if tag == 0x69:  # 'i'
        return _I.unpack_from(buf, offset)[0], offset + 4
    if tag == 0x4C:  # 'L': signed 64, as RabbitMQ parses it
        return _q.unpack_from(buf, offset)[0], offset + 8
    if tag == 0x66:  # 'f'
        return _f.unpack_from(buf, offset)[0], offset + 4
    if tag == 0x64:  # 'd'
        return _d.unpack_from(buf, offset)[0], offset + 8
    if tag == 0x44:  # 'D'
        scale = buf[offset]
        (raw,) = _I.unpack_from(buf, offset + 1)  # unsigned, as RabbitMQ parses it
        return decimal.Decimal(raw).scaleb(-scale), offset + 5
    if tag == 0x56:  # 'V'
        return None, offset
    if tag == 0x78:  # 'x'
        (n,) = _I.unpack_from(buf, offset)
        offset += 4
        if offset + n > len(buf):
            raise FieldError("byte array overruns the frame")
        return bytearray(buf[offset:offset + n]), offset + n
    raise FieldError(f"unknown field type tag {tag!r}")


def encode_table(table: FieldTable) -> bytes:
    """A table's wire form (4-byte length first): a flat loop (the hot path); a nested
    table or array is ``encode_value``'s, which hands it to ``_encode_nested``."""
    parts: list[bytes] = []
    for key, value in table.items():
        raw = key.encode("utf-8", "surrogateescape")
        if len(raw) > 255:
            raise FieldError(f"table key too long: {key[:20]}...")
        parts.append(_B.pack(len(raw)))
        parts.append(raw)
        parts.append(encode_value(value))
    body = b"".join(parts)
    return _I.pack(len(body)) + body


def _encode_nested(root: Any, tag: bytes) -> bytes:
    """``tag`` + length + contents of a table or array.

    Nested tables and arrays are written with an explicit stack, not recursion, into
    one buffer whose length fields are filled in as each container closes: any depth
    is encoded in linear time (a table that contains itself is refused).
    """
    is_table = isinstance(root, dict)
    out = bytearray(tag)
    start = len(out)  # where the open container's length goes
    out += b"\x00\x00\x00\x00"
    cur: Any = root
    items: Any = iter(root.items()) if is_table else iter(root)
    stack: list[tuple[Any, Any, int, bool]] = []
    open_ids = {id(root)}
    while True:
        for item in items:
            if is_table:
                key, value = item
                raw = key.encode("utf-8", "surrogateescape")
                if len(raw) > 255:
                    raise FieldError(f"table key too long: {key[:20]}...")
                out.append(len(raw))
                out += raw
            else:
                value = item
            if type(value) is str:
                raw = value.encode("utf-8", "surrogateescape")
                out += b"S"
                out += _I.pack(len(raw))
                out += raw
            elif isinstance(value, (dict, list, tuple)):
                if id(value) in open_ids:
                    raise FieldError("cannot encode a field table that contains itself")
                open_ids.add(id(value))
                stack.append((cur, items, start, is_table))
                cur = value
                is_table = isinstance(value, dict)
                items = iter(cur.items()) if is_table else iter(cur)
                out += b"F" if is_table else b"A"
                start = len(out)
                out += b"\x00\x00\x00\x00"
                break
            else:
                out += encode_value(value)
        else:
            _I.pack_into(out, start, len(out) - start - 4)
            if not stack:
                return bytes(out)
            open_ids.discard(id(cur))
            cur, items, start, is_table = stack.pop()


def encode_value(value: object) -> bytes:
    if value is None:
        return b"V"
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, Timestamp):
        return b"T" + _Q.pack(value)
    if isinstance(value, Long):
        return b"l" + _q.pack(value)
    if isinstance(value, int):
        if -2**31 <= value < 2**31:
            return b"I" + _i.pack(value)
        return b"l" + _q.pack(value)
    if isinstance(value, str):
        raw = value.encode("utf-8", "surrogateescape")
        return b"S" + _I.pack(len(raw)) + raw
    if isinstance(value, bytes):
        return b"S" + _I.pack(len(value)) + value
    if isinstance(value, bytearray):
        return b"x" + _I.pack(len(value)) + bytes(value)
    if isinstance(value, dict):
        return _encode_nested(value, b"F")
    if isinstance(value, (list, tuple)):
        return _encode_nested(value, b"A")
    if isinstance(value, float):
        return b"d" + _d.pack(value)
    if isinstance(value, decimal.Decimal):
        sign, digits, exponent = value.as_tuple()
        if not isinstance(exponent, int):  # 'n'/'N'/'F': NaN, sNaN, Infinity
            raise FieldError(f"cannot encode non-finite decimal {value} in a field table")
        scale = max(0, -exponent)
        unscaled = int(value.scaleb(scale))
        if not 0 <= unscaled < 1 << 32 or scale > 255:  # RabbitMQ's mantissa is unsigned
            raise FieldError(f"cannot encode decimal {value} in a field table")
        return b"D" + _B.pack(scale) + _I.pack(unscaled)
    if isinstance(value, datetime.datetime):
        return b"T" + _Q.pack(int(value.timestamp()))
    raise FieldError(f"cannot encode {type(value).__name__} in a field table")


# Basic content properties, in flag order (bit 15 first).
PROPERTY_FIELDS: Final[tuple[tuple[str, str], ...]] = (
    ("content_type", "shortstr"),
    ("content_encoding", "shortstr"),
    ("headers", "table"),
    ("delivery_mode", "octet"),
    ("priority", "octet"),
    ("correlation_id", "shortstr"),
    ("reply_to", "shortstr"),
    ("expiration", "shortstr"),
    ("message_id", "shortstr"),
    ("timestamp", "timestamp"),
    ("type", "shortstr"),
    ("user_id", "shortstr"),
    ("app_id", "shortstr"),
    ("cluster_id", "shortstr"),
)
_FLAG_BITS: Final = tuple(1 << (15 - i) for i in range(len(PROPERTY_FIELDS)))
# property-flags value -> the (name, type) of the properties it announces: a publisher sends
# the same few combinations over and over, so the hot path walks only the present fields
_PLANS: dict[int, tuple[tuple[str, str], ...]] = {}


def _plan(flags: int) -> tuple[tuple[str, str], ...]:
    plan = tuple(field for field, bit in zip(PROPERTY_FIELDS, _FLAG_BITS)  # noqa: B905
                 if flags & bit)
    if len(_PLANS) < 4096:  # at most 2**14 combinations; bounded all the same
        _PLANS[flags] = plan
    return plan


def decode_properties(raw: ReadableBuffer) -> Properties:
    """Decode the property-flags + property-list part of a content header."""
    if len(raw) < 2:
        raise FieldError("content header has no property flags")
    (flags,) = _H.unpack_from(raw, 0)
    offset = 2
    props: Properties = {}
    try:
        while flags & 1:  # continuation flag words: none are defined, skip them
            (flags_more,) = _H.unpack_from(raw, offset)
            offset += 2
            if not flags_more & 1:
                break
        plan = _PLANS.get(flags)
        for name, ftype in plan if plan is not None else _plan(flags):
            if ftype == "shortstr":
                n = raw[offset]
                if offset + 1 + n > len(raw):
                    raise FieldError(f"property {name} overruns the header")
                props[name] = bytes(raw[offset + 1:offset + 1 + n]).decode("utf-8", "surrogateescape")
                offset += 1 + n
            elif ftype == "octet":
                props[name] = raw[offset]
                offset += 1
            elif ftype == "timestamp":
                props[name] = _Q.unpack_from(raw, offset)[0]
                offset += 8
            else:
                props[name], offset = decode_table(raw, offset)
    except (IndexError, struct.error) as exc:
        raise FieldError("truncated content header") from exc
    if offset != len(raw):
        raise FieldError("content header longer than its properties")
    return props


def encode_properties(props: Properties) -> bytes:
    flags = 0
    parts: list[bytes] = []
    for (name, ftype), bit in zip(PROPERTY_FIELDS, _FLAG_BITS):  # noqa: B905 - same length by construction
        value = props.get(name)
        if value is None:
            continue
        flags |= bit
        if ftype == "shortstr":
            raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
            parts.append(_B.pack(len(raw)) + raw)
        elif ftype == "octet":
            parts.append(_B.pack(value))
        elif ftype == "timestamp":
            parts.append(_Q.pack(value))
        else:
            parts.append(encode_table(value))
    return _H.pack(flags) + b"".join(parts)
