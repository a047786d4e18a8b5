"""MQTT 5.0 properties and reason codes, sans-IO (sections 2.2.2 and 2.4).

A packet's properties are a dict from property id to value; the two ids that may appear
more than once (User Property, and Subscription Identifier in PUBLISH) map to lists.
``decode(buf, pos, packet)`` reads a property length and its properties and checks them
as the spec requires of the packet type: an id unknown or not allowed there, or a value
not of its type, is a Malformed Packet (0x81); a property given twice, or a value the
spec forbids (Receive Maximum 0, a byte flag other than 0/1, Topic Alias 0, ...), is a
Protocol Error (0x82). ``encode(props)`` gives the length-prefixed bytes.
"""
from __future__ import annotations

import struct
from typing import Any

# reason codes (section 2.4)
SUCCESS = 0x00
GRANTED_QOS_1 = 0x01
GRANTED_QOS_2 = 0x02
DISCONNECT_WITH_WILL = 0x04
NO_MATCHING_SUBSCRIBERS = 0x10
NO_SUBSCRIPTION_EXISTED = 0x11
CONTINUE_AUTHENTICATION = 0x18
REAUTHENTICATE = 0x19
UNSPECIFIED_ERROR = 0x80
MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
IMPLEMENTATION_SPECIFIC_ERROR = 0x83
UNSUPPORTED_PROTOCOL_VERSION = 0x84
CLIENT_IDENTIFIER_NOT_VALID = 0x85
BAD_USER_NAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
SERVER_BUSY = 0x89
BANNED = 0x8A
SERVER_SHUTTING_DOWN = 0x8B
BAD_AUTHENTICATION_METHOD = 0x8C
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
PACKET_IDENTIFIER_IN_USE = 0x91
PACKET_IDENTIFIER_NOT_FOUND = 0x92
RECEIVE_MAXIMUM_EXCEEDED = 0x93
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95
MESSAGE_RATE_TOO_HIGH = 0x96
QUOTA_EXCEEDED = 0x97
ADMINISTRATIVE_ACTION = 0x98
PAYLOAD_FORMAT_INVALID = 0x99
RETAIN_NOT_SUPPORTED = 0x9A
QOS_NOT_SUPPORTED = 0x9B
USE_ANOTHER_SERVER = 0x9C
SERVER_MOVED = 0x9D
SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
CONNECTION_RATE_EXCEEDED = 0x9F
MAXIMUM_CONNECT_TIME = 0xA0
SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2

# property ids (table 2.4)
PAYLOAD_FORMAT_INDICATOR = 0x01
MESSAGE_EXPIRY_INTERVAL = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_IDENTIFIER = 0x0B
SESSION_EXPIRY_INTERVAL = 0x11
ASSIGNED_CLIENT_IDENTIFIER = 0x12
SERVER_KEEP_ALIVE = 0x13
AUTHENTICATION_METHOD = 0x15
AUTHENTICATION_DATA = 0x16
REQUEST_PROBLEM_INFORMATION = 0x17
WILL_DELAY_INTERVAL = 0x18
REQUEST_RESPONSE_INFORMATION = 0x19
RESPONSE_INFORMATION = 0x1A
SERVER_REFERENCE = 0x1C
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
SHARED_SUBSCRIPTION_AVAILABLE = 0x2A

# the packets a property may appear in; "will" stands for the will properties of CONNECT
_P_CONNECT, _P_CONNACK, _P_PUBLISH, _P_WILL, _P_ACK = "connect", "connack", "publish", "will", "ack"
_P_SUBSCRIBE, _P_SUBACK, _P_UNSUBSCRIBE, _P_UNSUBACK = "subscribe", "suback", "unsubscribe", "unsuback"
_P_DISCONNECT, _P_AUTH = "disconnect", "auth"
_ALL = frozenset((_P_CONNECT, _P_CONNACK, _P_PUBLISH, _P_WILL, _P_ACK, _P_SUBSCRIBE, _P_SUBACK,
                  _P_UNSUBSCRIBE, _P_UNSUBACK, _P_DISCONNECT, _P_AUTH))

BYTE, TWO, FOUR, VARINT, UTF8, BINARY, PAIR = "byte", "two", "four", "varint", "utf8", "bin", "pair"

