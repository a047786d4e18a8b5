"""MQTT 5.0 codec and connection, sans-IO: properties (every id with its type, duplicates,
unknown and misplaced ids), v5 packets both ways, and the reason code each malformed or
forbidden packet is answered with (CONNACK for a bad CONNECT, DISCONNECT after it)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.mqtt import codec as m
from broker.mqtt import encoding as E
from broker.mqtt import properties as P
from broker.mqtt.codec import MalformedPacket, PacketReader, encode
from broker.mqtt.connection import ServerConnection
from broker.mqtt.events import (
    ConnectRequested,
    Disconnected,
    ProtocolViolation,
)

CONNECT5 = encode(m.Connect("c5", True, 30, protocol_level=5, properties={}))


def read(data: bytes, version: int = 5) -> list:
    reader = PacketReader()
    reader.version = version
    reader.started = True
    return reader.feed(data)


def connected(caps=None) -> ServerConnection:
    conn = ServerConnection(max_packet=10_000)
    [ev] = conn.receive_data(CONNECT5)
    assert isinstance(ev, ConnectRequested) and conn.v5
    conn.accept(False, "guest", caps if caps is not None else {P.TOPIC_ALIAS_MAXIMUM: 4,
                                                                P.RECEIVE_MAXIMUM: 2})
    out(conn)
    return conn


def out(conn) -> list:
    return read(conn.data_to_send())


# ---- properties ----

def _value(kind):
    return {P.BYTE: st.integers(0, 1), P.TWO: st.integers(1, 0xFFFF),
            P.FOUR: st.integers(1, 0xFFFFFFFF), P.VARINT: st.integers(1, P.MAX_VARINT),
            P.UTF8: st.text(st.characters(blacklist_characters="\x00",
                                          blacklist_categories=("Cs",)), max_size=20),
            P.BINARY: st.binary(max_size=20),
            P.PAIR: st.tuples(st.text(max_size=5).filter(lambda t: "\x00" not in t),
                              st.text(max_size=5).filter(lambda t: "\x00" not in t))}[kind]


@st.composite
def property_sets(draw, packet):
    ids = [pid for pid, (_, allowed) in P.SPEC.items() if packet in allowed]
    chosen = draw(st.lists(st.sampled_from(ids), unique=True))
    props = {}
    for pid in chosen:
        kind = P.SPEC[pid][0]
        if pid == P.USER_PROPERTY or (pid == P.SUBSCRIPTION_IDENTIFIER and packet == P.PUBLISH):
            props[pid] = draw(st.lists(_value(kind), min_size=1, max_size=3))
        else:
            props[pid] = draw(_value(kind))
    return props


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted({p for _, a in P.SPEC.values() for p in a})), st.data())
def test_properties_round_trip(packet, data):
    props = data.draw(property_sets(packet))
    raw = P.encode(props)
    decoded, pos = P.decode(raw, 0, len(raw), packet)
    assert decoded == props and pos == len(raw)


def test_every_property_id_of_the_spec_is_known():
    assert sorted(P.SPEC) == [0x01, 0x02, 0x03, 0x08, 0x09, 0x0B, 0x11, 0x12, 0x13, 0x15, 0x16,
                              0x17, 0x18, 0x19, 0x1A, 0x1C, 0x1F, 0x21, 0x22, 0x23, 0x24, 0x25,
                              0x26, 0x27, 0x28, 0x29, 0x2A]


@pytest.mark.parametrize("raw, code", [
    (b"\x02\x04\x00", P.MALFORMED_PACKET),  # unknown id 0x04
    (b"\x02\x12\x00", P.MALFORMED_PACKET),  # Assigned Client Identifier: CONNACK only
    (b"\x06\x02\x00\x00\x00\x01\x02", P.MALFORMED_PACKET),  # expiry cut short
    (b"\x0a\x02\x00\x00\x00\x01\x02\x00\x00\x00\x02", P.PROTOCOL_ERROR),  # twice
    (b"\x02\x01\x02", P.PROTOCOL_ERROR),  # payload format indicator 2
    (b"\x03\x23\x00\x00", P.PROTOCOL_ERROR),  # topic alias 0
    (b"\x05\x03\x00\x02\xc3\x28", P.MALFORMED_PACKET),  # content type not UTF-8
    (b"\x09\x02\x00\x00\x00\x01", P.MALFORMED_PACKET),  # length past the packet
])
def test_bad_publish_properties(raw, code):
    with pytest.raises(P.PropertyError) as info:
        P.decode(raw, 0, len(raw), P.PUBLISH)
    assert info.value.reason_code == code


# ---- packets ----

V5_PACKETS = [
    m.Connect("dev", False, 10, "u", b"p", m.Will("w/t", b"bye", 1, True,
                                                 {P.WILL_DELAY_INTERVAL: 5,
                                                  P.USER_PROPERTY: [("a", "b")]}),
              5, {P.SESSION_EXPIRY_INTERVAL: 3600, P.RECEIVE_MAXIMUM: 10}),
    m.ConnAck(0x87, False, {P.REASON_STRING: "no"}),
    m.Publish("a/b", b"x", 1, False, False, 7, {P.CONTENT_TYPE: "text/plain",
                                                P.CORRELATION_DATA: b"\x00\xff"}),
    m.Publish("", b"y", 0, False, False, None, {P.TOPIC_ALIAS: 3}),
    m.PacketId(m.PUBACK, 9, 0x10, None, True),
    m.PacketId(m.PUBREL, 9, 0x92, {P.REASON_STRING: "gone"}, True),
    m.Subscribe(4, [("a/#", 0x21), ("b", 0x0e)], {P.SUBSCRIPTION_IDENTIFIER: 12}),
    m.SubAck(4, [1, 0x9E], {}),
    m.Unsubscribe(5, ["a/#"], {P.USER_PROPERTY: [("k", "v")]}),
    m.UnsubAck(5, [0, 0x11], {}),
    m.Disconnect(0x8E, {P.REASON_STRING: "taken over"}),
    m.Disconnect(0x18, {P.AUTHENTICATION_METHOD: "x"}, m.AUTH),
]


@pytest.mark.parametrize("packet", V5_PACKETS, ids=lambda p: type(p).__name__)
def test_v5_packets_round_trip(packet):
    data = encode(packet)
    reader = PacketReader()
    if not isinstance(packet, m.Connect):
        reader.version, reader.started = 5, True
    [got] = reader.feed(data)
    if isinstance(packet, m.PacketId) and packet.properties is None:
        assert (got.type, got.packet_id, got.reason_code) == (
            packet.type, packet.packet_id, packet.reason_code)
    else:
        assert got == packet


def test_reader_switches_to_v5_after_a_v5_connect():
    reader = PacketReader()
    pub = encode(m.Publish("t", b"body", 0, properties={P.USER_PROPERTY: [("a", "1")]}))
    [c, p] = reader.feed(CONNECT5 + pub)
    assert c.protocol_level == 5 and reader.version == 5
    assert p.payload == b"body" and p.properties == {P.USER_PROPERTY: [("a", "1")]}


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=80))
def test_v5_garbage_raises_only_malformed(data):
    try:
        read(data)
    except MalformedPacket as exc:
        assert exc.reason_code in (P.MALFORMED_PACKET, P.PROTOCOL_ERROR, P.TOPIC_NAME_INVALID,
                                   P.PACKET_TOO_LARGE)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_v5_connect_with_garbage_after_the_level(tail):
    data = b"\x00\x04MQTT\x05" + tail
    try:
        [c] = PacketReader().feed(bytes((0x10, len(data))) + data)
        assert c.protocol_level == 5
    except MalformedPacket as exc:
        assert exc.connect_v5


# ---- the connection's answers ----

def test_connack_states_the_capabilities_given():
    conn = ServerConnection()
    conn.receive_data(CONNECT5)
    caps = {P.RECEIVE_MAXIMUM: 5, P.SHARED_SUBSCRIPTION_AVAILABLE: 0}
    conn.accept(True, "guest", caps)
    assert out(conn) == [m.ConnAck(0, True, caps)]


def test_malformed_v5_connect_gets_connack_with_reason():
    bad = m.Connect("c", True, 30, protocol_level=5,
                    properties={P.RECEIVE_MAXIMUM: 1})
    data = bytearray(encode(bad))
    # Receive Maximum 0 is a protocol error (section 3.1.2.11.3)
    assert data[-5:-3] == b"\x00\x01"
    data[-5:-3] = b"\x00\x00"
    conn = ServerConnection()
    [ev] = conn.receive_data(bytes(data))
    assert isinstance(ev, ProtocolViolation) and conn.closed
    [ack] = read(conn.data_to_send())
    assert ack.return_code == P.PROTOCOL_ERROR


def test_malformed_packet_after_connect_gets_disconnect_0x81():
    conn = connected()
    # SUBSCRIBE with reserved option bits set
    [ev] = conn.receive_data(b"\x82\x07\x00\x01\x00\x00\x01a\xc0")
    assert isinstance(ev, ProtocolViolation)
    [d] = out(conn)
    assert isinstance(d, m.Disconnect) and d.reason_code == P.MALFORMED_PACKET


@pytest.mark.parametrize("packet, code", [
    (m.Publish("t", b"", 0, properties={P.TOPIC_ALIAS: 5}), P.TOPIC_ALIAS_INVALID),
    (m.Publish("", b"", 0, properties={P.TOPIC_ALIAS: 2}), P.PROTOCOL_ERROR),
    (m.Connect("again", protocol_level=5, properties={}), P.PROTOCOL_ERROR),
    (m.Disconnect(0, None, m.AUTH), P.PROTOCOL_ERROR),
])
def test_forbidden_packets_get_disconnect_with_reason(packet, code):
    conn = connected()
    events = conn.receive_data(encode(packet))
    assert isinstance(events[-1], ProtocolViolation)
    [d] = out(conn)
    assert d.reason_code == code and conn.closed


def test_topic_alias_zero_and_duplicate_property_are_protocol_errors():
    conn = connected()
    # PUBLISH "t" QoS 0, properties: topic alias 0
    conn.receive_data(b"\x30\x07\x00\x01t\x03\x23\x00\x00")
    assert out(conn)[0].reason_code == P.PROTOCOL_ERROR
    conn = connected()
    # two Content Types
    conn.receive_data(b"\x30\x0c\x00\x01t\x08\x03\x00\x01a\x03\x00\x01b")
    assert out(conn)[0].reason_code == P.PROTOCOL_ERROR


def test_topic_aliases_resolve():
    conn = connected()
    [a] = conn.receive_data(encode(m.Publish("x/y", b"1", 0, properties={P.TOPIC_ALIAS: 4})))
    [b] = conn.receive_data(encode(m.Publish("", b"2", 0, properties={P.TOPIC_ALIAS: 4})))
    assert isinstance(b, m.Publish) and (a.topic, b.topic) == ("x/y", "x/y")


def test_packet_too_large_gets_disconnect_0x95():
    conn = connected()
    [ev] = conn.receive_data(encode(m.Publish("t", b"x" * 20_000, 0, properties={})))
    assert isinstance(ev, ProtocolViolation)
    assert out(conn)[0].reason_code == P.PACKET_TOO_LARGE


def test_receive_maximum_exceeded_gets_disconnect_0x93():
    conn = connected()  # Receive Maximum 2
    evs = conn.receive_data(b"".join(encode(m.Publish("t", b"", 1, packet_id=i, properties={}))
                                     for i in (1, 2)))
    assert len(evs) == 2
    conn.pubacks([1])  # one acknowledged: room for one more
    assert isinstance(conn.receive_data(encode(m.Publish("t", b"", 2, packet_id=3,
                                                         properties={})))[0], m.Publish)
    out(conn)
    [ev] = conn.receive_data(encode(m.Publish("t", b"", 1, packet_id=4, properties={})))
    assert isinstance(ev, ProtocolViolation)
    assert out(conn)[0].reason_code == P.RECEIVE_MAXIMUM_EXCEEDED


def test_client_disconnect_reason_and_server_close_reason():
    conn = connected()
    [ev] = conn.receive_data(encode(m.Disconnect(P.DISCONNECT_WITH_WILL,
                                                 {P.SESSION_EXPIRY_INTERVAL: 0})))
    assert ev == Disconnected(P.DISCONNECT_WITH_WILL, {P.SESSION_EXPIRY_INTERVAL: 0})
    conn = connected()
    conn.close("keep-alive timeout", P.KEEP_ALIVE_TIMEOUT)
    [d] = out(conn)
    assert d.reason_code == P.KEEP_ALIVE_TIMEOUT and d.properties[P.REASON_STRING]


def test_outbound_packet_over_the_clients_maximum_is_dropped():
    conn = ServerConnection()
    conn.receive_data(encode(m.Connect("c", protocol_level=5,
                                       properties={P.MAXIMUM_PACKET_SIZE: 64})))
    conn.accept(False, "guest", {})
    out(conn)
    topic = b"\x00\x01t"
    assert conn.publish(topic, b"x" * 100, 1, "token") == -1 and not conn.inflight
    assert conn.publish(topic, b"x" * 10, 1, "token") == 1
    [p] = out(conn)
    assert p.payload == b"x" * 10 and p.properties == {}


def test_v5_refusal_codes():
    conn = ServerConnection()
    conn.receive_data(CONNECT5)
    conn.refuse(m.REFUSED_BAD_CREDENTIALS, "login refused")
    [ack] = out(conn)
    assert ack.return_code == P.BAD_USER_NAME_OR_PASSWORD


def test_v311_answers_are_unchanged():
    conn = ServerConnection()
    conn.receive_data(encode(m.Connect("c")))
    conn.accept(False)
    conn.suback(1, [1, P.NOT_AUTHORIZED])
    conn.close("x", P.KEEP_ALIVE_TIMEOUT)
    assert conn.data_to_send() == b"\x20\x02\x00\x00" + b"\x90\x04\x00\x01\x01\x80"


def test_client_publish_with_subscription_identifier_is_a_protocol_error():
    conn = connected()
    conn.receive_data(encode(m.Publish("t", b"", 0,
                                       properties={P.SUBSCRIPTION_IDENTIFIER: [1]})))
    assert out(conn)[0].reason_code == P.PROTOCOL_ERROR and conn.closed


def test_outbound_topic_aliases_up_to_the_clients_maximum():
    conn = ServerConnection()
    conn.receive_data(encode(m.Connect("c", protocol_level=5,
                                       properties={P.TOPIC_ALIAS_MAXIMUM: 2})))
    conn.accept(False, "guest", {})
    out(conn)
    reader = PacketReader()
    reader.version, reader.started = 5, True
    t = {name: E._string(name) for name in ("long/topic/a", "long/topic/b", "long/topic/c")}
    conn.publish(t["long/topic/a"], b"1", 0, props=P.encode({P.CONTENT_TYPE: "x"}))
    conn.publish(t["long/topic/a"], b"2", 1, "tok")
    conn.publish(t["long/topic/b"], b"3", 0)
    conn.publish(t["long/topic/c"], b"4", 0)  # no alias left: the full topic
    conn.publish(t["long/topic/b"], b"5", 0)
    got = reader.feed(conn.data_to_send())
    assert [(p.topic, p.properties.get(P.TOPIC_ALIAS), p.payload) for p in got] == [
        ("long/topic/a", 1, b"1"), ("", 1, b"2"), ("long/topic/b", 2, b"3"),
        ("long/topic/c", None, b"4"), ("", 2, b"5")]
    assert got[0].properties[P.CONTENT_TYPE] == "x"


def test_no_topic_alias_to_a_client_that_accepts_none():
    conn = connected()
    conn.publish(E._string("long/topic/a"), b"1", 0)
    conn.publish(E._string("long/topic/a"), b"2", 0)
    assert [p.topic for p in out(conn)] == ["long/topic/a", "long/topic/a"]


def test_reason_string_left_out_above_the_clients_maximum_packet_size():
    conn = ServerConnection()
    conn.receive_data(encode(m.Connect("c", protocol_level=5,
                                       properties={P.MAXIMUM_PACKET_SIZE: 10})))
    conn.accept(False, "guest", {})
    out(conn)
    conn.close("a long explanation of why the connection ends", P.KEEP_ALIVE_TIMEOUT)
    assert conn.data_to_send() == b"\xe0\x01\x8d"


def test_response_topic_with_wildcards_is_a_protocol_error():
    conn = connected()
    conn.receive_data(encode(m.Publish("t", b"", 0, properties={P.RESPONSE_TOPIC: "r/#"})))
    assert out(conn)[0].reason_code == P.PROTOCOL_ERROR and conn.closed
