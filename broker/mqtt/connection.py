"""One MQTT 3.1/3.1.1 network connection as the server sees it, sans-IO.

``ServerConnection.receive_data(data)`` parses packets (``codec.PacketReader``), enforces
the order the spec requires (CONNECT first and once, nothing before CONNACK is decided),
answers what needs no broker (PINGREQ) and returns events for the rest; the broker answers
through ``accept`` / ``refuse`` / ``suback`` / ``unsuback`` / ``pubacks`` / ``pubcomp`` and
sends messages with ``publish``, which numbers QoS 1 and 2 deliveries and keeps them in
flight until the client's PUBACK (``DeliveryAcked``) or PUBREC (``DeliveryReceived``) comes
back. Bytes to write accumulate until ``data_to_send()``.

QoS 2 (section 4.3.3): inbound, a QoS 2 PUBLISH is handed out (as every PUBLISH, as its
``Publish`` packet) and the broker answers it with PUBREC (``pubacks`` with ``PUBREC_BIT``),
the client's PUBREL a ``ReleaseReceived`` answered with ``pubcomp``; whether a packet id
was already received is the broker's session state, not the connection's. Outbound, a
PUBREC of a QoS 2 delivery is answered by the broker with PUBREL (``pubrels``) and its
packet id stays in ``releasing`` until the PUBCOMP (``DeliveryCompleted``); ``releasing``
may be a persistent session's set, shared across its connections: ``resend_pubrel`` sends
PUBREL again for each on a reconnect.

After a protocol violation the connection is ``closed``: the edge drops the socket without
a reply (4.8), but an unsupported protocol level gets CONNACK 1 first (3.1.2.2).

MQTT 5.0 (``v5``, from the CONNECT's protocol level): answers carry reason codes and
properties; a violation is answered with a DISCONNECT with its reason code (a CONNACK when
the CONNECT was bad) before the close (4.13); ``close`` sends one with the server's
reason. Inbound topic aliases are resolved here (up to ``topic_alias_max``, stated in the
CONNACK), and the Receive Maximum stated there is enforced: more QoS 1/2 PUBLISHes without
PUBACK/PUBCOMP than that is 0x93. Outbound, a packet larger than the client's Maximum
Packet Size is not sent (3.1.2.25): ``publish`` returns -1 and the broker settles it as if
it had been. Sans-IO: no sockets, clocks or broker state here."""
from __future__ import annotations

import struct
from enum import Enum
from typing import Any

from . import codec
from . import properties as P
from .codec import (
    AUTH,
    PINGREQ,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBREC,
    PUBREL,
    UNSUBACK,
    Bare,
    Connect,
    Disconnect,
    MalformedPacket,
    PacketId,
    PacketReader,
    Publish,
    Subscribe,
    Unsubscribe,
    UnsupportedProtocol,
)
from .encoding import encode_publish, with_alias
from .events import (
    AuthContinued,
    ConnectRequested,
    DeliveryAcked,
    DeliveryCompleted,
    DeliveryReceived,
    Disconnected,
    Event,
    ProtocolViolation,
    ReauthRequested,
    ReleaseReceived,
    SubscribeRequested,
    UnsubscribeRequested,
)

_PUBACK = struct.Struct(">BBH")
_PUBREL = _PUBACK  # the same layout; PUBREL's first byte is 0x62 (reserved flags 0010)
_PINGRESP = codec.encode(Bare(PINGRESP))


class State(Enum):
    AWAIT_CONNECT = "await-connect"  # nothing received yet
    CONNECTING = "connecting"  # CONNECT received, the broker decides (accept / refuse)
    CONNECTED = "connected"
    CLOSED = "closed"  # refused, violated, or DISCONNECT: the edge closes the socket


# in the list ``pubacks`` takes, a packet id with this bit set gets PUBREC instead of PUBACK
PUBREC_BIT = 0x10000
# and (v5) one with this bit set is acknowledged with 0x10 No matching subscribers
NO_MATCH_BIT = 0x20000
# and (v5) one with this bit set with 0x99 Payload format invalid (the message was not taken)
FORMAT_INVALID_BIT = 0x40000
_PUBACK_CODE = struct.Struct(">BBHB")


