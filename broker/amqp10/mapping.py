"""AMQP 1.0 addresses and messages as the broker's exchanges, queues and AMQP 0-9-1
properties (docs/amqp10.md).

Addresses: RabbitMQ 4's v2 scheme (``/exchanges/X/KEY``, ``/exchanges/X``, ``/queues/Q``,
percent-encoded) and the v1 forms ActiveMQ and RabbitMQ 3 clients use (``/exchange/X/KEY``,
``/topic/T``, ``/queue/Q``, ``/amq/queue/Q``, ``queue://Q``, ``topic://T`` and a plain
queue name). Messages: the bare message's sections to and from basic properties and
headers, so that a message keeps its fields whichever protocol publishes and consumes it.
"""
from __future__ import annotations

import datetime
import struct
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from proton import Data, Message, symbol, timestamp, ulong

from ..amqp.fields import Long, Timestamp


class AddressError(Exception):
    """An address the broker does not understand (amqp:invalid-field)."""


@dataclass(frozen=True)
class Target:
    """Where a publish goes: ``exchange`` with ``key`` (None: the message's subject);
    ``queue`` set when the address names a queue (``declare``: create it if missing)."""
    exchange: str
    key: str | None
    queue: str | None = None
    declare: bool = False


@dataclass(frozen=True)
class Source:
    """What a consumer reads: ``queue`` (``declare``: create it if missing), or a queue of
    its own bound to ``exchange`` with ``key``."""
    queue: str | None
    declare: bool = False
    exchange: str | None = None
    key: str = ""


def _v2_name(part: str) -> str:
    name = unquote(part, errors="strict")
    return name


def parse_target(address: str) -> Target:
    if address.startswith("/exchanges/"):
        rest = address[len("/exchanges/"):]
        exchange, slash, key = rest.partition("/")
        if not exchange or (slash and "/" in key):
            raise AddressError(f"bad address '{address}'")
        exchange = _v2_name(exchange)
        if exchange == "amq.default":
            exchange = ""
        return Target(exchange, _v2_name(key) if slash else None)
    if address.startswith("/queues/"):
        name = address[len("/queues/"):]
        if not name or "/" in name:
            raise AddressError(f"bad address '{address}'")
        q = _v2_name(name)
        return Target("", q, q)
    if address.startswith("/exchange/"):
        exchange, slash, key = address[len("/exchange/"):].partition("/")
        if not exchange:
            raise AddressError(f"bad address '{address}'")
        return Target(exchange, key if slash else None)
    if address.startswith("/topic/"):
        return Target("amq.topic", address[len("/topic/"):])
    if address.startswith("topic://"):
        return Target("amq.topic", address[len("topic://"):])
    for prefix, declare in (("/amq/queue/", False), ("/queue/", True), ("queue://", True)):
        if address.startswith(prefix):
            name = address[len(prefix):]
            if not name:
                raise AddressError(f"bad address '{address}'")
            return Target("", name, name, declare)
    if address.startswith("/"):
        raise AddressError(f"bad address '{address}'")
    return Target("", address, address, True)  # ActiveMQ: a plain queue name


def parse_source(address: str) -> Source:
    if address.startswith("/queues/"):
        name = address[len("/queues/"):]
        if not name or "/" in name:
            raise AddressError(f"bad address '{address}'")
        return Source(_v2_name(name))
    if address.startswith("/exchanges/"):
        # RabbitMQ 4 consumes from queues only
        raise AddressError(f"address '{address}': consume from a queue (/queues/:queue)")
    t = parse_target(address)
    if t.queue is not None:
        return Source(t.queue, t.declare)
    return Source(None, False, t.exchange, t.key or "#" if t.exchange == "amq.topic" else t.key or "")


def queue_address(name: str) -> str:
    return "/queues/" + quote(name, safe="")


# ---- messages ----

# 0-9-1 header <-> AMQP 1.0 properties field (ActiveMQ's JMS message groups)
_GROUP_ID = "JMSXGroupID"
_GROUP_SEQ = "JMSXGroupSeq"
_ID_TYPE = "x-message-id-type"
_CORR_TYPE = "x-correlation-id-type"
_BASIC_TYPE = "x-basic-type"
_BASIC_APP_ID = "x-basic-app-id"
# annotations the broker sets on delivery, never copied into headers
_ROUTING_ANNOTATIONS = frozenset({"x-exchange", "x-routing-key"})


