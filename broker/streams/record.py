"""Stream records: how an AMQP 0-9-1 message is stored in a stream, and back.

A record is an AMQP 1.0 message (what RabbitMQ stores and Stream-protocol clients read):

* a header section (durable, priority) when the message has them;
* message-annotations ``{x-exchange, x-routing-key, x-basic-properties}``: the
  exchange, the routing key and the 0-9-1 content header's property bytes as received
  (so a 0-9-1 consumer gets them back without re-encoding; ``x-basic-properties`` is
  this broker's own annotation);
* properties: message-id, user-id, reply-to, correlation-id, content-type,
  content-encoding, creation-time (the 0-9-1 timestamp, in ms);
* application-properties: the 0-9-1 headers whose values are strings, integers or
  booleans (so a Stream-protocol client sees them, and the filter value);
* a data section: the body.

``decode`` also reads records written by other clients (the Stream protocol): their
data / amqp-value sections become the body, application-properties the headers,
the properties section's common fields the 0-9-1 properties.
"""
from __future__ import annotations

import struct

from ..amqp.fields import decode_properties, encode_properties

_MA, _PROPS, _APP, _DATA, _VALUE = 0x72, 0x73, 0x74, 0x75, 0x77


def _sym(text: str) -> bytes:
    raw = text.encode()
    return (b"\xa3" + bytes((len(raw),)) if len(raw) < 256 else
            b"\xb3" + struct.pack(">I", len(raw))) + raw


