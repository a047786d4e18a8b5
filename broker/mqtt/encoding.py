"""MQTT packets to bytes (any packet; the deliveries' PUBLISH fast path); no decoding, no state."""
from __future__ import annotations

import struct

from . import properties as _props
from .packets import (
    CONNACK,
    CONNECT,
    PUBLISH,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    Bare,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PacketId,
    Publish,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
)

_H = struct.Struct(">H")
# the remaining length's encoding is the properties' variable byte integer (section 1.5.5)
encode_length = _props.varint


def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError("string longer than 65535 bytes")
    return _H.pack(len(raw)) + raw


def _binary(b: bytes) -> bytes:
    if len(b) > 0xFFFF:
        raise ValueError("binary field longer than 65535 bytes")
    return _H.pack(len(b)) + b


def encode(packet: Packet) -> bytes:
    """The bytes of ``packet``; raises ValueError for values the format cannot carry."""
    if isinstance(packet, Publish):
        props = b"" if packet.properties is None else _props.encode(packet.properties)
        return _encode_publish(packet, props)
    if isinstance(packet, ConnAck) and packet.properties is not None:
        return _frame(CONNACK, 0, bytes((1 if packet.session_present else 0, packet.return_code))
                      + _props.encode(packet.properties))
    if isinstance(packet, PacketId) and packet.v5:
        body = _H.pack(packet.packet_id)
        if packet.reason_code or packet.properties:
            body += bytes((packet.reason_code,))
            if packet.properties:
                body += _props.encode(packet.properties)
        return _frame(packet.type, 0x02 if packet.type == PUBREL else 0, body)
    if isinstance(packet, SubAck) and packet.properties is not None:
        return _frame(SUBACK, 0, _H.pack(packet.packet_id) + _props.encode(packet.properties)
                      + bytes(packet.return_codes))
    if isinstance(packet, UnsubAck):
        return _frame(UNSUBACK, 0, _H.pack(packet.packet_id) + _props.encode(packet.properties)
                      + bytes(packet.reason_codes))
    if isinstance(packet, Disconnect):
        body = b""
        if packet.reason_code or packet.properties:
            body = bytes((packet.reason_code,))
            if packet.properties:
                body += _props.encode(packet.properties)
        return _frame(packet.type, 0, body)
    if isinstance(packet, Subscribe) and packet.properties is not None:
        body = (_H.pack(packet.packet_id) + _props.encode(packet.properties)
                + b"".join(_string(t) + bytes((q,)) for t, q in packet.topics))
        return _frame(SUBSCRIBE, 0x02, body)
    if isinstance(packet, Unsubscribe) and packet.properties is not None:
        body = (_H.pack(packet.packet_id) + _props.encode(packet.properties)
                + b"".join(_string(t) for t in packet.topics))
        return _frame(UNSUBSCRIBE, 0x02, body)
    if isinstance(packet, ConnAck):
        return _frame(CONNACK, 0, bytes((1 if packet.session_present else 0, packet.return_code)))
    if isinstance(packet, PacketId):
        return _frame(packet.type, 0x02 if packet.type == PUBREL else 0, _H.pack(packet.packet_id))
    if isinstance(packet, SubAck):
        return _frame(SUBACK, 0, _H.pack(packet.packet_id) + bytes(packet.return_codes))
    if isinstance(packet, Bare):
        return _frame(packet.type, 0, b"")
    if isinstance(packet, Subscribe):
        body = _H.pack(packet.packet_id) + b"".join(_string(t) + bytes((q,))
                                                     for t, q in packet.topics)
        return _frame(SUBSCRIBE, 0x02, body)
    if isinstance(packet, Unsubscribe):
        body = _H.pack(packet.packet_id) + b"".join(_string(t) for t in packet.topics)
        return _frame(UNSUBSCRIBE, 0x02, body)
    return _encode_connect(packet)


def _encode_publish(p: Publish, props: bytes) -> bytes:
    """A PUBLISH; ``props``: a v5 one's encoded properties (empty for 3.1.1)."""
    if p.qos not in (0, 1, 2):
        raise ValueError("QoS must be 0, 1 or 2")
    flags = (0x08 if p.dup else 0) | (p.qos << 1) | (0x01 if p.retain else 0)
    body = _string(p.topic)
    if p.qos:
        if not p.packet_id:
            raise ValueError("QoS 1 and 2 publishes need a packet identifier")
        body += _H.pack(p.packet_id)
    return _frame(PUBLISH, flags, body + props + p.payload)


def _encode_connect(c: Connect) -> bytes:
    v5 = c.protocol_level == 5
    name = "MQIsdp" if c.protocol_level == 3 else "MQTT"
    flags = 0x02 if c.clean_session else 0
    payload = _string(c.client_id)
    if c.will is not None:
        flags |= 0x04 | (c.will.qos << 3) | (0x20 if c.will.retain else 0)
        if v5:
            payload += _props.encode(c.will.properties)
        payload += _string(c.will.topic) + _binary(c.will.message)
    if c.username is not None:
        flags |= 0x80
        payload += _string(c.username)
    if c.password is not None:
        flags |= 0x40
        payload += _binary(c.password)
    header = _string(name) + bytes((c.protocol_level, flags)) + _H.pack(c.keep_alive)
    if v5:
        header += _props.encode(c.properties)
    return _frame(CONNECT, 0, header + payload)


def _frame(ptype: int, flags: int, body: bytes) -> bytes:
    return bytes(((ptype << 4) | flags,)) + encode_length(len(body)) + body


# the fixed headers of PUBLISHes under 128 bytes, by flags (DUP, QoS, RETAIN) and length:
# made once, so a delivery's header is a lookup
_SHORT_HEADS = [[bytes((0x30 | flags, n)) for n in range(128)] for flags in range(16)]


def encode_publish(topic_raw: bytes, payload: bytes, qos: int, packet_id: int,
                   retain: bool = False, dup: bool = False) -> bytes:
    """A PUBLISH from a topic already encoded as a length-prefixed string (the hot path of
    deliveries: no dataclass; the payload is copied once, by the last concatenation)."""
    flags = (0x08 if dup else 0) | (qos << 1) | (0x01 if retain else 0)
    if qos:
        n = len(topic_raw) + len(payload) + 2
        head = (_SHORT_HEADS[flags][n] if n < 128
                else bytes((0x30 | flags,)) + encode_length(n))
        return head + topic_raw + _H.pack(packet_id) + payload
    n = len(topic_raw) + len(payload)
    head = _SHORT_HEADS[flags][n] if n < 128 else bytes((0x30 | flags,)) + encode_length(n)
    return head + topic_raw + payload


def topic_field(topic: str) -> bytes:
    """``topic`` as the length-prefixed UTF-8 string PUBLISH carries. An AMQP routing key
    may hold bytes that are not UTF-8 (kept as surrogates); an MQTT topic must be UTF-8,
    so each such byte becomes '?' rather than the delivery failing."""
    raw = topic.encode("utf-8", "replace")
    return _H.pack(len(raw)) + raw


def with_alias(props: bytes, alias: int) -> bytes:
    """Encoded properties (length first) with a Topic Alias added."""
    length, pos = _props.read_varint(props, 0, len(props))
    body = props[pos:pos + length] + bytes((_props.TOPIC_ALIAS,)) + _H.pack(alias)
    return _props.varint(len(body)) + body