class ServerConnection:
    """``max_packet`` bounds a packet's remaining length (a larger one is a violation)."""

    __slots__ = ("_aliases", "_aliases_out", "_challenged", "_held", "_inbound", "_next_id",
                 "_out", "alias_max_out", "auth_method", "close_reason", "inflight",
                 "keep_alive", "max_out", "pending_output", "protocol_level", "qos2_out",
                 "reader", "receive_max", "recv_cnt", "recv_oct", "releasing", "send_cnt",
                 "send_oct", "state", "topic_alias_max", "username", "v5")

    def __init__(self, max_packet: int = codec.MAX_REMAINING_LENGTH):
        self.reader = PacketReader(max_packet)
        self.state = State.AWAIT_CONNECT
        self.keep_alive = 0  # seconds, from CONNECT (0: none)
        self.protocol_level = 4
        self.username: str | None = None  # as authenticated (``accept``)
        self._out: list[bytes] = []
        self.pending_output = 0
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0  # per read/write
        # packet id -> token of a QoS 1 delivery without PUBACK or a QoS 2 one without PUBREC
        # (the shared empty ``_NO_INFLIGHT`` until the first QoS 1/2 delivery: idle
        # connections are many)
        self.inflight: dict[int, Any] = _NO_INFLIGHT
        # which of ``inflight`` are QoS 2; and the outbound QoS 2 packet ids PUBRECed, PUBREL
        # sent, no PUBCOMP yet (not reusable). Both start as the shared empty frozenset and
        # become sets when first used (thousands of idle connections never use them)
        self.qos2_out: set[int] | frozenset[int] = _EMPTY
        self.releasing: set[int] | frozenset[int] = _EMPTY
        self._next_id = 1
        self.close_reason: str | None = None
        # packets behind a CONNECT not yet decided (a list only while there are some)
        self._held: list[codec.Packet] | tuple[codec.Packet, ...] = ()
        # MQTT 5.0 (set from the CONNECT): what the CONNACK states and this side enforces
        self.v5 = False
        self.receive_max = 65535  # inbound QoS 1/2 PUBLISHes not yet PUBACKed/PUBCOMPed
        self.topic_alias_max = 0  # inbound topic aliases accepted (0: none)
        self.max_out = 0  # the client's Maximum Packet Size (0: no limit)
        self.alias_max_out = 0  # the client's Topic Alias Maximum (aliases this side sends)
        self._aliases_out: dict[bytes, int] | None = None  # encoded topic -> its alias
        self._aliases: dict[int, str] | None = None
        self._inbound: set[int] | None = None  # v5: the inbound packet ids in flight
        # v5: the Authentication Method the connection was accepted with (None: none)
        self.auth_method: str | None = None
        # an AUTH 0x18 of this side awaits the client's AUTH 0x18 (section 4.12)
        self._challenged = False

    # ---- input ----
    def receive_data(self, data: bytes) -> list[Event]:
        """Events for every complete packet in ``data``; nothing after the connection closed."""
        if self.state is State.CLOSED:
            return []
        self.recv_oct, self.recv_cnt = self.recv_oct + len(data), self.recv_cnt + 1
        try:
            packets = self.reader.feed(data)
        except UnsupportedProtocol as exc:
            if self.state is State.AWAIT_CONNECT:
                self._write(codec.encode(codec.ConnAck(codec.REFUSED_PROTOCOL_VERSION)))
            return [self._violation(str(exc))]
        except MalformedPacket as exc:
            # the packets before the bad one are not handed out: the connection is over
            if exc.connect_v5 and self.state is State.AWAIT_CONNECT:
                self._write(codec.encode(codec.ConnAck(exc.reason_code, False, {})))
            return [self._violation(str(exc), exc.reason_code)]
        if self._held:
            packets = list(self._held) + packets
            self._held = ()
        if self.state is State.CONNECTING and not self._challenged and packets:
            # the broker has not decided the CONNECT yet (its login waits for something):
            # what follows waits with it, until ``accept`` and ``receive_data(b"")``
            self._held = packets
            return []
        events: list[Event] = []
        append = events.append
        inflight = self.inflight
        connected = self.state is State.CONNECTED
        for i, packet in enumerate(packets):
            # the hot path, connected: PUBLISH in, PUBACK of a delivery (as ``_handle``;
            # neither changes the state)
            if connected:
                if isinstance(packet, Publish):
                    if self.v5:
                        ev5 = self._publish_v5(packet)
                        append(ev5)
                        if self.closed:
                            break
                        continue
                    append(packet)  # the event is the packet itself
                    continue
                if isinstance(packet, PacketId) and packet.type == PUBACK:
                    if self.qos2_out and packet.packet_id in self.qos2_out:
                        continue  # a PUBACK for a QoS 2 delivery settles nothing
                    token = inflight.pop(packet.packet_id, _MISSING)
                    if token is not _MISSING:
                        append(DeliveryAcked(token))
                    continue
            ev = self._handle(packet)
            if ev is not None:
                append(ev)
            if self.closed:
                break
            if self.state is State.CONNECTING:
                # what the client sent right behind its CONNECT waits for the broker's
                # decision: ``accept`` then ``receive_data(b"")`` hands it out
                self._held = packets[i + 1:]
                break
            connected = self.state is State.CONNECTED
        return events

    def _violation(self, reason: str, reason_code: int = P.PROTOCOL_ERROR) -> ProtocolViolation:
        if self.v5 and self.state is State.CONNECTED:
            self._write(self._disconnect(reason_code, reason))
        self.state = State.CLOSED
        self.close_reason = reason
        return ProtocolViolation(reason)

    def _auth(self, packet: Disconnect) -> ReauthRequested | AuthContinued | ProtocolViolation:
        if self.auth_method is None:  # no enhanced authentication was agreed (section 4.12)
            return self._violation("AUTH without an authentication method")
        props = packet.properties or {}
        if props.get(P.AUTHENTICATION_METHOD) != self.auth_method:  # section 4.12.1
            return self._violation("AUTH with another authentication method")
        code = packet.reason_code
        if self._challenged:
            if code != P.CONTINUE_AUTHENTICATION:
                return self._violation(f"AUTH with reason code {code:#04x} in answer to a "
                                       "challenge")
            self._challenged = False
            return AuthContinued(props.get(P.AUTHENTICATION_DATA, b""))
        if code != P.REAUTHENTICATE or self.state is not State.CONNECTED:
            return self._violation(f"AUTH with reason code {code:#04x} "
                                   "while no authentication is in progress")
        return ReauthRequested(props.get(P.AUTHENTICATION_DATA, b""))

    def _publish_v5(self, p: Publish) -> Publish | ProtocolViolation:
        """A v5 PUBLISH: its topic alias resolved, the Receive Maximum counted."""
        props = p.properties
        if props:
            if P.SUBSCRIPTION_IDENTIFIER in props:  # server to client only (section 3.3.4)
                return self._violation("PUBLISH from a client with a subscription identifier")
            response = props.get(P.RESPONSE_TOPIC)
            if response is not None and not codec.valid_topic_name(response):  # 3.3.2-14
                return self._violation(f"invalid response topic {response!r}")
            alias = props.get(P.TOPIC_ALIAS)
            if alias is not None:
                if alias > self.topic_alias_max:  # (0 is refused by the codec)
                    return self._violation(f"topic alias {alias} above the maximum "
                                           f"{self.topic_alias_max}", P.TOPIC_ALIAS_INVALID)
                aliases = self._aliases
                if aliases is None:
                    aliases = self._aliases = {}
                if p.topic:
                    aliases[alias] = p.topic
                else:
                    topic = aliases.get(alias)
                    if topic is None:  # section 3.3.2.3.4
                        return self._violation(f"unknown topic alias {alias}", P.PROTOCOL_ERROR)
                    p.topic = topic
        if p.qos:
            inbound = self._inbound
            if inbound is None:
                inbound = self._inbound = set()
            if p.packet_id not in inbound:
                if len(inbound) >= self.receive_max:  # section 3.3.4
                    return self._violation("receive maximum exceeded",
                                           P.RECEIVE_MAXIMUM_EXCEEDED)
                inbound.add(p.packet_id or 0)
        return p

    def _handle(self, packet: codec.Packet) -> Event | None:
        state = self.state
        if state is State.AWAIT_CONNECT:
            if not isinstance(packet, Connect):  # section 3.1.0-1: CONNECT comes first
                return self._violation("first packet is not CONNECT")
            self.state = State.CONNECTING
            self.keep_alive = packet.keep_alive
            self.protocol_level = packet.protocol_level
            if packet.protocol_level == 5:
                self.v5 = True
                props = packet.properties or {}
                self.max_out = props.get(P.MAXIMUM_PACKET_SIZE, 0)
                self.alias_max_out = props.get(P.TOPIC_ALIAS_MAXIMUM, 0)
            return ConnectRequested(packet)
        if state is State.CONNECTING:
            # only the exchange of a challenge gets here: the client sends nothing but AUTH
            # or DISCONNECT before its CONNACK (section 3.1.2.11.9, MQTT-3.1.2-30)
            if isinstance(packet, Disconnect) and packet.type == AUTH:
                return self._auth(packet)
            if isinstance(packet, Disconnect) or (isinstance(packet, Bare)
                                                  and packet.type == codec.DISCONNECT):
                self.state = State.CLOSED
                self.close_reason = "client disconnected"
                return Disconnected()
            return self._violation(f"{type(packet).__name__} before CONNACK during enhanced "
                                   "authentication")
        if isinstance(packet, Publish):
            if self.v5:
                return self._publish_v5(packet)
            return packet
        if isinstance(packet, Disconnect):  # v5 (3.1.1's is a Bare)
            if packet.type == AUTH:
                return self._auth(packet)
            self.state = State.CLOSED
            self.close_reason = "client disconnected"
            return Disconnected(packet.reason_code, packet.properties)
        if isinstance(packet, PacketId):
            pid = packet.packet_id
            ptype = packet.type
            if ptype == PUBACK:
                if pid in self.qos2_out:
                    return None  # a PUBACK for a QoS 2 delivery settles nothing
                token = self.inflight.pop(pid, _MISSING)
                if token is _MISSING:
                    return None  # an acknowledgement for something already settled
                return DeliveryAcked(token)
            if ptype == PUBREL:
                return ReleaseReceived(pid)
            if ptype == PUBREC:
                qos2_out = self.qos2_out
                if pid in qos2_out:
                    # a set (it holds pid)
                    qos2_out.discard(pid)  # type: ignore[union-attr]
                    token = self.inflight.pop(pid)
                    releasing = self.releasing
                    if releasing is _EMPTY:
                        releasing = self.releasing = set()
                    releasing.add(pid)  # type: ignore[union-attr]
                    return DeliveryReceived(token, pid)
                if pid in self.releasing:  # PUBREC again (our PUBREL crossed it): resend
                    self._write(_PUBREL.pack(0x62, 2, pid))
                return None  # for a QoS 1 delivery or an unknown id: nothing to settle
            if ptype == PUBCOMP:
                if pid in self.releasing:
                    self.releasing.discard(pid)  # type: ignore[union-attr]
                    return DeliveryCompleted(pid)
                return None
            return self._violation("UNSUBACK sent to the server")
        if isinstance(packet, Subscribe):
            return SubscribeRequested(packet.packet_id, packet.topics, packet.properties)
        if isinstance(packet, Unsubscribe):
            return UnsubscribeRequested(packet.packet_id, packet.topics)
        if isinstance(packet, Bare):
            if packet.type == PINGREQ:
                self._write(_PINGRESP)
                return None
            if packet.type == codec.DISCONNECT:
                self.state = State.CLOSED
                self.close_reason = "client disconnected"
                return Disconnected()
            return self._violation(f"server-bound packet type {packet.type}")
        if isinstance(packet, Connect):  # section 3.1.0-2: a second CONNECT is a violation
            return self._violation("second CONNECT")
        return self._violation(f"{type(packet).__name__} sent to the server")

    # ---- answers ----
    def accept(self, session_present: bool, username: str | None = None,
               properties: dict[int, Any] | None = None) -> None:
        """CONNACK 0; ``username``: who the broker authenticated (without a 'vhost:'
        prefix), kept as ``username``. ``properties``: a v5 CONNACK's (the server's
        capabilities); its Receive Maximum and Topic Alias Maximum are enforced."""
        if self.state is not State.CONNECTING:
            raise RuntimeError("accept without a pending CONNECT")
        self.state = State.CONNECTED
        self.username = username
        if self.v5:
            props = properties if properties is not None else {}
            self.receive_max = props.get(P.RECEIVE_MAXIMUM, 65535)
            self.topic_alias_max = props.get(P.TOPIC_ALIAS_MAXIMUM, 0)
            self._write(codec.encode(codec.ConnAck(codec.ACCEPTED, session_present, props)))
            return
        self._write(codec.encode(codec.ConnAck(codec.ACCEPTED, session_present)))

    def refuse(self, return_code: int, reason: str) -> None:
        """CONNACK with a refusal code (3.1.1's; a v5 client gets the matching reason code,
        or ``return_code`` itself when it is one: 0x80 and up), then the connection is
        closed (section 3.2.2.3)."""
        if self.state is not State.CONNECTING:
            raise RuntimeError("refuse without a pending CONNECT")
        if self.v5:
            code = codec.V5_REFUSALS.get(return_code, return_code)
            self._write(codec.encode(codec.ConnAck(code, False, _reason_string(reason))))
        else:
            self._write(codec.encode(codec.ConnAck(return_code)))
        self.state = State.CLOSED
        self.close_reason = reason

    def suback(self, packet_id: int, return_codes: list[int]) -> None:
        """SUBACK; v5 reason codes are the granted QoS or a failure code (0x80 and up), and
        3.1.1's one failure code is 0x80 (so a v5 code is sent to 3.1.1 as 0x80)."""
        if self.v5:
            self._write(codec.encode(codec.SubAck(packet_id, return_codes, {})))
        else:
            self._write(codec.encode(codec.SubAck(
                packet_id, [c if c < 0x80 else codec.SUBACK_FAILURE for c in return_codes])))

    def unsuback(self, packet_id: int, reason_codes: list[int] | None = None) -> None:
        """UNSUBACK; a v5 one carries a reason code per filter (0x00 Success, 0x11 No
        subscription existed)."""
        if self.v5:
            self._write(codec.encode(codec.UnsubAck(packet_id, reason_codes or [])))
        else:
            self._write(codec.encode(PacketId(UNSUBACK, packet_id)))

    def pubacks(self, packet_ids: list[int]) -> None:
        """PUBACK for each of ``packet_ids``, in that order; PUBREC for an id carrying
        ``PUBREC_BIT`` (the answer to a QoS 2 PUBLISH)."""
        if self.v5:
            self._pubacks_v5(packet_ids)
            return
        pack = _PUBACK.pack
        self._write(b"".join([pack(0x40, 2, pid) if pid < PUBREC_BIT
                              else pack(0x50, 2, pid ^ PUBREC_BIT) for pid in packet_ids]))

    def _pubacks_v5(self, packet_ids: list[int]) -> None:
        """As ``pubacks``, with 0x10 No matching subscribers for an id carrying
        ``NO_MATCH_BIT``; a QoS 1 PUBLISH leaves the Receive Maximum's count here."""
        out = []
        inbound = self._inbound
        for pid in packet_ids:
            first = 0x50 if pid & PUBREC_BIT else 0x40
            no_match = pid & NO_MATCH_BIT
            invalid = pid & FORMAT_INVALID_BIT
            pid &= 0xFFFF
            if invalid:
                out.append(_PUBACK_CODE.pack(first, 3, pid, P.PAYLOAD_FORMAT_INVALID))
            elif no_match:
                out.append(_PUBACK_CODE.pack(first, 3, pid, P.NO_MATCHING_SUBSCRIBERS))
            else:
                out.append(_PUBACK.pack(first, 2, pid))
            # a PUBREC with an error code ends the QoS 2 exchange too (section 4.9)
            if (first == 0x40 or invalid) and inbound:
                inbound.discard(pid)
        self._write(b"".join(out))

    def auth_success(self, data: bytes | None = None) -> None:
        """AUTH 0x00 Success, ending a re-authentication (section 4.12.1); ``data``: the
        method's last message, as Authentication Data."""
        props: dict[int, Any] = {P.AUTHENTICATION_METHOD: self.auth_method}
        if data is not None:
            props[P.AUTHENTICATION_DATA] = data
        self._write(codec.encode(Disconnect(P.SUCCESS, props, AUTH)))

    def challenge(self, data: bytes) -> None:
        """AUTH 0x18 Continue authentication with ``data`` (section 4.12), in the method of
        ``auth_method`` (set it first when connecting); the client's AUTH 0x18 comes back
        as ``AuthContinued``."""
        self._challenged = True
        self._write(codec.encode(Disconnect(P.CONTINUE_AUTHENTICATION,
                                            {P.AUTHENTICATION_METHOD: self.auth_method,
                                             P.AUTHENTICATION_DATA: data}, AUTH)))

    def pubcomp(self, packet_id: int) -> None:
        self._write(_PUBACK.pack(0x70, 2, packet_id))
        if self._inbound:  # and a QoS 2 one at its PUBCOMP
            self._inbound.discard(packet_id)

    def pubrels(self, packet_ids: list[int]) -> None:
        pack = _PUBREL.pack
        self._write(b"".join([pack(0x62, 2, pid) for pid in packet_ids]))

    def resend_pubrel(self) -> None:
        """PUBREL again for every id in ``releasing`` (a persistent session reconnected:
        section 4.4)."""
        pack = _PUBREL.pack
        self._write(b"".join([pack(0x62, 2, pid) for pid in sorted(self.releasing)]))

    def send_blocked(self, reason: str) -> bool:
        return False  # MQTT cannot say it (AMQP's connection.blocked): the server reads slowly

    def send_unblocked(self) -> bool:
        return False

    def close(self, reason: str, reason_code: int = P.UNSPECIFIED_ERROR) -> None:
        """The server ends the connection (keep-alive, takeover, shutdown, refused publish);
        a v5 client is told why first (DISCONNECT with ``reason_code``: section 3.14)."""
        if self.state is not State.CLOSED:
            if self.v5 and self.state is State.CONNECTED:
                self._write(self._disconnect(reason_code, reason))
            self.state = State.CLOSED
            self.close_reason = reason

    def _disconnect(self, reason_code: int, reason: str) -> bytes:
        """A DISCONNECT with a Reason String, unless that would pass the client's Maximum
        Packet Size (section 3.14.2.2.3)."""
        data = codec.encode(Disconnect(reason_code, _reason_string(reason)))
        if self.max_out and len(data) > self.max_out:
            data = codec.encode(Disconnect(reason_code))
        return data

    # ---- output ----
    def publish(self, topic_raw: bytes, payload: bytes, qos: int, token: Any = None,
                retain: bool = False, dup: bool = False, packet_id: int = 0,
                props: bytes = b"") -> int:
        """Queue a PUBLISH (``topic_raw`` from ``topic_field``). QoS 1 and 2 get a free
        packet identifier (``packet_id`` if given and free: the id a QoS 2 delivery had
        before a reconnect), returned, and stay in ``inflight`` with ``token`` until the
        PUBACK (QoS 1) or PUBREC (QoS 2). ``props``: a v5 PUBLISH's encoded properties
        (length first). -1: not sent, larger than the v5 client's Maximum Packet Size.
        To a v5 client that accepts topic aliases, the first PUBLISH of a topic assigns one
        (while any are left) and the next ones send the alias and an empty topic."""
        if self.v5:
            return self._publish_v5_out(topic_raw, payload, qos, token, retain, dup, packet_id,
                                        props)
        pid = 0
        if qos:
            pid = self._next_id
            inflight = self.inflight
            if (qos == 2 or packet_id or pid in inflight or inflight is _NO_INFLIGHT
                    or self.releasing):
                pid = self.publish_id(qos, token, packet_id)
            else:  # QoS 1, the next id free (so some id is): ``publish_id``'s usual answer
                self._next_id = pid % 65535 + 1
                inflight[pid] = token
        data = encode_publish(topic_raw, payload, qos, pid, retain, dup)
        self._out.append(data)
        self.pending_output += len(data)
        return pid

    def _publish_v5_out(self, topic_raw: bytes, payload: bytes, qos: int, token: Any,
                        retain: bool, dup: bool, packet_id: int, props: bytes) -> int:
        """``publish`` to a v5 client: properties, topic aliases, its Maximum Packet Size."""
        props = props or b"\x00"
        new_alias = 0
        if self.alias_max_out and len(topic_raw) > 4:  # shorter: an alias saves nothing
            aliases = self._aliases_out
            if aliases is None:
                aliases = self._aliases_out = {}
            alias = aliases.get(topic_raw)
            if alias is not None:
                props = with_alias(props, alias)
                topic_raw = b"\x00\x00"
            elif len(aliases) < self.alias_max_out:
                new_alias = len(aliases) + 1
                props = with_alias(props, new_alias)
        if self.max_out:
            n = len(topic_raw) + len(props) + len(payload) + (2 if qos else 0)
            if n + len(codec.encode_length(n)) + 1 > self.max_out:
                return -1  # section 3.1.2.25: discarded, as if sent
        if new_alias:
            self._aliases_out[topic_raw] = new_alias  # type: ignore[index]
        pid = self.publish_id(qos, token, packet_id) if qos else 0
        data = encode_publish(topic_raw, props + payload, qos, pid, retain, dup)
        self._out.append(data)
        self.pending_output += len(data)
        return pid

    def publish_id(self, qos: int, token: Any, packet_id: int) -> int:
        """A free packet id for a QoS 1/2 delivery (``packet_id`` if free), now in flight."""
        inflight = self.inflight
        releasing = self.releasing
        if len(inflight) + len(releasing) >= 65535:
            raise RuntimeError("no free packet identifier")
        if packet_id and packet_id not in inflight and packet_id not in releasing:
            pid = packet_id
        else:
            pid = self._next_id
            while pid in inflight or (releasing and pid in releasing):
                pid = pid % 65535 + 1
            self._next_id = pid % 65535 + 1
        if inflight is _NO_INFLIGHT:
            inflight = self.inflight = {}
        inflight[pid] = token
        if qos == 2:
            if self.qos2_out is _EMPTY:
                self.qos2_out = set()
            self.qos2_out.add(pid)  # type: ignore[union-attr]
        return pid

    def take_inflight(self) -> list[Any]:
        """The tokens of every QoS 1 delivery without PUBACK and QoS 2 delivery without
        PUBREC, in sending order (the connection is going: the broker returns them to their
        queues). ``releasing`` stays: it belongs to the session."""
        tokens = list(self.inflight.values())
        self.inflight.clear()
        self.qos2_out = _EMPTY
        return tokens

    def _write(self, data: bytes) -> None:
        self._out.append(data)
        self.pending_output += len(data)

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    @property
    def has_output(self) -> bool:
        return bool(self._out)

    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out.clear()
        self.pending_output = 0
        self.send_oct, self.send_cnt = self.send_oct + len(data), self.send_cnt + 1
        return data


_MISSING = object()
_NO_INFLIGHT: dict[int, Any] = {}  # never written: ``publish`` replaces it first
_EMPTY: frozenset[int] = frozenset()


def _reason_string(reason: str) -> dict[int, Any]:
    """A Reason String property (bounded: it is for diagnostics, section 3.14.2.2.3)."""
    return {P.REASON_STRING: reason[:200]}