def _str(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogateescape")
    return (b"\xa1" + bytes((len(raw),)) if len(raw) < 256 else
            b"\xb1" + struct.pack(">I", len(raw))) + raw


def _bin(raw: bytes) -> bytes:
    return (b"\xa0" + bytes((len(raw),)) if len(raw) < 256 else
            b"\xb0" + struct.pack(">I", len(raw))) + raw


def _value(value) -> bytes | None:
    if isinstance(value, bool):
        return b"\x41" if value else b"\x42"
    if isinstance(value, int):
        return b"\x81" + struct.pack(">q", value) if -(1 << 63) <= value < (1 << 63) else None
    if isinstance(value, str):
        return _str(value)
    if isinstance(value, (bytes, bytearray)):
        try:
            return _str(bytes(value).decode("utf-8"))
        except UnicodeDecodeError:
            return _bin(bytes(value))
    return None


def _map(items: list[bytes]) -> bytes:
    body = b"".join(items)
    return b"\xd1" + struct.pack(">II", len(body) + 4, len(items)) + body


def _list(items: list[bytes]) -> bytes:
    body = b"".join(items)
    return b"\xd0" + struct.pack(">II", len(body) + 4, len(items)) + body


def _text_or_null(value, symbol: bool = False) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    if not isinstance(value, str):
        return b"\x40"
    return _sym(value) if symbol else _str(value)


def _properties_section(props: dict) -> bytes | None:
    """The AMQP 1.0 properties of a 0-9-1 message, for Stream-protocol readers."""
    timestamp = props.get("timestamp")
    user_id = props.get("user_id")
    fields = [
        _text_or_null(props.get("message_id")),
        _bin(user_id.encode() if isinstance(user_id, str) else user_id)
        if isinstance(user_id, (str, bytes)) else b"\x40",
        b"\x40", b"\x40",  # to, subject
        _text_or_null(props.get("reply_to")),
        _text_or_null(props.get("correlation_id")),
        _text_or_null(props.get("content_type"), symbol=True),
        _text_or_null(props.get("content_encoding"), symbol=True),
        b"\x40",  # absolute-expiry-time
        b"\x83" + struct.pack(">q", int(timestamp) * 1000)
        if isinstance(timestamp, int) else b"\x40",
    ]
    while fields and fields[-1] == b"\x40":
        fields.pop()
    return b"\x00\x53\x73" + _list(fields) if fields else None


def encode(message) -> bytes:
    """The record of an AMQP 0-9-1 message."""
    props = message.properties
    parts: list[bytes] = []
    durable, priority = props.get("delivery_mode") == 2, props.get("priority")
    if durable or isinstance(priority, int):
        parts += (b"\x00\x53\x70", _list([b"\x41" if durable else b"\x42",
                                             b"\x50" + bytes((priority & 0xFF,))
                                             if isinstance(priority, int) else b"\x40"]))
    parts += (b"\x00\x53\x72", _map([_sym("x-exchange"), _str(message.exchange),
                                      _sym("x-routing-key"), _str(message.routing_key),
                                      _sym("x-basic-properties"), _bin(message.props_raw)]))
    section = _properties_section(props)
    if section is not None:
        parts.append(section)
    headers = message.properties.get("headers")
    if isinstance(headers, dict) and headers:
        items: list[bytes] = []
        for key, value in headers.items():
            enc = _value(value)
            if enc is not None:
                items += (_str(key), enc)
        if items:
            parts += (b"\x00\x53\x74", _map(items))
    parts += (b"\x00\x53\x75", _bin(message.body))
    return b"".join(parts)


# ---- decoding (a small AMQP 1.0 type reader) ----

class DecodeError(ValueError):
    pass


def _read(buf: bytes, pos: int):
    """One AMQP 1.0 value at ``pos``: (value, next position). Arrays and unknown
    described types come back as None (skipped)."""
    code = buf[pos]
    pos += 1
    if code == 0x00:  # described: descriptor, then the value
        _desc, pos = _read(buf, pos)
        return _read(buf, pos)
    if code in (0x40, 0x45):
        return (None if code == 0x40 else []), pos
    if code in (0x41, 0x42):
        return code == 0x41, pos
    if code in (0x43, 0x44):
        return 0, pos
    width = {0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}.get(code >> 4)
    if width is not None:
        raw = buf[pos:pos + width]
        if len(raw) != width:
            raise DecodeError("truncated value")
        pos += width
        if code in (0x50, 0x52, 0x53, 0x60, 0x70, 0x80):
            return int.from_bytes(raw, "big"), pos
        if code in (0x51, 0x54, 0x55, 0x61, 0x71, 0x81, 0x83):
            return int.from_bytes(raw, "big", signed=True), pos
        if code == 0x56:
            return raw[0] != 0, pos
        if code == 0x72:
            return struct.unpack(">f", raw)[0], pos
        if code == 0x82:
            return struct.unpack(">d", raw)[0], pos
        return raw, pos
    if code in (0xa0, 0xa1, 0xa3, 0xb0, 0xb1, 0xb3):
        if code >= 0xb0:
            (size,) = struct.unpack_from(">I", buf, pos)
            pos += 4
        else:
            size = buf[pos]
            pos += 1
        raw = buf[pos:pos + size]
        if len(raw) != size:
            raise DecodeError("truncated value")
        pos += size
        if code in (0xa0, 0xb0):
            return bytes(raw), pos
        return bytes(raw).decode("utf-8", "surrogateescape"), pos
    if code in (0xc0, 0xc1, 0xd0, 0xd1, 0xe0, 0xf0):
        if code in (0xc0, 0xc1, 0xe0):
            size, count = buf[pos], buf[pos + 1]
            start = pos + 2
            end = pos + 1 + size
        else:
            size, count = struct.unpack_from(">II", buf, pos)
            start = pos + 8
            end = pos + 4 + size
        if end > len(buf):
            raise DecodeError("truncated compound")
        if code in (0xe0, 0xf0):
            return None, end
        items = []
        p = start
        for _ in range(count):
            value, p = _read(buf, p)
            items.append(value)
        if code in (0xc1, 0xd1):
            try:
                return dict(zip(items[0::2], items[1::2], strict=False)), end
            except TypeError:  # a list or map as a key
                raise DecodeError("unhashable map key") from None
        return items, end
    raise DecodeError(f"unknown AMQP 1.0 type 0x{code:02x}")


def _skip(buf: bytes, pos: int) -> int:
    """The position after the AMQP 1.0 value at ``pos``, read from sizes alone."""
    code = buf[pos]
    pos += 1
    if code == 0x00:
        return _skip(buf, _skip(buf, pos))
    if 0x40 <= code <= 0x45:
        return pos
    width = {0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}.get(code >> 4)
    if width is not None:
        return pos + width
    high = code >> 4
    if high in (0xa, 0xc, 0xe):
        return pos + 1 + buf[pos]
    if high in (0xb, 0xd, 0xf):
        return pos + 4 + struct.unpack_from(">I", buf, pos)[0]
    raise DecodeError(f"unknown AMQP 1.0 type 0x{code:02x}")


def _read_map32(buf: bytes, pos: int) -> tuple[dict, int]:
    """A map32 of symbols to strings/binaries (message annotations as written here), read
    without the generic reader; other values fall back to it."""
    size, count = struct.unpack_from(">II", buf, pos + 1)
    end = pos + 5 + size
    if end > len(buf):
        raise DecodeError("truncated compound")
    p = pos + 9
    out = {}
    unpack = struct.unpack_from
    for _ in range(count // 2):
        items = []
        for _k in range(2):
            code = buf[p]
            if code in (0xa0, 0xa1, 0xa3):
                n = buf[p + 1]
                raw = buf[p + 2:p + 2 + n]
                p += 2 + n
            elif code in (0xb0, 0xb1, 0xb3):
                n = unpack(">I", buf, p + 1)[0]
                raw = buf[p + 5:p + 5 + n]
                p += 5 + n
            else:
                value, p = _read(buf, p)
                items.append(value)
                continue
            items.append(bytes(raw) if code & 0x0F == 0 else
                         bytes(raw).decode("utf-8", "surrogateescape"))
        try:
            out[items[0]] = items[1]
        except TypeError:
            raise DecodeError("unhashable map key") from None
    return out, end


def decode(record: bytes):
    """(exchange, routing key, property bytes, properties, body) of a record."""
    pos, end = 0, len(record)
    annotations: dict = {}
    app: dict = {}
    props: list = []
    body_parts: list[bytes] = []
    while pos < end:
        if record[pos] != 0x00:
            raise DecodeError("not a section")
        if record[pos + 1] == 0x53:  # smallulong descriptor: the usual form
            desc, pos = record[pos + 2], pos + 3
        else:
            desc, pos = _read(record, pos + 1)
        if desc == _MA and record[pos] == 0xd1:
            annotations, pos = _read_map32(record, pos)
            continue
        if desc == 0x70 or (desc in (_PROPS, _APP) and "x-basic-properties" in annotations):
            pos = _skip(record, pos)  # not needed: the 0-9-1 properties come as they were
            continue
        start = pos
        value, pos = _read(record, pos)
        if desc == _MA and isinstance(value, dict):
            annotations = value
        elif desc == _APP and isinstance(value, dict):
            app = value
        elif desc == _PROPS and isinstance(value, list):
            props = value
        elif desc == _DATA and isinstance(value, bytes):
            body_parts.append(value)
        elif desc == _VALUE:
            if isinstance(value, bytes):
                body_parts.append(value)
            elif isinstance(value, str):
                body_parts.append(value.encode())
            else:
                body_parts.append(bytes(record[start:pos]))
    body = b"".join(body_parts)
    exchange = annotations.get("x-exchange", "")
    routing_key = annotations.get("x-routing-key", "")
    raw = annotations.get("x-basic-properties")
    if isinstance(raw, bytes):
        properties = decode_properties(raw)
        return exchange, routing_key, raw, properties, body
    properties = {}
    names = ("message_id", None, None, None, "reply_to", "correlation_id", "content_type",
             "content_encoding", None, "timestamp")
    for name, value in zip(names, props, strict=False):
        if name is None or value is None:
            continue
        if name == "timestamp":
            properties[name] = value // 1000 if isinstance(value, int) else None
        elif isinstance(value, (str, bytes)):
            properties[name] = value if isinstance(value, str) else value.decode("latin-1")
    properties = {k: v for k, v in properties.items() if v is not None}
    headers = {str(k): v for k, v in app.items()
               if isinstance(v, (str, int, bool, bytes)) and not isinstance(k, (list, dict))}
    if headers:
        properties["headers"] = headers
    return exchange, routing_key, encode_properties(properties), properties, body


def filter_value(message) -> str | None:
    """The ``x-stream-filter-value`` header of a message (RabbitMQ 3.13), or None."""
    headers = message.properties.get("headers")
    if not isinstance(headers, dict):
        return None
    value = headers.get("x-stream-filter-value")
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value if isinstance(value, str) else None