# id -> (type, packets it may appear in)
SPEC: dict[int, tuple[str, frozenset[str]]] = {
    PAYLOAD_FORMAT_INDICATOR: (BYTE, frozenset((_P_PUBLISH, _P_WILL))),
    MESSAGE_EXPIRY_INTERVAL: (FOUR, frozenset((_P_PUBLISH, _P_WILL))),
    CONTENT_TYPE: (UTF8, frozenset((_P_PUBLISH, _P_WILL))),
    RESPONSE_TOPIC: (UTF8, frozenset((_P_PUBLISH, _P_WILL))),
    CORRELATION_DATA: (BINARY, frozenset((_P_PUBLISH, _P_WILL))),
    SUBSCRIPTION_IDENTIFIER: (VARINT, frozenset((_P_PUBLISH, _P_SUBSCRIBE))),
    SESSION_EXPIRY_INTERVAL: (FOUR, frozenset((_P_CONNECT, _P_CONNACK, _P_DISCONNECT))),
    ASSIGNED_CLIENT_IDENTIFIER: (UTF8, frozenset((_P_CONNACK,))),
    SERVER_KEEP_ALIVE: (TWO, frozenset((_P_CONNACK,))),
    AUTHENTICATION_METHOD: (UTF8, frozenset((_P_CONNECT, _P_CONNACK, _P_AUTH))),
    AUTHENTICATION_DATA: (BINARY, frozenset((_P_CONNECT, _P_CONNACK, _P_AUTH))),
    REQUEST_PROBLEM_INFORMATION: (BYTE, frozenset((_P_CONNECT,))),
    WILL_DELAY_INTERVAL: (FOUR, frozenset((_P_WILL,))),
    REQUEST_RESPONSE_INFORMATION: (BYTE, frozenset((_P_CONNECT,))),
    RESPONSE_INFORMATION: (UTF8, frozenset((_P_CONNACK,))),
    SERVER_REFERENCE: (UTF8, frozenset((_P_CONNACK, _P_DISCONNECT))),
    REASON_STRING: (UTF8, frozenset((_P_CONNACK, _P_ACK, _P_SUBACK, _P_UNSUBACK, _P_DISCONNECT,
                                     _P_AUTH))),
    RECEIVE_MAXIMUM: (TWO, frozenset((_P_CONNECT, _P_CONNACK))),
    TOPIC_ALIAS_MAXIMUM: (TWO, frozenset((_P_CONNECT, _P_CONNACK))),
    TOPIC_ALIAS: (TWO, frozenset((_P_PUBLISH,))),
    MAXIMUM_QOS: (BYTE, frozenset((_P_CONNACK,))),
    RETAIN_AVAILABLE: (BYTE, frozenset((_P_CONNACK,))),
    USER_PROPERTY: (PAIR, _ALL),
    MAXIMUM_PACKET_SIZE: (FOUR, frozenset((_P_CONNECT, _P_CONNACK))),
    WILDCARD_SUBSCRIPTION_AVAILABLE: (BYTE, frozenset((_P_CONNACK,))),
    SUBSCRIPTION_IDENTIFIER_AVAILABLE: (BYTE, frozenset((_P_CONNACK,))),
    SHARED_SUBSCRIPTION_AVAILABLE: (BYTE, frozenset((_P_CONNACK,))),
}
CONNECT, CONNACK, PUBLISH, WILL, ACK = _P_CONNECT, _P_CONNACK, _P_PUBLISH, _P_WILL, _P_ACK
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK = _P_SUBSCRIBE, _P_SUBACK, _P_UNSUBSCRIBE, _P_UNSUBACK
DISCONNECT, AUTH = _P_DISCONNECT, _P_AUTH

# the byte properties whose value must be 0 or 1 (others: Maximum QoS 0/1)
_FLAGS = frozenset((PAYLOAD_FORMAT_INDICATOR, REQUEST_PROBLEM_INFORMATION,
                    REQUEST_RESPONSE_INFORMATION, RETAIN_AVAILABLE, MAXIMUM_QOS,
                    WILDCARD_SUBSCRIPTION_AVAILABLE, SUBSCRIPTION_IDENTIFIER_AVAILABLE,
                    SHARED_SUBSCRIPTION_AVAILABLE))
# properties whose value 0 is a Protocol Error
_NONZERO = frozenset((RECEIVE_MAXIMUM, MAXIMUM_PACKET_SIZE, TOPIC_ALIAS, SUBSCRIPTION_IDENTIFIER))
_H = struct.Struct(">H")
_I = struct.Struct(">I")
MAX_VARINT = 268_435_455

Properties = dict[int, Any]


class PropertyError(ValueError):
    """A bad property: ``reason_code`` is MALFORMED_PACKET or PROTOCOL_ERROR."""

    def __init__(self, text: str, reason_code: int = MALFORMED_PACKET):
        super().__init__(text)
        self.reason_code = reason_code


