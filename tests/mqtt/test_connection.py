"""The sans-IO MQTT server connection: packet order, answers it gives by itself, QoS 2
downgrade, packet identifiers of deliveries, and garbage (hypothesis) never raising."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.mqtt import codec as m
from broker.mqtt.codec import PacketReader, encode
from broker.mqtt.connection import PUBREC_BIT, ServerConnection, State
from broker.mqtt.encoding import encode_publish, topic_field
from broker.mqtt.events import (
    ConnectRequested,
    DeliveryAcked,
    DeliveryCompleted,
    DeliveryReceived,
    Disconnected,
    ProtocolViolation,
    ReleaseReceived,
    SubscribeRequested,
    UnsubscribeRequested,
)

CONNECT = encode(m.Connect("c1", True, 30))


def out(conn: ServerConnection) -> list:
    return PacketReader().feed(conn.data_to_send())


def connected(**kw) -> ServerConnection:
    conn = ServerConnection(**kw)
    [ev] = conn.receive_data(CONNECT)
    assert isinstance(ev, ConnectRequested) and ev.connect.client_id == "c1"
    conn.accept(False)
    assert out(conn) == [m.ConnAck(0, False)]
    return conn


def test_connect_then_accept():
    conn = connected()
    assert conn.state is State.CONNECTED and conn.keep_alive == 30


def test_packets_behind_connect_wait_for_the_decision():
    conn = ServerConnection()
    data = CONNECT + encode(m.Subscribe(1, [("a/#", 2)])) + encode(m.Bare(m.PINGREQ))
    [ev] = conn.receive_data(data)
    assert isinstance(ev, ConnectRequested)
    assert conn.data_to_send() == b""  # nothing answered before the CONNACK
    conn.accept(True)
    events = conn.receive_data(b"")
    assert events == [SubscribeRequested(1, [("a/#", 2)])]
    assert out(conn) == [m.ConnAck(0, True), m.Bare(m.PINGRESP)]


def test_refuse_closes():
    conn = ServerConnection()
    conn.receive_data(CONNECT)
    conn.refuse(m.REFUSED_BAD_CREDENTIALS, "bad password")
    assert conn.state is State.CLOSED
    assert out(conn) == [m.ConnAck(4)]
    assert conn.receive_data(encode(m.Bare(m.PINGREQ))) == []


def test_first_packet_must_be_connect():
    conn = ServerConnection()
    [ev] = conn.receive_data(encode(m.Bare(m.PINGREQ)))
    assert isinstance(ev, ProtocolViolation) and conn.state is State.CLOSED
    assert conn.data_to_send() == b""


def test_wrong_protocol_level_gets_connack_1():
    conn = ServerConnection()
    bad = bytearray(CONNECT)
    bad[8] = 6  # protocol level byte (5 is MQTT 5.0)
    [ev] = conn.receive_data(bytes(bad))
    assert isinstance(ev, ProtocolViolation)
    assert out(conn) == [m.ConnAck(1)]


def test_second_connect_is_a_violation():
    conn = connected()
    [ev] = conn.receive_data(CONNECT)
    assert isinstance(ev, ProtocolViolation) and conn.closed


def test_wildcard_publish_topic_is_a_violation():
    conn = connected()
    raw = b"\x30" + bytes((2 + 3 + 1,)) + b"\x00\x03a/+" + b"x"
    [ev] = conn.receive_data(raw)
    assert isinstance(ev, ProtocolViolation) and "invalid topic name" in ev.reason


def test_huge_remaining_length_refused_from_its_header():
    conn = connected(max_packet=1024)
    [ev] = conn.receive_data(b"\x30\xff\xff\xff\x7f")  # 268 MB announced, nothing sent
    assert isinstance(ev, ProtocolViolation) and "exceeds the limit" in ev.reason


def test_ping_and_qos2_publish_answered_with_pubrec():
    conn = connected()
    events = conn.receive_data(encode(m.Bare(m.PINGREQ))
                               + encode(m.Publish("a/b", b"x", qos=2, packet_id=7)))
    assert events == [m.Publish("a/b", b"x", 2, False, False, 7)]
    assert out(conn) == [m.Bare(m.PINGRESP)]
    conn.pubacks([6, 7 | PUBREC_BIT])
    assert out(conn) == [m.PacketId(m.PUBACK, 6), m.PacketId(m.PUBREC, 7)]


def test_qos2_delivery_pubrec_pubrel_pubcomp():
    conn = connected()
    pid = conn.publish(topic_field("a"), b"x", 2, "token")
    out(conn)
    assert conn.receive_data(encode(m.PacketId(m.PUBACK, pid))) == []  # not for QoS 2
    assert conn.receive_data(encode(m.PacketId(m.PUBREC, pid))) == [
        DeliveryReceived("token", pid)]
    conn.pubrels([pid])  # the broker's, once it has stored what a restart needs
    assert out(conn) == [m.PacketId(m.PUBREL, pid)]
    assert conn.inflight == {} and conn.releasing == {pid}
    # the id is not reused while PUBREL waits for PUBCOMP
    assert conn.publish(topic_field("a"), b"y", 1, "t2") != pid
    assert conn.receive_data(encode(m.PacketId(m.PUBCOMP, pid))) == [DeliveryCompleted(pid)]
    assert conn.releasing == set()
    assert conn.receive_data(encode(m.PacketId(m.PUBCOMP, pid))) == []  # already complete


def test_pubrel_is_the_brokers_to_answer():
    conn = connected()
    assert conn.receive_data(encode(m.PacketId(m.PUBREL, 9))) == [ReleaseReceived(9)]
    conn.pubcomp(9)
    assert out(conn) == [m.PacketId(m.PUBCOMP, 9)]


def test_deliveries_numbered_and_acked():
    conn = connected()
    t = topic_field("a/b")
    p1 = conn.publish(t, b"one", 1, "tok1")
    p2 = conn.publish(t, b"two", 1, "tok2", dup=True)
    conn.publish(t, b"zero", 0)
    assert (p1, p2) == (1, 2)
    assert out(conn) == [m.Publish("a/b", b"one", 1, False, False, 1),
                         m.Publish("a/b", b"two", 1, False, True, 2),
                         m.Publish("a/b", b"zero", 0, False, False, None)]
    events = conn.receive_data(encode(m.PacketId(m.PUBACK, 2)) + encode(m.PacketId(m.PUBACK, 2)))
    assert events == [DeliveryAcked("tok2")]  # the repeated PUBACK is ignored
    assert conn.take_inflight() == ["tok1"]


def test_packet_ids_skip_those_in_flight():
    conn = connected()
    t = topic_field("t")
    conn._next_id = 65535
    assert conn.publish(t, b"", 1, 1) == 65535
    assert conn.publish(t, b"", 1, 2) == 1  # wraps, 0 is never used


def test_unsubscribe_and_disconnect():
    conn = connected()
    events = conn.receive_data(encode(m.Unsubscribe(3, ["a/b"])) + encode(m.Bare(m.DISCONNECT))
                               + encode(m.Bare(m.PINGREQ)))
    assert events == [UnsubscribeRequested(3, ["a/b"]), Disconnected()]
    assert conn.closed and conn.data_to_send() == b""


def test_encode_publish_matches_codec():
    for size in (0, 10, 200, 20_000):
        payload = b"p" * size
        for qos in (0, 1):
            data = encode_publish(topic_field("x/y"), payload, qos, 5 if qos else 0, True)
            assert data == encode(m.Publish("x/y", payload, qos, True, False, 5 if qos else None))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(min_value=1, max_value=40))
def test_garbage_after_connect_never_raises(data, step):
    conn = connected(max_packet=4096)
    for i in range(0, len(data), step):
        events = conn.receive_data(data[i:i + step])
        for ev in events:
            assert not isinstance(ev, ConnectRequested)
        if conn.closed:
            assert conn.receive_data(b"\xc0\x00") == []
            break


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_instead_of_connect_never_raises(data):
    conn = ServerConnection(max_packet=4096)
    events = conn.receive_data(data)
    assert all(isinstance(ev, (ConnectRequested, ProtocolViolation)) for ev in events)


def test_topic_field_of_a_routing_key_that_is_not_utf8():
    """An AMQP routing key with bytes that are not UTF-8 still makes a valid MQTT topic."""

    key = b"sensors.\xff".decode("utf-8", "surrogateescape")
    assert topic_field(key) == b"\x00\x09sensors.?"