def _id_to_091(value: Any) -> tuple[str | None, str | None]:
    """A message-id or correlation-id as a shortstr and its type tag (None for a string)."""
    if value is None:
        return None, None
    if isinstance(value, str):
        return value, None
    if isinstance(value, uuid.UUID):
        return str(value), "uuid"
    if isinstance(value, int):
        return str(int(value)), "ulong"
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8"), "binary"
        except UnicodeDecodeError:
            return None, None
    return None, None


def _id_from_091(value: str, kind: str | None) -> Any:
    try:
        if kind == "uuid":
            return uuid.UUID(value)
        if kind == "ulong":
            return ulong(int(value))
        if kind == "binary":
            return value.encode("utf-8")
    except ValueError:
        pass
    return value


def _value_to_091(v: Any) -> Any:
    """An application property or annotation as a field-table value (None: none)."""
    if v is None or isinstance(v, (bool, str, float)):
        return v
    if isinstance(v, timestamp):
        return Timestamp(int(v) // 1000)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytearray(v)  # a byte array ('x'), not a long string
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            x = _value_to_091(x)
            if x is not None:
                out[str(k)] = x
        return out
    if isinstance(v, (list, tuple)):
        return [x for x in (_value_to_091(x) for x in v) if x is not None]
    return None


def _value_from_091(v: Any, simple: bool) -> Any:
    """A field-table value for AMQP 1.0 (``simple``: application properties hold no maps
    or lists); None when it has no such form."""
    if v is None or isinstance(v, (bool, float, str)):
        return v
    if isinstance(v, Timestamp):
        return timestamp(int(v) * 1000)
    if isinstance(v, Long):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, bytes):  # a long string: text when it is UTF-8 (RabbitMQ 4's rule)
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return v
    if isinstance(v, bytearray):
        return bytes(v)
    if isinstance(v, datetime.datetime):
        return timestamp(int(v.timestamp() * 1000))
    if simple:
        return None
    if isinstance(v, dict):
        return {str(k): x for k, x in ((k, _value_from_091(x, False)) for k, x in v.items())
                if x is not None}
    if isinstance(v, (list, tuple)):
        return [x for x in (_value_from_091(x, False) for x in v) if x is not None]
    try:
        return float(v)  # decimal
    except (TypeError, ValueError):
        return None


@dataclass
class Incoming:
    """A message received over AMQP 1.0, in the broker's terms."""
    properties: dict
    body: bytes
    to: str | None
    subject: str | None


def decode(data: bytes) -> Incoming:
    """The bare (or annotated) message ``data`` as basic properties and a body. Raises
    ``ValueError`` when it does not decode."""
    try:
        return _incoming(_decode_fast(data))
    except _Unencodable:
        pass  # (a type or section the direct decoder leaves to proton, or bad input)
    return decode_proton(data)


def decode_proton(data: bytes) -> Incoming:
    """``decode`` through proton's Message."""
    # proton's message decoder takes garbage for an empty message: its sections are
    # decoded one by one first (a DataException names what does not decode)
    d = Data()
    offset = 0
    try:
        while offset < len(data):
            n = d.decode(data[offset:] if offset else data)
            if n <= 0:
                raise ValueError("empty section")
            offset += n
        m = Message()
        m.decode(data)
    except Exception as exc:  # proton's MessageException / DataException
        raise ValueError(f"the message does not decode: {exc}") from None
    return _incoming(m)