def read_varint(buf: bytes | bytearray, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of a Variable Byte Integer (at most four bytes)."""
    value = 0
    mult = 1
    for _ in range(4):
        if pos >= end:
            raise PropertyError("variable byte integer ends early")
        byte = buf[pos]
        pos += 1
        value += (byte & 0x7F) * mult
        if not byte & 0x80:
            return value, pos
        mult *= 128
    raise PropertyError("variable byte integer longer than 4 bytes")


def varint(n: int) -> bytes:
    if not 0 <= n <= MAX_VARINT:
        raise ValueError(f"variable byte integer {n} out of range")
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _utf8(raw: bytes) -> str:
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise PropertyError("property string is not well-formed UTF-8") from None
    if "\x00" in text:
        raise PropertyError("property string contains U+0000")
    return text


def decode(buf: bytes | bytearray, pos: int, end: int, packet: str) -> tuple[Properties, int]:
    """The properties at ``buf[pos:end]`` (their length first) of a ``packet`` (one of the
    names above), and the position after them."""
    length, pos = read_varint(buf, pos, end)
    stop = pos + length
    if stop > end:
        raise PropertyError("properties overrun the packet")
    props: Properties = {}
    while pos < stop:
        pid, pos = read_varint(buf, pos, stop)
        spec = SPEC.get(pid)
        if spec is None:
            raise PropertyError(f"unknown property id {pid:#x}")
        kind, allowed = spec
        if packet not in allowed:
            raise PropertyError(f"property {pid:#x} is not allowed in {packet.upper()}")
        value: Any
        if kind == BYTE:
            if pos >= stop:
                raise PropertyError("property ends early")
            value = buf[pos]
            pos += 1
        elif kind == TWO:
            if stop - pos < 2:
                raise PropertyError("property ends early")
            value = buf[pos] << 8 | buf[pos + 1]
            pos += 2
        elif kind == FOUR:
            if stop - pos < 4:
                raise PropertyError("property ends early")
            (value,) = _I.unpack_from(buf, pos)
            pos += 4
        elif kind == VARINT:
            value, pos = read_varint(buf, pos, stop)
        else:
            items = []
            for _ in range(2 if kind == PAIR else 1):
                if stop - pos < 2:
                    raise PropertyError("property ends early")
                n = buf[pos] << 8 | buf[pos + 1]
                pos += 2
                if stop - pos < n:
                    raise PropertyError("property overruns the properties")
                raw = bytes(buf[pos:pos + n])
                pos += n
                items.append(raw if kind == BINARY else _utf8(raw))
            value = tuple(items) if kind == PAIR else items[0]
        if pid == USER_PROPERTY or (pid == SUBSCRIPTION_IDENTIFIER and packet == PUBLISH):
            props.setdefault(pid, []).append(value)
            if pid == SUBSCRIPTION_IDENTIFIER and value == 0:
                raise PropertyError("subscription identifier 0", PROTOCOL_ERROR)
            continue
        if pid in props:
            raise PropertyError(f"property {pid:#x} given twice", PROTOCOL_ERROR)
        if pid in _FLAGS and value > 1:
            raise PropertyError(f"property {pid:#x} must be 0 or 1, not {value}", PROTOCOL_ERROR)
        if pid in _NONZERO and value == 0:
            raise PropertyError(f"property {pid:#x} must not be 0", PROTOCOL_ERROR)
        props[pid] = value
    return props, pos


def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError("string longer than 65535 bytes")
    return _H.pack(len(raw)) + raw


def _one(pid: int, kind: str, value: Any) -> bytes:
    head = varint(pid)
    if kind == BYTE:
        return head + bytes((value,))
    if kind == TWO:
        return head + _H.pack(value)
    if kind == FOUR:
        return head + _I.pack(value)
    if kind == VARINT:
        return head + varint(value)
    if kind == UTF8:
        return head + _string(value)
    if kind == BINARY:
        if len(value) > 0xFFFF:
            raise ValueError("binary property longer than 65535 bytes")
        return head + _H.pack(len(value)) + bytes(value)
    k, v = value
    return head + _string(k) + _string(v)


def encode(props: Properties | None) -> bytes:
    """The property length and properties (in id order; lists for the repeatable ids)."""
    if not props:
        return b"\x00"
    parts: list[bytes] = []
    for pid in sorted(props):
        kind = SPEC[pid][0]
        value = props[pid]
        if pid == USER_PROPERTY or (pid == SUBSCRIPTION_IDENTIFIER and isinstance(value, list)):
            parts.extend(_one(pid, kind, v) for v in value)
        else:
            parts.append(_one(pid, kind, value))
    body = b"".join(parts)
    return varint(len(body)) + body
