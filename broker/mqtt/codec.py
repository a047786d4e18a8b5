"""MQTT 3.1 / 3.1.1 / 5.0 packets, sans-IO: bytes in, packet objects out, and back.

``PacketReader.feed(data)`` returns every complete packet in the bytes given so far;
anything the spec calls a protocol violation raises ``MalformedPacket`` (the server then
closes the network connection without a reply, MQTT 3.1.1 section 4.8), except a CONNECT
with an unacceptable protocol level, which the connection answers with CONNACK return code
1 first (section 3.1.2.2) -- ``UnsupportedProtocol`` carries what it needs for that.
``encode(packet)`` builds the bytes of any packet. No sockets, clocks or broker state here.

MQTT 5.0 (protocol level 5): the reader learns the version from the CONNECT and decodes
what follows as v5 packets (properties, reason codes, AUTH); a v5 violation carries the
reason code the server answers with (``MalformedPacket.reason_code``: 0x81 Malformed Packet,
0x82 Protocol Error, 0x95 Packet too large), sent in a CONNACK when the CONNECT itself is
bad (``connect_v5``) and in a DISCONNECT after it (sections 4.13, 3.14). Packets carry
``properties`` (a dict, ``properties.py``) only in v5; 3.1.1's take the defaults.
"""
from __future__ import annotations

import struct
from typing import Any

from . import properties as _props
from .encoding import encode, encode_length
from .packets import (
    ACCEPTED,
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    MAX_REMAINING_LENGTH,
    MAX_UNAUTHENTICATED,
    PINGREQ,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    REFUSED_BAD_CREDENTIALS,
    REFUSED_IDENTIFIER,
    REFUSED_NOT_AUTHORIZED,
    REFUSED_PROTOCOL_VERSION,
    REFUSED_SERVER_UNAVAILABLE,
    SUBACK,
    SUBACK_FAILURE,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    V5_REFUSALS,
    Bare,
    ConnAck,
    Connect,
    Disconnect,
    MalformedPacket,
    Packet,
    PacketId,
    Publish,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    UnsupportedProtocol,
    Will,
    _protocol_error,
)
from .properties import PACKET_TOO_LARGE, PropertyError

# the packet types and the encoder are re-exported: ``codec.X`` is their users' one import
__all__ = [
    "ACCEPTED",
    "AUTH",
    "CONNACK",
    "CONNECT",
    "DISCONNECT",
    "MAX_REMAINING_LENGTH",
    "MAX_UNAUTHENTICATED",
    "PINGREQ",
    "PINGRESP",
    "PUBACK",
    "PUBCOMP",
    "PUBLISH",
    "PUBREC",
    "PUBREL",
    "REFUSED_BAD_CREDENTIALS",
    "REFUSED_IDENTIFIER",
    "REFUSED_NOT_AUTHORIZED",
    "REFUSED_PROTOCOL_VERSION",
    "REFUSED_SERVER_UNAVAILABLE",
    "SUBACK",
    "SUBACK_FAILURE",
    "SUBSCRIBE",
    "UNSUBACK",
    "UNSUBSCRIBE",
    "V5_REFUSALS",
    "Bare",
    "ConnAck",
    "Connect",
    "Disconnect",
    "MalformedPacket",
    "Packet",
    "PacketId",
    "Publish",
    "SubAck",
    "Subscribe",
    "UnsubAck",
    "Unsubscribe",
    "UnsupportedProtocol",
    "Will",
    "encode",
    "encode_length",
]

_H = struct.Struct(">H")