def _incoming(m: Any) -> Incoming:
    """A decoded message (proton's ``Message`` or ``_Bare``) in the broker's terms."""
    props: dict[str, Any] = {}
    headers: dict[str, Any] = {}
    if m.durable:
        props["delivery_mode"] = 2
    if m.priority != 4:  # the header's default (proton cannot tell it from an absent one)
        props["priority"] = min(int(m.priority), 255)
    if m.ttl:
        props["expiration"] = str(round(m.ttl * 1000))
    mid, kind = _id_to_091(m.id)
    if mid is not None:
        props["message_id"] = mid
        if kind:
            headers[_ID_TYPE] = kind
    cid, kind = _id_to_091(m.correlation_id)
    if cid is not None:
        props["correlation_id"] = cid
        if kind:
            headers[_CORR_TYPE] = kind
    if m.user_id:
        props["user_id"] = bytes(m.user_id).decode("utf-8", "replace")
    if m.reply_to:
        r = m.reply_to
        props["reply_to"] = unquote(r[len("/queues/"):]) if r.startswith("/queues/") else r
    # (proton's Message renders an absent symbol as symbol('None'))
    if m.content_type and m.content_type != "None":
        props["content_type"] = str(m.content_type)
    if m.content_encoding and m.content_encoding != "None":
        props["content_encoding"] = str(m.content_encoding)
    if m.creation_time:
        props["timestamp"] = int(m.creation_time)
    if m.group_id:
        headers[_GROUP_ID] = m.group_id
        if m.group_sequence:
            seq = int(m.group_sequence)
            # a uint on the wire; JMS's int: 0xFFFFFFFF is -1, the end of the group
            headers[_GROUP_SEQ] = seq - (1 << 32) if seq >= 1 << 31 else seq
    annotations: dict = m.annotations or {}
    for k, v in annotations.items():
        k = str(k)
        if k == _BASIC_TYPE and isinstance(v, str):
            props["type"] = v
        elif k == _BASIC_APP_ID and isinstance(v, str):
            props["app_id"] = v
        elif k.startswith("x-") and k not in _ROUTING_ANNOTATIONS:
            x = _value_to_091(v)
            if x is not None:
                headers[k] = x
    if m.subject and "type" not in props:
        props["type"] = m.subject
    for k, v in (m.properties or {}).items():
        x = _value_to_091(v)
        if x is not None:
            headers[str(k)] = x
    if headers:
        props["headers"] = headers
    body = m.body
    if body is None:
        raw = b""
    elif isinstance(body, (bytes, bytearray, memoryview)):
        raw = bytes(body)
    elif isinstance(body, str):
        raw = body.encode("utf-8")
    else:  # a map, list or number in an amqp-value: its AMQP encoding
        d = Data()
        d.put_object(body)
        raw = bytes(d.encode())
    return Incoming(props, raw, m.address, m.subject)


# ---- a direct decoder for the usual messages (proton's Message costs ~45 us) ----

class _Bare:
    """The fields ``_incoming`` reads, as proton's ``Message`` names them."""
    durable = False
    priority = 4
    ttl = 0.0
    id: Any = None
    correlation_id: Any = None
    user_id = b""
    address: str | None = None
    subject: str | None = None
    reply_to: str | None = None
    content_type: str | None = None
    content_encoding: str | None = None
    creation_time = 0.0
    group_id: str | None = None
    group_sequence = 0
    annotations: dict | None = None
    properties: dict | None = None
    body: Any = None


_FIXED = {0x50: 1, 0x51: 1, 0x60: 2, 0x61: 2, 0x70: 4, 0x71: 4, 0x80: 8, 0x81: 8, 0x83: 8,
          0x52: 1, 0x53: 1, 0x54: 1, 0x55: 1, 0x72: 4, 0x82: 8, 0x98: 16}
_SIGNED = frozenset({0x51, 0x61, 0x71, 0x81, 0x54, 0x55, 0x83})


