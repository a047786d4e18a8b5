"""MQTT packet types, codes and the codec's errors as plain data; no encoding or decoding."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import properties as _p
from .properties import MALFORMED_PACKET, PROTOCOL_ERROR

# control packet types (MQTT 3.1.1 table 2.1)
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 10, 11, 12, 13, 14
AUTH = 15  # MQTT 5.0 only

# CONNACK return codes (table 3.1)
ACCEPTED = 0
REFUSED_PROTOCOL_VERSION = 1
REFUSED_IDENTIFIER = 2
REFUSED_SERVER_UNAVAILABLE = 3
REFUSED_BAD_CREDENTIALS = 4
REFUSED_NOT_AUTHORIZED = 5
SUBACK_FAILURE = 0x80
# 3.1.1 CONNACK return codes -> the v5 reason codes meaning the same (section 3.2.2.2)
V5_REFUSALS = {REFUSED_PROTOCOL_VERSION: _p.UNSUPPORTED_PROTOCOL_VERSION,
                REFUSED_IDENTIFIER: _p.CLIENT_IDENTIFIER_NOT_VALID,
                REFUSED_SERVER_UNAVAILABLE: _p.SERVER_UNAVAILABLE,
                REFUSED_BAD_CREDENTIALS: _p.BAD_USER_NAME_OR_PASSWORD,
                REFUSED_NOT_AUTHORIZED: _p.NOT_AUTHORIZED}

MAX_REMAINING_LENGTH = 268_435_455  # 4 bytes of variable length encoding
# What the server's reader allows the first packet (CONNECT, before any login), as
# RabbitMQ's mqtt.max_packet_size_unauthenticated: an anonymous peer cannot make the broker
# buffer more (``PacketReader.max_first``).
MAX_UNAUTHENTICATED = 65_536


class MalformedPacket(ValueError):
    """A protocol violation: the server closes the network connection (in MQTT 5 after a
    DISCONNECT, or a CONNACK if ``connect_v5``, with ``reason_code``)."""

    def __init__(self, text: str, reason_code: int = MALFORMED_PACKET,
                 connect_v5: bool = False):
        super().__init__(text)
        self.reason_code = reason_code
        self.connect_v5 = connect_v5


class UnsupportedProtocol(MalformedPacket):
    """CONNECT with a protocol name/level this server does not speak: answer CONNACK 1,
    then close."""


def _protocol_error(text: str) -> MalformedPacket:
    return MalformedPacket(text, PROTOCOL_ERROR)


@dataclass(slots=True)
class Will:
    topic: str
    message: bytes
    qos: int
    retain: bool
    properties: dict[int, Any] | None = None  # v5 will properties


@dataclass(slots=True)
class Connect:
    client_id: str
    clean_session: bool = True
    keep_alive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    protocol_level: int = 4  # 5: MQTT 5.0, 4: MQTT 3.1.1 ("MQTT"), 3: MQTT 3.1 ("MQIsdp")
    properties: dict[int, Any] | None = None  # v5 (clean_session is then Clean Start)


@dataclass(slots=True)
class ConnAck:
    return_code: int  # a v5 reason code in a v5 CONNACK
    session_present: bool = False
    properties: dict[int, Any] | None = None  # v5: encoded as a v5 CONNACK when not None


@dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: dict[int, Any] | None = None  # v5 (may hold a Topic Alias; topic may be '')


@dataclass(slots=True)
class PacketId:
    """PUBACK, PUBREC, PUBREL, PUBCOMP and (3.1.1) UNSUBACK: a type and a packet
    identifier; in v5 a reason code and properties (``v5``: encoded in v5's format)."""
    type: int
    packet_id: int
    reason_code: int = 0
    properties: dict[int, Any] | None = None
    v5: bool = False


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    # (filter, requested QoS); in v5 the whole subscription options byte (QoS in bits
    # 0-1, No Local 2, Retain As Published 3, Retain Handling 4-5)
    topics: list[tuple[str, int]] = field(default_factory=list)
    properties: dict[int, Any] | None = None  # v5


@dataclass(slots=True)
class SubAck:
    packet_id: int
    return_codes: list[int] = field(default_factory=list)  # v5: reason codes
    properties: dict[int, Any] | None = None  # v5: encoded as v5 when not None


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topics: list[str] = field(default_factory=list)
    properties: dict[int, Any] | None = None  # v5


@dataclass(slots=True)
class UnsubAck:
    """The v5 UNSUBACK: a reason code per filter."""
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: dict[int, Any] | None = None


@dataclass(slots=True)
class Disconnect:
    """The v5 DISCONNECT (either way) and AUTH (``type`` AUTH): a reason code and
    properties (3.1.1's DISCONNECT is a ``Bare``)."""
    reason_code: int = 0
    properties: dict[int, Any] | None = None
    type: int = DISCONNECT


@dataclass(slots=True)
class Bare:
    """PINGREQ, PINGRESP, DISCONNECT: a fixed header and nothing else."""
    type: int


Packet = (Connect | ConnAck | Publish | PacketId | Subscribe | SubAck | Unsubscribe | UnsubAck
          | Disconnect | Bare)
