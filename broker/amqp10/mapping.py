"""AMQP 1.0 messages as the broker's AMQP 0-9-1 properties (docs/amqp10.md): the bare
message's sections to and from basic properties and headers, so that a message keeps its
fields whichever protocol publishes and consumes it; the usual messages decoded and
encoded without proton (``wire``: the type encoding). Not addresses (``addresses``).
"""
from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from proton import Data, Message, symbol, timestamp, ulong

from ..amqp.fields import Long, Timestamp
from .addresses import queue_address
from .wire import Unencodable, binary, decode_value, encode_list, encode_map, encode_value, sym, utf8

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
    except Unencodable:
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


def _decode_fast(data: bytes) -> _Bare:
    m = _Bare()
    pos = 0
    n = len(data)
    body_seen = False
    while pos < n:
        if data[pos:pos + 2] != b"\x00\x53" or pos + 3 > n:
            raise Unencodable
        section = data[pos + 2]
        value, pos = decode_value(data, pos + 3)
        if section == 0x70:  # header
            if not isinstance(value, list):
                raise Unencodable
            f = [*value, None, None, None]
            m.durable = bool(f[0])
            if f[1] is not None:
                m.priority = f[1]
            if f[2]:
                m.ttl = f[2] / 1000
        elif section in (0x71, 0x78):  # delivery annotations, footer: not kept
            if not isinstance(value, dict):
                raise Unencodable
        elif section == 0x72:
            if not isinstance(value, dict):
                raise Unencodable
            m.annotations = value
        elif section == 0x73:  # properties
            if not isinstance(value, list):
                raise Unencodable
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
                    raise Unencodable
        elif section == 0x74:
            if not isinstance(value, dict):
                raise Unencodable
            m.properties = value
        elif section in (0x75, 0x77) and not body_seen:  # one data section, an amqp-value
            if section == 0x75 and not isinstance(value, bytes):
                raise Unencodable
            if section == 0x77 and not isinstance(value, (bytes, str)):
                raise Unencodable
            m.body = value
            body_seen = True
        else:  # more data sections, amqp-sequence, unknown: proton's
            raise Unencodable
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

_X_EXCHANGE = sym("x-exchange")
_X_ROUTING_KEY = sym("x-routing-key")
_X_APP_ID = sym(_BASIC_APP_ID)


def encode_fast(properties: dict, body: bytes, exchange: str, routing_key: str,
                redelivered: bool) -> bytes:
    """``encode`` without proton, for the values the 0-9-1 mapping produces; falls back to
    ``encode`` for anything else (maps or lists in headers, ids of other types)."""
    try:
        return _encode_fast(properties, body, exchange, routing_key, redelivered)
    except (Unencodable, UnicodeEncodeError, OverflowError):
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
        out.append(b"\x00\x53\x70" + encode_list([
            b"\x41" if durable else None,
            b"\x50" + bytes((priority,)) if priority is not None else None,
            ttl,
            b"\x42" if redelivered else None,  # first-acquirer false
            b"\x70\x00\x00\x00\x01" if redelivered else None]))  # delivery-count
    annotations = [_X_EXCHANGE + utf8(exchange), _X_ROUTING_KEY + utf8(routing_key)]
    if not p and not redelivered:  # (a message without properties: the common case)
        return b"".join((b"\x00\x53\x72", encode_map(annotations), b"\x00\x53\x75", binary(body)))
    if p.get("app_id"):
        annotations.append(_X_APP_ID + utf8(p["app_id"]))
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
            annotations.append(sym(k) + encode_value(x))
        else:
            app.append(utf8(k) + encode_value(x))
    fields: list[bytes | None] = [None] * 13
    mid = p.get("message_id")
    if mid is not None:
        fields[0] = encode_value(_id_from_091(str(mid), _text(headers.get(_ID_TYPE))))
    if p.get("user_id"):
        fields[1] = binary(str(p["user_id"]).encode("utf-8"))
    if p.get("type"):
        fields[3] = utf8(p["type"])
    reply_to = p.get("reply_to")
    if reply_to:
        fields[4] = utf8(reply_to if reply_to.startswith("/") else queue_address(reply_to))
    cid = p.get("correlation_id")
    if cid is not None:
        fields[5] = encode_value(_id_from_091(str(cid), _text(headers.get(_CORR_TYPE))))
    if p.get("content_type"):
        fields[6] = sym(p["content_type"])
    if p.get("content_encoding"):
        fields[7] = sym(p["content_encoding"])
    if p.get("timestamp") is not None:
        fields[9] = b"\x83" + (int(p["timestamp"]) * 1000).to_bytes(8, "big", signed=True)
    if group_id:
        fields[10] = utf8(group_id)
    if group_seq is not None:
        fields[11] = b"\x52" + bytes((group_seq,)) if group_seq < 256 else \
            b"\x70" + group_seq.to_bytes(4, "big")
    out.append(b"\x00\x53\x72" + encode_map(annotations))
    if any(f is not None for f in fields):
        out.append(b"\x00\x53\x73" + encode_list(fields))
    if app:
        out.append(b"\x00\x53\x74" + encode_map(app))
    out.append(b"\x00\x53\x75" + binary(body))
    return b"".join(out)