def _value(buf: bytes, pos: int) -> tuple[Any, int]:
    """One value at ``pos``: (value, position after it). Raises ``_Unencodable`` for a
    type left to proton (arrays, decimals, chars, described values) or a truncation."""
    try:
        code = buf[pos]
    except IndexError:
        raise _Unencodable from None
    pos += 1
    if code == 0x40:
        return None, pos
    if code == 0x41:
        return True, pos
    if code == 0x42:
        return False, pos
    if code in (0x43, 0x44):
        return 0, pos
    if code == 0x45:
        return [], pos
    size = _FIXED.get(code)
    if size is not None:
        end = pos + size
        if end > len(buf):
            raise _Unencodable
        raw = buf[pos:end]
        if code == 0x72:
            return struct.unpack(">f", raw)[0], end
        if code == 0x82:
            return struct.unpack(">d", raw)[0], end
        if code == 0x98:
            return uuid.UUID(bytes=bytes(raw)), end
        n = int.from_bytes(raw, "big", signed=code in _SIGNED)
        if code == 0x83:
            return timestamp(n), end
        if code in (0x80, 0x53):
            return ulong(n), end
        return n, end
    if code in (0xA0, 0xA1, 0xA3, 0xB0, 0xB1, 0xB3):
        if code < 0xB0:
            if pos >= len(buf):
                raise _Unencodable
            n = buf[pos]
            pos += 1
        else:
            if pos + 4 > len(buf):
                raise _Unencodable
            n = int.from_bytes(buf[pos:pos + 4], "big")
            pos += 4
        end = pos + n
        if end > len(buf):
            raise _Unencodable
        raw = bytes(buf[pos:end])
        if code in (0xA0, 0xB0):
            return raw, end
        try:
            text = raw.decode("utf-8" if code in (0xA1, 0xB1) else "ascii")
        except UnicodeDecodeError:
            raise _Unencodable from None
        return (text if code in (0xA1, 0xB1) else symbol(text)), end
    if code in (0xC0, 0xC1, 0xD0, 0xD1):
        if code < 0xD0:
            if pos + 2 > len(buf):
                raise _Unencodable
            size, count = buf[pos], buf[pos + 1]
            start = pos + 1
            pos += 2
        else:
            if pos + 8 > len(buf):
                raise _Unencodable
            size = int.from_bytes(buf[pos:pos + 4], "big")
            count = int.from_bytes(buf[pos + 4:pos + 8], "big")
            start = pos + 4
            pos += 8
        end = start + size
        if end > len(buf) or count > size:
            raise _Unencodable
        items = []
        for _ in range(count):
            v, pos = _value(buf, pos)
            items.append(v)
        if pos != end:
            raise _Unencodable
        if code in (0xC0, 0xD0):
            return items, end
        if count % 2:
            raise _Unencodable
        return dict(zip(items[::2], items[1::2], strict=True)), end
    raise _Unencodable


def _decode_fast(data: bytes) -> _Bare:
    m = _Bare()
    pos = 0
    n = len(data)
    body_seen = False
    while pos < n:
        if data[pos:pos + 2] != b"\x00\x53" or pos + 3 > n:
            raise _Unencodable
        section = data[pos + 2]
        value, pos = _value(data, pos + 3)
        if section == 0x70:  # header
            if not isinstance(value, list):
                raise _Unencodable
            f = [*value, None, None, None]
            m.durable = bool(f[0])
            if f[1] is not None:
                m.priority = f[1]
            if f[2]:
                m.ttl = f[2] / 1000
        elif section in (0x71, 0x78):  # delivery annotations, footer: not kept
            if not isinstance(value, dict):
                raise _Unencodable
        elif section == 0x72:
            if not isinstance(value, dict):
                raise _Unencodable
            m.annotations = value
        elif section == 0x73:  # properties
            if not isinstance(value, list):
                raise _Unencodable
            f = [*value] + [None] * (13 - len(value))
            m.id, m.correlation_id = f[0], f[5]
            m.user_id = f[1] or b""
            m.address, m.subject, m.reply_to = f[2], f[3], f[4]
            m.content_type, m.content_encoding = f[6], f[7]
            if f[9]:
                m.creation_time = int(f[9]) / 1000
            m.group_id = f[10]
            m.group_sequence = f[11] or 0
            for i in (2, 3, 4, 10):
                if f[i] is not None and not isinstance(f[i], str):
                    raise _Unencodable
        elif section == 0x74:
            if not isinstance(value, dict):
                raise _Unencodable
            m.properties = value
        elif section in (0x75, 0x77) and not body_seen:  # one data section, an amqp-value
            if section == 0x75 and not isinstance(value, bytes):
                raise _Unencodable
            if section == 0x77 and not isinstance(value, (bytes, str)):
                raise _Unencodable
            m.body = value
            body_seen = True
        else:  # more data sections, amqp-sequence, unknown: proton's
            raise _Unencodable
    return m