class _Body:
    """A cursor over one packet's variable header and payload."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes):
        self.buf = buf
        self.pos = 0

    @property
    def left(self) -> int:
        return len(self.buf) - self.pos

    def u8(self) -> int:
        if self.left < 1:
            raise MalformedPacket("packet ends early")
        self.pos += 1
        return self.buf[self.pos - 1]

    def u16(self) -> int:
        if self.left < 2:
            raise MalformedPacket("packet ends early")
        (v,) = _H.unpack_from(self.buf, self.pos)
        self.pos += 2
        return int(v)

    def binary(self) -> bytes:
        n = self.u16()
        if self.left < n:
            raise MalformedPacket("length-prefixed field overruns the packet")
        self.pos += n
        return self.buf[self.pos - n:self.pos]

    def string(self) -> str:
        raw = self.binary()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedPacket("string is not well-formed UTF-8") from None
        if "\x00" in text:  # section 1.5.3: U+0000 must not appear
            raise MalformedPacket("string contains U+0000")
        return text

    def rest(self) -> bytes:
        data = self.buf[self.pos:]
        self.pos = len(self.buf)
        return data

    def props(self, packet: str) -> dict[int, Any]:
        """v5 properties allowed in ``packet`` (a ``properties`` packet name)."""
        try:
            props, self.pos = _props.decode(self.buf, self.pos, len(self.buf), packet)
        except PropertyError as exc:
            raise MalformedPacket(str(exc), exc.reason_code) from None
        return props


def _packet_id(body: _Body) -> int:
    pid = body.u16()
    if pid == 0:
        raise MalformedPacket("packet identifier 0")
    return pid


def valid_topic_name(topic: str) -> bool:
    """A PUBLISH topic: at least one character, no wildcards (section 4.7)."""
    return bool(topic) and "+" not in topic and "#" not in topic


def valid_topic_filter(topic: str) -> bool:
    """A SUBSCRIBE filter: '#' only last and alone in its level, '+' alone in its level."""
    if not topic:
        return False
    levels = topic.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


# ---- decoding ---------------------------------------------------------------------------

def decode(first: int, body: bytes, version: int = 4) -> Packet:
    """One packet from its first byte and its remaining bytes (``version``: the protocol
    level the CONNECT chose; 5 decodes MQTT 5.0 packets)."""
    ptype, flags = first >> 4, first & 0x0F
    b = _Body(body)
    if ptype == PUBLISH:
        if version == 5:
            return _decode_publish_v5(flags, b)
        return _decode_publish(flags, b)
    expected_flags = 0x02 if ptype in (PUBREL, SUBSCRIBE, UNSUBSCRIBE) else 0
    if flags != expected_flags:  # section 2.2.2: reserved flags must be as the table says
        raise MalformedPacket(f"invalid fixed header flags {flags:#x} for packet type {ptype}")
    if ptype == CONNECT:
        return _decode_connect(b)
    if version == 5:
        packet5 = _decode_v5(ptype, b)
        if b.left:
            raise MalformedPacket(f"{b.left} unexpected bytes at the end of packet type {ptype}")
        return packet5
    if ptype in (PUBACK, PUBREC, PUBREL, PUBCOMP, UNSUBACK):
        packet: Packet = PacketId(ptype, _packet_id(b))
    elif ptype == SUBSCRIBE:
        packet = _decode_subscribe(b)
    elif ptype == UNSUBSCRIBE:
        pid = _packet_id(b)
        topics = []
        while b.left:
            topics.append(_topic_filter(b))
        if not topics:
            raise MalformedPacket("UNSUBSCRIBE without topic filters")
        packet = Unsubscribe(pid, topics)
    elif ptype in (PINGREQ, PINGRESP, DISCONNECT):
        packet = Bare(ptype)
    elif ptype == CONNACK:
        ack = b.u8()
        packet = ConnAck(b.u8(), bool(ack & 1))
    elif ptype == SUBACK:
        pid = _packet_id(b)
        packet = SubAck(pid, list(b.rest()))
    else:  # 0 and 15 are reserved
        raise MalformedPacket(f"reserved packet type {ptype}")
    if b.left:
        raise MalformedPacket(f"{b.left} unexpected bytes at the end of packet type {ptype}")
    return packet


def _decode_publish(flags: int, b: _Body) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    dup = bool(flags & 0x08)
    if dup and qos == 0:
        raise MalformedPacket("PUBLISH with DUP set at QoS 0")
    topic = b.string()
    if not valid_topic_name(topic):
        raise MalformedPacket(f"invalid topic name {topic!r} in PUBLISH")
    pid = _packet_id(b) if qos else None
    return Publish(topic, b.rest(), qos, bool(flags & 0x01), dup, pid)


def _decode_connect(b: _Body) -> Connect:
    name = b.string()
    level = b.u8()
    if name == "MQTT" and level == 5:
        try:
            return _decode_connect_v5(b)
        except MalformedPacket as exc:
            exc.connect_v5 = True  # answered with a CONNACK carrying the reason code
            raise
    if (name, level) not in (("MQTT", 4), ("MQIsdp", 3)):
        if name in ("MQTT", "MQIsdp"):
            raise UnsupportedProtocol(f"protocol level {level} of {name!r} is not supported")
        raise MalformedPacket(f"unknown protocol name {name!r}")
    flags = _connect_flags(b)
    if flags & 0x40 and not flags & 0x80 and level == 4:
        raise MalformedPacket("password flag without user name flag")
    keep_alive = b.u16()
    client_id = b.string()
    will, username, password = _connect_payload(b, flags, False)
    return Connect(client_id, bool(flags & 0x02), keep_alive, username, password, will, level)


def _connect_flags(b: _Body) -> int:
    """The CONNECT flags byte, checked (section 3.1.2.3)."""
    flags = b.u8()
    if flags & 0x01:
        raise MalformedPacket("CONNECT reserved flag set")
    will_qos = (flags >> 3) & 0x03
    if not flags & 0x04 and (will_qos or flags & 0x20):
        raise MalformedPacket("will QoS/retain set without the will flag")
    if will_qos == 3:
        raise MalformedPacket("will QoS 3")
    return flags


def _connect_payload(b: _Body, flags: int,
                     v5: bool) -> tuple[Will | None, str | None, bytes | None]:
    """The will, user name and password after the client id (a v5 will has properties)."""
    will = None
    if flags & 0x04:
        will_props = b.props(_props.WILL) if v5 else None
        topic = b.string()
        if not valid_topic_name(topic):
            raise MalformedPacket(f"invalid will topic {topic!r}")
        will = Will(topic, b.binary(), (flags >> 3) & 0x03, bool(flags & 0x20), will_props)
    username = b.string() if flags & 0x80 else None
    password = b.binary() if flags & 0x40 else None
    if b.left:
        raise MalformedPacket("unexpected bytes at the end of CONNECT")
    return will, username, password


# ---- MQTT 5.0 -------------------------------------------------------------------------

_PUBACK_CODES = frozenset((0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99))
_PUBREL_CODES = frozenset((0x00, 0x92))
_DISCONNECT_CODES = frozenset((0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D,
                               0x8E, 0x8F, 0x90, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99,
                               0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2))
_AUTH_CODES = frozenset((0x00, 0x18, 0x19))


def _decode_connect_v5(b: _Body) -> Connect:
    flags = _connect_flags(b)
    keep_alive = b.u16()
    props = b.props(_props.CONNECT)
    client_id = b.string()
    will, username, password = _connect_payload(b, flags, True)
    return Connect(client_id, bool(flags & 0x02), keep_alive, username, password, will, 5,
                   props)


def _decode_publish_v5(flags: int, b: _Body) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    dup = bool(flags & 0x08)
    if dup and qos == 0:
        raise MalformedPacket("PUBLISH with DUP set at QoS 0")
    topic = b.string()
    if "+" in topic or "#" in topic:
        raise MalformedPacket(f"invalid topic name {topic!r} in PUBLISH", _props.TOPIC_NAME_INVALID)
    pid = _packet_id(b) if qos else None
    props = b.props(_props.PUBLISH)
    if not topic and _props.TOPIC_ALIAS not in props:  # section 3.3.2.1
        raise _protocol_error("PUBLISH without a topic name or a topic alias")
    return Publish(topic, b.rest(), qos, bool(flags & 0x01), dup, pid, props)


def _reason(b: _Body, allowed: frozenset[int], name: str) -> int:
    code = b.u8()
    if code not in allowed:
        raise MalformedPacket(f"invalid reason code {code:#x} in {name}")
    return code


def _decode_v5(ptype: int, b: _Body) -> Packet:
    """Every v5 packet but CONNECT and PUBLISH (section 3)."""
    if ptype in (PUBACK, PUBREC, PUBREL, PUBCOMP):
        pid = _packet_id(b)
        code = 0
        props = None
        if b.left:  # section 3.4.2.1: no reason code means 0x00 Success
            code = _reason(b, _PUBACK_CODES if ptype in (PUBACK, PUBREC) else _PUBREL_CODES,
                           "acknowledgement")
            if b.left:
                props = b.props(_props.ACK)
        return PacketId(ptype, pid, code, props, True)
    if ptype == SUBSCRIBE:
        pid = _packet_id(b)
        props = b.props(_props.SUBSCRIBE)
        topics = []
        while b.left:
            t = _topic_filter(b)
            options = b.u8()
            if options & 0xC0:
                raise MalformedPacket(f"reserved subscription option bits set: {options:#x}")
            if options & 0x03 == 3:
                raise MalformedPacket("requested QoS 3")
            if (options >> 4) & 0x03 == 3:
                raise _protocol_error("retain handling 3")
            if options & 0x04 and t.startswith("$share/"):  # section 3.8.3.1
                raise _protocol_error("no local on a shared subscription")
            topics.append((t, options))
        if not topics:
            raise _protocol_error("SUBSCRIBE without topic filters")
        return Subscribe(pid, topics, props)
    if ptype == UNSUBSCRIBE:
        pid = _packet_id(b)
        props = b.props(_props.UNSUBSCRIBE)
        filters = []
        while b.left:
            filters.append(_topic_filter(b))
        if not filters:
            raise _protocol_error("UNSUBSCRIBE without topic filters")
        return Unsubscribe(pid, filters, props)
    if ptype in (PINGREQ, PINGRESP):
        return Bare(ptype)
    if ptype in (DISCONNECT, AUTH):
        code = 0
        props = None
        if b.left:
            code = _reason(b, _DISCONNECT_CODES if ptype == DISCONNECT else _AUTH_CODES,
                           "DISCONNECT" if ptype == DISCONNECT else "AUTH")
            if b.left:
                props = b.props(_props.DISCONNECT if ptype == DISCONNECT else _props.AUTH)
        return Disconnect(code, props, ptype)
    if ptype == CONNACK:
        ack = b.u8()
        code = b.u8()
        return ConnAck(code, bool(ack & 1), b.props(_props.CONNACK))
    if ptype == SUBACK:
        pid = _packet_id(b)
        props = b.props(_props.SUBACK)
        return SubAck(pid, list(b.rest()), props)
    if ptype == UNSUBACK:
        pid = _packet_id(b)
        props = b.props(_props.UNSUBACK)
        return UnsubAck(pid, list(b.rest()), props)
    raise MalformedPacket(f"reserved packet type {ptype}")


def _topic_filter(b: _Body) -> str:
    t = b.string()
    if not valid_topic_filter(t):
        raise MalformedPacket(f"invalid topic filter {t!r}")
    return t


def _decode_subscribe(b: _Body) -> Subscribe:
    pid = _packet_id(b)
    topics = []
    while b.left:
        t = _topic_filter(b)
        options = b.u8()
        if options & 0xFC or options & 0x03 == 3:
            raise MalformedPacket(f"invalid requested QoS byte {options:#x}")
        topics.append((t, options))
    if not topics:  # section 3.8.3: at least one topic filter
        raise MalformedPacket("SUBSCRIBE without topic filters")
    return Subscribe(pid, topics)


def _publish_at(first: int, buf: bytes | bytearray, start: int, end: int) -> Publish:
    """``_decode_publish`` without the copies: the same checks on ``buf[start:end]``."""
    qos = (first >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    dup = bool(first & 0x08)
    if dup and qos == 0:
        raise MalformedPacket("PUBLISH with DUP set at QoS 0")
    if end - start < 2:
        raise MalformedPacket("packet ends early")
    tlen = buf[start] << 8 | buf[start + 1]
    pos = start + 2 + tlen
    if pos > end:
        raise MalformedPacket("length-prefixed field overruns the packet")
    try:
        topic = buf[start + 2:pos].decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedPacket("string is not well-formed UTF-8") from None
    if "\x00" in topic:
        raise MalformedPacket("string contains U+0000")
    if not topic or "+" in topic or "#" in topic:  # valid_topic_name, inline
        raise MalformedPacket(f"invalid topic name {topic!r} in PUBLISH")
    pid = None
    if qos:
        if end - pos < 2:
            raise MalformedPacket("packet ends early")
        pid = buf[pos] << 8 | buf[pos + 1]
        if not pid:
            raise MalformedPacket("packet identifier 0")
        pos += 2
    return Publish(topic, bytes(buf[pos:end]), qos, bool(first & 0x01), dup, pid)


class PacketReader:
    """Splits a byte stream into packets. ``max_packet`` bounds the remaining length
    (a huge declared length is refused as soon as its length bytes arrive), and
    ``max_first`` that of the first packet (the CONNECT). The buffer only holds what
    arrived: a declared length allocates nothing."""

    def __init__(self, max_packet: int = MAX_REMAINING_LENGTH,
                 max_first: int = MAX_REMAINING_LENGTH):
        self.buf = bytearray()
        self.max_packet = max_packet
        self.max_first = max_first
        self.started = False  # the first packet was read
        self.version = 4  # the CONNECT's protocol level (5: MQTT 5.0 packets follow)

    def feed(self, data: bytes) -> list[Packet]:
        buf = self.buf
        if buf or type(data) is not bytes:
            buf += data
            src: bytes | bytearray = buf
        else:
            # the common read, starting on a packet boundary: its packets are sliced out of
            # ``data`` itself (one copy each, where a bytearray needs two), and only an
            # incomplete packet at its end goes to the buffer
            src = data
        packets: list[Packet] = []
        append = packets.append
        started = self.started
        max_packet = self.max_packet if started else min(self.max_packet, self.max_first)
        n = len(src)  # src only shrinks at the end
        pos = 0
        while n - pos >= 2:
            first = src[pos]
            length = src[pos + 1]
            i = pos + 2
            if length & 0x80:  # more length bytes (packets of 128 bytes and up)
                length &= 0x7F
                mult = 128
                while True:
                    if i >= n:
                        self._keep(src, pos)
                        return packets
                    byte = src[i]
                    length += (byte & 0x7F) * mult
                    i += 1
                    if not byte & 0x80:
                        break
                    mult *= 128
                    if mult > 128 ** 3:
                        raise MalformedPacket("remaining length longer than 4 bytes")
                if length > max_packet:
                    raise MalformedPacket(f"packet of {length} bytes exceeds the limit of "
                                          f"{max_packet}", PACKET_TOO_LARGE)
            elif length > max_packet:
                raise MalformedPacket(f"packet of {length} bytes exceeds the limit of "
                                      f"{max_packet}", PACKET_TOO_LARGE)
            if n - i < length:
                break
            # the two packets of the hot path are read in place, the rest through decode
            if first >> 4 == PUBLISH and self.version != 5:
                append(_publish_at(first, src, i, i + length))
            elif first == 0x40 and length == 2:
                pid = src[i] << 8 | src[i + 1]
                if not pid:
                    raise MalformedPacket("packet identifier 0")
                append(PacketId(PUBACK, pid))
            else:
                packet = decode(first, bytes(src[i:i + length]), self.version)
                append(packet)
                if not started and isinstance(packet, Connect):
                    self.version = packet.protocol_level
            pos = i + length
            if not started:
                started = self.started = True
                max_packet = self.max_packet
        self._keep(src, pos)
        return packets

    def _keep(self, src: bytes | bytearray, pos: int) -> None:
        """What ``feed`` has not read yet (from ``pos``) stays in the buffer."""
        if src is self.buf:
            del self.buf[:pos]
        elif pos < len(src):
            self.buf += src[pos:]
