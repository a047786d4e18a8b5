"""MQTT 3.1.1 codec: exact bytes from the spec, round trips, and every malformed case the
spec names closing the connection (MalformedPacket), fuzzed with hypothesis."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.mqtt import codec as m
from broker.mqtt import encoding as E
from broker.mqtt.codec import MalformedPacket, PacketReader, UnsupportedProtocol, encode


def one(data: bytes):
    [packet] = PacketReader().feed(data)
    return packet


# ---- exact bytes -------------------------------------------------------------------------

def test_spec_examples():
    assert encode(m.Bare(m.PINGREQ)) == b"\xc0\x00"
    assert encode(m.Bare(m.DISCONNECT)) == b"\xe0\x00"
    assert encode(m.ConnAck(0, session_present=True)) == b"\x20\x02\x01\x00"
    assert encode(m.PacketId(m.PUBREL, 10)) == b"\x62\x02\x00\x0a"  # PUBREL flags are 0010
    # section 3.1.2.10 example: keep alive 10, clean session, client id "c"
    connect = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x0a\x00\x01c"
    assert one(connect) == m.Connect("c", True, 10)
    assert encode(m.Connect("c", True, 10)) == connect


@pytest.mark.parametrize("n", [0, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, 268_435_455])
def test_remaining_length_boundaries(n):
    encoded = m.encode_length(n)
    assert len(encoded) == (1 if n < 128 else 2 if n < 16_384 else 3 if n < 2_097_152 else 4)
    if n >= 5:  # a PUBLISH of exactly n remaining bytes: topic "t" and n - 3 payload bytes
        packet = m.Publish("t", b"p" * (n - 3))
        data = encode(packet)
        assert data[1:1 + len(encoded)] == encoded
        reader = PacketReader()
        assert reader.feed(data[:-1]) == []  # waits for the whole body
        assert reader.feed(data[-1:]) == [packet]


def test_publish_with_qos_and_flags_round_trips():
    p = m.Publish("a/b", b"\x00payload", qos=2, retain=True, dup=True, packet_id=7)
    data = encode(p)
    assert data[0] == 0x3D  # PUBLISH | DUP | QoS 2 | RETAIN
    assert one(data) == p


@pytest.mark.parametrize("packet", [
    m.Connect("dev-1", False, 30, "vhost:user", b"secret",
              m.Will("status/dev-1", b"gone", 1, True)),
    m.Connect("", True, 0, protocol_level=3),
    m.Subscribe(5, [("a/+/c", 0), ("#", 1), ("x/#", 2)]),
    m.SubAck(5, [0, 1, m.SUBACK_FAILURE]),
    m.Unsubscribe(6, ["a/+/c", "#"]),
    m.PacketId(m.PUBACK, 65535),
    m.PacketId(m.UNSUBACK, 1),
    m.Publish("t", b"", qos=1, packet_id=1),
    m.Publish("t/ü/€", b"x" * 70_000),
    m.Bare(m.PINGRESP),
])
def test_round_trip(packet):
    assert one(encode(packet)) == packet


def test_stream_split_anywhere_gives_the_same_packets():
    packets = [m.Connect("c"), m.Publish("a/b", b"x" * 300, 1, packet_id=3),
               m.Subscribe(4, [("a/#", 1)]), m.Bare(m.PINGREQ), m.Bare(m.DISCONNECT)]
    data = b"".join(encode(p) for p in packets)
    for cut in range(len(data) + 1):
        reader = PacketReader()
        assert reader.feed(data[:cut]) + reader.feed(data[cut:]) == packets
    reader = PacketReader()
    assert [p for i in range(len(data)) for p in reader.feed(data[i:i + 1])] == packets


# ---- malformed: the server closes the connection ----------------------------------------------

@pytest.mark.parametrize(("data", "why"), [
    (b"\x00\x00", "reserved packet type"),
    (b"\xf0\x00", "reserved packet type"),
    (b"\xc1\x00", "invalid fixed header flags"),  # PINGREQ with a flag
    (b"\x80\x05\x00\x01\x00\x01a", "invalid fixed header flags"),  # SUBSCRIBE flags 0000
    (b"\x36\x05\x00\x01a\x00\x01", "QoS 3"),
    (b"\x38\x03\x00\x01a", "DUP set at QoS 0"),
    (b"\x30\x03\x00\x01+", "invalid topic name"),
    (b"\x30\x04\x00\x02a#", "invalid topic name"),
    (b"\x30\x02\x00\x00", "invalid topic name"),  # empty topic
    (b"\x32\x05\x00\x01a\x00\x00", "packet identifier 0"),
    (b"\x30\x04\x00\x02\xc3\x28", "UTF-8"),
    (b"\x30\x04\x00\x02a\x00", r"U\+0000"),
    (b"\x82\x02\x00\x01", "without topic filters"),
    (b"\x82\x07\x00\x01\x00\x02a#\x00", "invalid topic filter"),
    (b"\x82\x06\x00\x01\x00\x01a\x03", "requested QoS"),
    (b"\x82\x06\x00\x01\x00\x01a\x04", "requested QoS"),
    (b"\xa2\x02\x00\x01", "without topic filters"),
    (b"\x40\x03\x00\x01\x00", "unexpected bytes"),
    (b"\xc0\x01\x00", "unexpected bytes"),
    (b"\x10\x0d\x00\x04MQTT\x04\x03\x00\x0a\x00\x01c", "reserved flag"),
    (b"\x10\x0d\x00\x04MQTT\x04\x22\x00\x0a\x00\x01c", "without the will flag"),
    (b"\x10\x0d\x00\x04MQTT\x04\x42\x00\x0a\x00\x01c", "password flag without user name"),
    (b"\x10\x0d\x00\x04MQXX\x04\x02\x00\x0a\x00\x01c", "unknown protocol name"),
    (b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x0a\x00\x01", "overruns the packet"),
    (b"\x10\x09\x00\x04MQTT\x04\x02\x00", "ends early"),
])
def test_malformed(data, why):
    with pytest.raises(MalformedPacket, match=why):
        PacketReader().feed(data)


def test_wrong_protocol_level_is_answered_with_connack_1():
    with pytest.raises(UnsupportedProtocol):
        PacketReader().feed(b"\x10\x0d\x00\x04MQTT\x06\x02\x00\x0a\x00\x01c")


def test_huge_remaining_length_is_refused_before_the_body_arrives():
    reader = PacketReader(max_packet=1024)
    with pytest.raises(MalformedPacket, match="exceeds the limit"):
        reader.feed(b"\x30\xff\xff\xff\x7f")
    with pytest.raises(MalformedPacket, match="longer than 4 bytes"):
        PacketReader().feed(b"\x30\xff\xff\xff\xff\x01")


def test_topic_filters():
    good = ["#", "+", "a/#", "+/+", "a/+/b", "/", "a//b", "sport/tennis/+"]
    bad = ["", "a#", "a/#/b", "a+", "+a/b", "a/b#"]
    assert all(m.valid_topic_filter(t) for t in good)
    assert not any(m.valid_topic_filter(t) for t in bad)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_only_ever_raise_malformed(data):
    try:
        PacketReader(max_packet=10_000).feed(data)
    except MalformedPacket:
        pass


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40).filter(lambda t: "\x00" not in t and "+" not in t
                                                and "#" not in t),
       st.binary(max_size=200), st.integers(0, 2), st.booleans(), st.integers(1, 65535))
def test_any_publish_round_trips(topic, payload, qos, retain, pid):
    p = m.Publish(topic, payload, qos, retain, False, pid if qos else None)
    assert one(encode(p)) == p


@settings(max_examples=400, deadline=None)
@given(st.integers(0x30, 0x3F), st.one_of(
    st.binary(max_size=40),
    st.builds(lambda t, pid, p: E._string(t) + pid + p, st.text(max_size=8),
              st.binary(min_size=0, max_size=2), st.binary(max_size=8))))
def test_publish_fast_path_agrees_with_decode(first, body):
    """PacketReader reads PUBLISH in place (``_publish_at``): same packet, same refusals."""
    try:
        expected = decode_or_error(lambda: m.decode(first, body))
    except UnicodeEncodeError:
        return
    got = decode_or_error(lambda: m._publish_at(first, bytearray(body), 0, len(body)))
    assert got == expected


def decode_or_error(f):
    try:
        return f()
    except MalformedPacket:
        return MalformedPacket