def encode(properties: dict, body: bytes, exchange: str, routing_key: str,
           redelivered: bool) -> bytes:
    """A message from the broker's terms as an AMQP 1.0 annotated message."""
    p = properties
    m = Message(inferred=True)  # bytes body -> a data section
    headers = p.get("headers") or {}
    m.durable = p.get("delivery_mode") == 2
    if p.get("priority") is not None:
        m.priority = p["priority"]
    expiration = p.get("expiration")
    if expiration:
        try:
            m.ttl = int(expiration) / 1000
        except ValueError:
            pass
    if redelivered:
        m.delivery_count = 1
        m.first_acquirer = False
    if p.get("message_id") is not None:
        m.id = _id_from_091(str(p["message_id"]), _text(headers.get(_ID_TYPE)))
    if p.get("correlation_id") is not None:
        m.correlation_id = _id_from_091(str(p["correlation_id"]), _text(headers.get(_CORR_TYPE)))
    if p.get("user_id"):
        m.user_id = str(p["user_id"]).encode("utf-8")
    reply_to = p.get("reply_to")
    if reply_to:
        m.reply_to = reply_to if reply_to.startswith("/") else queue_address(reply_to)
    if p.get("content_type"):
        m.content_type = symbol(p["content_type"])
    if p.get("content_encoding"):
        m.content_encoding = symbol(p["content_encoding"])
    if p.get("timestamp") is not None:
        m.creation_time = int(p["timestamp"])
    if p.get("type"):
        m.subject = p["type"]
    annotations: dict = {symbol("x-exchange"): exchange, symbol("x-routing-key"): routing_key}
    if p.get("app_id"):
        annotations[symbol(_BASIC_APP_ID)] = p["app_id"]
    app: dict[str, Any] = {}
    for k, v in headers.items():
        k = str(k)
        if k in (_ID_TYPE, _CORR_TYPE):
            continue
        if k == _GROUP_ID:
            group = _text(v)
            if group:
                m.group_id = group
            continue
        if k == _GROUP_SEQ and isinstance(v, int):
            m.group_sequence = v & 0xFFFFFFFF
            continue
        if k.startswith("x-"):
            x = _value_from_091(v, False)
            if x is not None:
                annotations[symbol(k)] = x
        else:
            x = _value_from_091(v, True)
            if x is not None:
                app[k] = x
    m.annotations = annotations
    if app:
        m.properties = app  # type: ignore[assignment]  # (proton's stub says None)
    m.body = bytes(body)
    return m.encode()


def redelivered(data: bytes) -> bytes:
    """An AMQP 1.0 message as it goes out again: its header's delivery-count counts the
    earlier delivery, first-acquirer is false (spec 3.2.1)."""
    m = Message()
    m.decode(data)
    m.delivery_count = int(m.delivery_count) + 1
    m.first_acquirer = False
    return m.encode()


def _text(v: Any) -> str | None:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    return v if isinstance(v, str) else None


# ---- a direct encoder for deliveries (proton's Message costs ~45 us a message) ----

class _Unencodable(Exception):
    pass


def _str_enc(tag8: int, tag32: int, raw: bytes) -> bytes:
    n = len(raw)
    if n < 256:
        return bytes((tag8, n)) + raw
    return bytes((tag32,)) + n.to_bytes(4, "big") + raw


def _utf8(s: str) -> bytes:
    return _str_enc(0xA1, 0xB1, s.encode("utf-8", "surrogatepass"))


def _sym(s: str) -> bytes:
    return _str_enc(0xA3, 0xB3, s.encode("ascii"))


def _bin(b: bytes) -> bytes:
    return _str_enc(0xA0, 0xB0, b)


def _val(v: Any) -> bytes:
    """One AMQP 1.0 value (the types the 0-9-1 mapping produces)."""
    if v is None:
        return b"\x40"
    if v is True:
        return b"\x41"
    if v is False:
        return b"\x42"
    if isinstance(v, timestamp):
        return b"\x83" + int(v).to_bytes(8, "big", signed=True)
    if isinstance(v, ulong):
        return b"\x80" + int(v).to_bytes(8, "big")
    if isinstance(v, symbol):
        return _sym(v)
    if isinstance(v, str):
        return _utf8(v)
    if isinstance(v, int):
        if -128 <= v < 128:
            return b"\x54" + v.to_bytes(1, "big", signed=True)  # smallint
        if -(1 << 31) <= v < 1 << 31:
            return b"\x71" + v.to_bytes(4, "big", signed=True)
        if -(1 << 63) <= v < 1 << 63:
            return b"\x81" + v.to_bytes(8, "big", signed=True)
        raise _Unencodable
    if isinstance(v, float):
        return b"\x82" + struct.pack(">d", v)
    if isinstance(v, bytes):
        return _bin(v)
    if isinstance(v, uuid.UUID):
        return b"\x98" + v.bytes
    raise _Unencodable


def _map(pairs: list[bytes]) -> bytes:
    body = b"".join(pairs)
    count = len(pairs)  # each item is key and value already: 2 entries
    return b"\xd1" + (len(body) + 4).to_bytes(4, "big") + (count * 2).to_bytes(4, "big") + body


