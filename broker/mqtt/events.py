"""The events ServerConnection.receive_data hands the broker, as plain data; no state."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .packets import Connect, Publish


@dataclass(slots=True)
class ConnectRequested:
    """A well-formed CONNECT: answer with ``accept`` or ``refuse``."""
    connect: Connect


@dataclass(slots=True)
class ReleaseReceived:
    """PUBREL of an inbound QoS 2 message: the broker forgets the packet id and answers
    ``pubcomp`` (always, even for an id it does not know: section 4.3.3)."""
    packet_id: int


@dataclass(slots=True)
class SubscribeRequested:
    """SUBSCRIBE (requested QoS 0, 1 or 2; in v5 the subscription options byte). Answer
    with ``suback``."""
    packet_id: int
    topics: list[tuple[str, int]]
    properties: dict[int, Any] | None = None


@dataclass(slots=True)
class UnsubscribeRequested:
    packet_id: int
    topics: list[str]


@dataclass(slots=True)
class DeliveryAcked:
    """The client's PUBACK for a QoS 1 ``publish``: ``token`` is what was passed there."""
    token: Any


@dataclass(slots=True)
class DeliveryReceived:
    """The client's PUBREC for a QoS 2 ``publish``: the packet id is in ``releasing`` until
    the PUBCOMP; the broker sends ``pubrels`` (once the PUBREL state is durable, for a
    persistent session)."""
    token: Any
    packet_id: int


@dataclass(slots=True)
class DeliveryCompleted:
    """The client's PUBCOMP: the QoS 2 delivery ``packet_id`` is over."""
    packet_id: int


@dataclass(slots=True)
class Disconnected:
    """DISCONNECT: a clean end; the will message is discarded (section 3.14.4), unless a v5
    client's reason code is 0x04 (Disconnect with Will Message). ``properties``: a v5
    DISCONNECT's (Session Expiry Interval may change there)."""
    reason_code: int = 0
    properties: dict[int, Any] | None = None


@dataclass(slots=True)
class ReauthRequested:
    """v5 AUTH 0x19 with the CONNECT's Authentication Method (section 4.12.1): answer
    with ``auth_success`` or close with 0x87."""
    data: bytes


@dataclass(slots=True)
class AuthContinued:
    """v5 AUTH 0x18 answering the server's challenge (``challenge``), while connecting or
    re-authenticating (section 4.12): answer with ``challenge`` again, or end the exchange
    (``accept``/``refuse`` while connecting, ``auth_success`` or a close otherwise)."""
    data: bytes


@dataclass(slots=True)
class ProtocolViolation:
    """The connection is closed for ``reason``; the will message is published."""
    reason: str


# PUBLISH from the client is handed out as its ``Publish`` packet itself (no wrapper: one
# object less per message). For QoS 1 the broker answers PUBACK once the message is routed,
# for QoS 2 PUBREC (``pubacks``).
Event = (ConnectRequested | Publish | ReleaseReceived | SubscribeRequested
         | UnsubscribeRequested | DeliveryAcked | DeliveryReceived | DeliveryCompleted
         | Disconnected | ReauthRequested | AuthContinued | ProtocolViolation)