def _list(fields: list[bytes | None]) -> bytes:
    while fields and fields[-1] is None:
        fields.pop()
    body = b"".join(b"\x40" if f is None else f for f in fields)
    return b"\xd0" + (len(body) + 4).to_bytes(4, "big") + len(fields).to_bytes(4, "big") + body


_X_EXCHANGE = _sym("x-exchange")
_X_ROUTING_KEY = _sym("x-routing-key")
_X_APP_ID = _sym(_BASIC_APP_ID)


def encode_fast(properties: dict, body: bytes, exchange: str, routing_key: str,
                redelivered: bool) -> bytes:
    """``encode`` without proton, for the values the 0-9-1 mapping produces; falls back to
    ``encode`` for anything else (maps or lists in headers, ids of other types)."""
    try:
        return _encode_fast(properties, body, exchange, routing_key, redelivered)
    except (_Unencodable, UnicodeEncodeError, OverflowError):
        return encode(properties, body, exchange, routing_key, redelivered)


def _encode_fast(p: dict, body: bytes, exchange: str, routing_key: str,
                 redelivered: bool) -> bytes:
    out = []
    headers = p.get("headers") or {}
    durable = p.get("delivery_mode") == 2
    priority = p.get("priority")
    ttl = None
    expiration = p.get("expiration")
    if expiration:
        try:
            ttl = b"\x70" + int(expiration).to_bytes(4, "big")
        except (ValueError, OverflowError):
            ttl = None
    if durable or priority is not None or ttl or redelivered:
        out.append(b"\x00\x53\x70" + _list([
            b"\x41" if durable else None,
            b"\x50" + bytes((priority,)) if priority is not None else None,
            ttl,
            b"\x42" if redelivered else None,  # first-acquirer false
            b"\x70\x00\x00\x00\x01" if redelivered else None]))  # delivery-count
    annotations = [_X_EXCHANGE + _utf8(exchange), _X_ROUTING_KEY + _utf8(routing_key)]
    if not p and not redelivered:  # (a message without properties: the common case)
        return b"".join((b"\x00\x53\x72", _map(annotations), b"\x00\x53\x75", _bin(body)))
    if p.get("app_id"):
        annotations.append(_X_APP_ID + _utf8(p["app_id"]))
    app = []
    group_id = group_seq = None
    for k, v in headers.items():
        k = str(k)
        if k in (_ID_TYPE, _CORR_TYPE):
            continue
        if k == _GROUP_ID:
            group_id = _text(v)
            continue
        if k == _GROUP_SEQ and isinstance(v, int):
            group_seq = v & 0xFFFFFFFF
            continue
        x = _value_from_091(v, not k.startswith("x-"))
        if x is None:
            continue
        if k.startswith("x-"):
            annotations.append(_sym(k) + _val(x))
        else:
            app.append(_utf8(k) + _val(x))
    fields: list[bytes | None] = [None] * 13
    mid = p.get("message_id")
    if mid is not None:
        fields[0] = _val(_id_from_091(str(mid), _text(headers.get(_ID_TYPE))))
    if p.get("user_id"):
        fields[1] = _bin(str(p["user_id"]).encode("utf-8"))
    if p.get("type"):
        fields[3] = _utf8(p["type"])
    reply_to = p.get("reply_to")
    if reply_to:
        fields[4] = _utf8(reply_to if reply_to.startswith("/") else queue_address(reply_to))
    cid = p.get("correlation_id")
    if cid is not None:
        fields[5] = _val(_id_from_091(str(cid), _text(headers.get(_CORR_TYPE))))
    if p.get("content_type"):
        fields[6] = _sym(p["content_type"])
    if p.get("content_encoding"):
        fields[7] = _sym(p["content_encoding"])
    if p.get("timestamp") is not None:
        fields[9] = b"\x83" + (int(p["timestamp"]) * 1000).to_bytes(8, "big", signed=True)
    if group_id:
        fields[10] = _utf8(group_id)
    if group_seq is not None:
        fields[11] = b"\x52" + bytes((group_seq,)) if group_seq < 256 else \
            b"\x70" + group_seq.to_bytes(4, "big")
    out.append(b"\x00\x53\x72" + _map(annotations))
    if any(f is not None for f in fields):
        out.append(b"\x00\x53\x73" + _list(fields))
    if app:
        out.append(b"\x00\x53\x74" + _map(app))
    out.append(b"\x00\x53\x75" + _bin(body))
    return b"".join(out)
