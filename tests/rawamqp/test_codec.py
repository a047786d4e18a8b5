"""rawamqp.codec: the test/benchmark client's own wire format, checked against RabbitMQ.

Expected octets come from RabbitMQ's ``rabbit_binary_generator`` (one ``field_value_to_binary``
clause per tag), from the 0-9-1 spec's frame and property-flag layout, and from bytes a
RabbitMQ 3.10.8 broker actually sent (``RABBIT_*`` below).  Nothing here needs a broker.
"""
from __future__ import annotations

import datetime
import decimal
import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

import rawamqp
from rawamqp import (
    BASIC_ACK,
    BASIC_PROPERTIES,
    BASIC_PUBLISH,
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_METHOD,
    FieldError,
    Reader,
    Typed,
    TypedReader,
    basic_properties,
    body_frames,
    content_header,
    encode_publish,
    field_value,
    method_frame,
    parse_basic_properties,
    split_frames,
    table,
)

# ---------------------------------------------------------------- every field type
# (tag, value, octets RabbitMQ's rabbit_binary_generator writes for it, value decoded)
RABBIT_FIELDS = [
    ("t", True, b"t\x01", True),
    ("t", False, b"t\x00", False),
    ("b", -5, b"b\xfb", -5),
    ("B", 255, b"B\xff", 255),
    ("s", -2, b"s\xff\xfe", -2),                       # signed 16-bit, not a short string
    ("u", 65535, b"u\xff\xff", 65535),
    ("I", -2, b"I\xff\xff\xff\xfe", -2),
    ("i", 4294967295, b"i\xff\xff\xff\xff", 4294967295),
    ("l", -2, b"l" + b"\xff" * 7 + b"\xfe", -2),        # signed 64-bit
    ("f", 1.5, b"f\x3f\xc0\x00\x00", 1.5),
    ("d", 1.5, b"d\x3f\xf8" + b"\x00" * 6, 1.5),
    ("D", (2, 12345), b"D\x02\x00\x00\x30\x39", (2, 12345)),
    ("D", (0, 4294967295), b"D\x00\xff\xff\xff\xff", (0, 4294967295)),  # mantissa unsigned
    ("S", "ab", b"S\x00\x00\x00\x02ab", "ab"),
    ("S", "", b"S\x00\x00\x00\x00", ""),
    ("x", b"\x00\xff", b"x\x00\x00\x00\x02\x00\xff", b"\x00\xff"),
    ("T", 1700000000, b"T\x00\x00\x00\x00\x65\x53\xf1\x00", 1700000000),
    ("V", None, b"V", None),
    ("F", {"k": True}, b"F\x00\x00\x00\x04\x01kt\x01", {"k": True}),
    ("F", {}, b"F\x00\x00\x00\x00", {}),
    ("A", [1, "a"], b"A\x00\x00\x00\x0bI\x00\x00\x00\x01S\x00\x00\x00\x01a", [1, "a"]),
    ("A", [], b"A\x00\x00\x00\x00", []),
]


@pytest.mark.parametrize(("tag", "value", "octets", "decoded"), RABBIT_FIELDS,
                         ids=[f"{f[0]}-{i}" for i, f in enumerate(RABBIT_FIELDS)])
def test_every_field_type_round_trips(tag, value, octets, decoded):
    assert field_value(Typed(tag, value)) == octets
    assert Reader(octets).value() == decoded
    typed = TypedReader(octets).value()
    assert typed == (tag, TypedReader(octets).value().value)
    assert typed.tag == tag
    assert field_value(typed) == octets  # TypedReader output encodes back to the same octets


@pytest.mark.parametrize(("value", "octets"), [
    (True, b"t\x01"),
    (0, b"I\x00\x00\x00\x00"),
    (-(2**31), b"I\x80\x00\x00\x00"),
    (2**31 - 1, b"I\x7f\xff\xff\xff"),
    (2**31, b"l\x00\x00\x00\x00\x80\x00\x00\x00"),      # beyond int32: signed 64-bit 'l'
    (-(2**31) - 1, b"l\xff\xff\xff\xff\x7f\xff\xff\xff"),
    (-(2**63), b"l\x80" + b"\x00" * 7),
    (1.5, b"d\x3f\xf8" + b"\x00" * 6),
    ("é", b"S\x00\x00\x00\x02\xc3\xa9"),
    (b"\xff", b"S\x00\x00\x00\x01\xff"),
    (bytearray(b"\x01"), b"x\x00\x00\x00\x01\x01"),
    (None, b"V"),
    ((1,), b"A\x00\x00\x00\x05I\x00\x00\x00\x01"),
    ({"a": {}}, b"F\x00\x00\x00\x07\x01aF\x00\x00\x00\x00"),
    (decimal.Decimal("1.23"), b"D\x02\x00\x00\x00\x7b"),
    (decimal.Decimal("-1"), b"D\x00\xff\xff\xff\xff"),  # two's complement, as pika/Java send it
    (decimal.Decimal("5E+2"), b"D\x00\x00\x00\x01\xf4"),
    (datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC),
     b"T\x00\x00\x00\x00\x65\x53\xf1\x00"),
])
def test_default_python_mapping(value, octets):
    assert field_value(value) == octets


@pytest.mark.parametrize("bad", [
    2**63, -(2**63) - 1, object(), Typed("b", 128), Typed("B", -1), Typed("u", 65536),
    Typed("i", -1), Typed("T", -1), Typed("D", (256, 1)), Typed("D", (0, 2**32)), Typed("U", 1),
    decimal.Decimal("NaN"),
])
def test_unencodable_values(bad):
    with pytest.raises(FieldError):
        field_value(bad)


@pytest.mark.parametrize(("octets", "decoded"), [
    (b"L" + b"\xff" * 8, -1),                  # RabbitMQ reads 'L' as signed 64-bit, like 'l'
    (b"S\x00\x00\x00\x01\xff", b"\xff"),       # not UTF-8: kept as bytes, never replaced
    (b"D\x02\x80\x00\x00\x00", (2, 2**31)),    # mantissa unsigned (rabbit_binary_parser)
    (b"T" + b"\xff" * 8, 2**64 - 1),           # timestamp unsigned
])
def test_decoding_follows_rabbitmq(octets, decoded):
    assert Reader(octets).value() == decoded


@pytest.mark.parametrize("octets", [b"U\xff\xff", b"Z", b"s\x01"])
def test_tags_rabbitmq_does_not_know_are_refused(octets):
    # 'U' is the 0-9-1 grammar's short-int: RabbitMQ 3.10 drops the connection on it
    with pytest.raises(ValueError):
        Reader(octets).value()


def test_s_is_a_signed_short_not_a_short_string():
    # the 0-9-1 grammar has 's' = short-string; RabbitMQ (and every client) use int16
    r = Reader(b"s\x02ab")
    assert r.value() == 0x0261 and r.pos == 3


def test_table_round_trip_keeps_order_and_types():
    d = {"z": 1, "a": Typed("u", 2), "m": [Typed("b", -1), {"n": None}], "s": "x", "big": 2**40}
    enc = table(d)
    assert enc[:4] == struct.pack(">I", len(enc) - 4)
    assert list(Reader(enc).table()) == ["z", "a", "m", "s", "big"]
    assert Reader(enc).table() == {"z": 1, "a": 2, "m": [-1, {"n": None}], "s": "x", "big": 2**40}
    typed = TypedReader(enc).table()
    assert typed["big"] == ("l", 2**40) and typed["a"] == ("u", 2)
    assert table(typed) == enc


def test_empty_tables():
    assert table(None) == table({}) == b"\x00\x00\x00\x00"
    assert Reader(b"\x00\x00\x00\x00").table() == {}


def test_table_length_is_checked():
    with pytest.raises(ValueError):
        Reader(b"\x00\x00\x00\x09\x01kt\x01").table()          # claims more than there is
    with pytest.raises(ValueError):
        Reader(b"\x00\x00\x00\x03\x01kt\x01").table()          # value runs past the length
    with pytest.raises(ValueError):
        Reader(b"\x00\x00\x00\x06\x01kI\x00").table()          # truncated int


def test_amqplain_response_is_a_table_without_length():
    assert rawamqp.amqplain_response("u", "p") == table({"LOGIN": "u", "PASSWORD": "p"})[4:]
    assert rawamqp.plain_response("u", "p") == b"\x00u\x00p"


_scalar = st.one_of(
    st.booleans().map(lambda v: Typed("t", v)),
    st.integers(-128, 127).map(lambda v: Typed("b", v)),
    st.integers(0, 255).map(lambda v: Typed("B", v)),
    st.integers(-(2**15), 2**15 - 1).map(lambda v: Typed("s", v)),
    st.integers(0, 2**16 - 1).map(lambda v: Typed("u", v)),
    st.integers(-(2**31), 2**31 - 1).map(lambda v: Typed("I", v)),
    st.integers(0, 2**32 - 1).map(lambda v: Typed("i", v)),
    st.integers(-(2**63), 2**63 - 1).map(lambda v: Typed("l", v)),
    st.floats(width=32, allow_nan=False).map(lambda v: Typed("f", v)),
    st.floats(allow_nan=False).map(lambda v: Typed("d", v)),
    st.tuples(st.integers(0, 255), st.integers(0, 2**32 - 1)).map(lambda v: Typed("D", v)),
    st.text().map(lambda v: Typed("S", v)),
    st.binary().map(lambda v: Typed("x", v)),
    st.integers(0, 2**64 - 1).map(lambda v: Typed("T", v)),
    st.just(Typed("V", None)),
)
_values = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda v: Typed("A", v)),
        st.dictionaries(st.text(max_size=10), inner, max_size=4).map(lambda v: Typed("F", v)),
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.text(max_size=20), _values, max_size=6))
def test_typed_tables_round_trip(d):
    enc = table(d)
    assert TypedReader(enc).table() == d
    assert table(TypedReader(enc).table()) == enc


def test_floats_keep_their_width():
    assert TypedReader(field_value(Typed("f", 0.1))).value().value == struct.unpack(">f", struct.pack(">f", 0.1))[0]
    assert math.isnan(Reader(b"d" + struct.pack(">d", math.nan)).value())


# ---------------------------------------------------------------- bytes RabbitMQ sent
# The start of connection.start's server-properties "capabilities" entry, RabbitMQ 3.10.8.
RABBIT_CAPABILITIES_PREFIX = bytes.fromhex(
    "0c6361706162696c697469657346000000c7127075626c69736865725f636f6e6669726d7374011a65786368"
    "616e67655f65786368616e67655f62696e64696e677374010a62617369632e6e61636b74")

# A content header RabbitMQ 3.10.8 sent for a dead-lettered (expired) message published
# with headers {"k": Typed("u", 7)} and delivery-mode 1 to queue "cap-src-e65500".
RABBIT_DEAD_LETTER_HEADER = bytes.fromhex(
    "003c000000000000000000053000000000f7016b75000707782d64656174684100000081460000007c0563"
    "6f756e746c000000000000000106726561736f6e530000000765787069726564057175657565530000000e"
    "6361702d7372632d6536353530300474696d6554000000006b048e010865786368616e676553000000000c"
    "726f7574696e672d6b6579734100000013530000000e6361702d7372632d65363535303016782d66697273"
    "742d64656174682d65786368616e6765530000000013782d66697273742d64656174682d717565756553"
    "0000000e6361702d7372632d65363535303014782d66697273742d64656174682d726561736f6e530000"
    "00076578706972656401")


def test_rabbitmq_capabilities_table():
    names = ["publisher_confirms", "exchange_exchange_bindings", "basic.nack", "consumer_cancel_notify",
             "connection.blocked", "consumer_priorities", "authentication_failure_close",
             "per_consumer_qos", "direct_reply_to"]
    ours = table({"capabilities": dict.fromkeys(names, True)})[4:]
    assert ours.startswith(RABBIT_CAPABILITIES_PREFIX)


def test_rabbitmq_dead_letter_header_decodes_and_reencodes_exactly():
    props = parse_basic_properties(RABBIT_DEAD_LETTER_HEADER, typed=True)
    assert props["_body_size"] == 5 and props["delivery_mode"] == 1
    h = props["headers"]
    assert h["k"] == ("u", 7)
    assert h["x-first-death-reason"] == ("S", "expired")
    tag, deaths = h["x-death"]
    assert tag == "A" and len(deaths) == 1
    death = deaths[0].value
    assert death["count"] == ("l", 1)                 # RabbitMQ's count is a signed 64-bit 'l'
    assert death["time"].tag == "T"
    assert death["routing-keys"] == ("A", [("S", "cap-src-e65500")])
    assert list(death) == ["count", "reason", "queue", "time", "exchange", "routing-keys"]
    # our encoder writes exactly what RabbitMQ wrote
    again = content_header(1, 5, props=basic_properties(headers=h, delivery_mode=1))[7:-1]
    assert again == RABBIT_DEAD_LETTER_HEADER


# ---------------------------------------------------------------- basic properties
@pytest.mark.parametrize("index", range(len(BASIC_PROPERTIES)))
def test_each_property_has_its_own_flag_bit(index):
    name, kind = BASIC_PROPERTIES[index]
    value = {"shortstr": "v", "octet": 2, "longlong": 1700000000, "table": {"h": 1}}[kind]
    enc = basic_properties(**{name: value})
    (flags,) = struct.unpack_from(">H", enc)
    assert flags == 1 << (15 - index)
    props = parse_basic_properties(struct.pack(">HHQ", 60, 0, 0) + enc)
    assert props == {"_body_size": 0, name: value}


def test_property_flags_known_values():
    assert basic_properties() == b"\x00\x00"
    assert basic_properties(delivery_mode=2) == b"\x10\x00\x02"                 # bit 12
    assert basic_properties(content_type="a", priority=9) == b"\x88\x00\x01a\x09"
    assert basic_properties(cluster_id="c") == b"\x00\x04\x01c"                 # bit 2, the last
    assert basic_properties(delivery_mode=None) == b"\x00\x00"                 # None = absent


def test_all_properties_in_order():
    values = {"content_type": "text/plain", "content_encoding": "gzip", "headers": {"a": "b"},
              "delivery_mode": 2, "priority": 5, "correlation_id": "c", "reply_to": "r",
              "expiration": "60000", "message_id": "m", "timestamp": 1700000000, "type": "t",
              "user_id": "guest", "app_id": "app", "cluster_id": "cl"}
    enc = basic_properties(**values)
    assert enc[:2] == b"\xff\xfc"
    assert parse_basic_properties(struct.pack(">HHQ", 60, 0, 7) + enc) == {"_body_size": 7, **values}


def test_property_flag_continuation_words_are_followed():
    # flags with the continuation bit (bit 0) set, then a second (empty) flag word
    payload = struct.pack(">HHQ", 60, 0, 3) + b"\x10\x01" + b"\x00\x00" + b"\x02"
    assert parse_basic_properties(payload) == {"_body_size": 3, "delivery_mode": 2}


def test_unknown_property_is_refused():
    with pytest.raises(TypeError):
        basic_properties(deliverymode=2)


# ---------------------------------------------------------------- frames
def test_method_frame_layout_and_both_call_forms():
    f = method_frame(3, BASIC_ACK, struct.pack(">QB", 7, 1))
    assert f == b"\x01\x00\x03\x00\x00\x00\x0d\x00\x3c\x00\x50" + struct.pack(">QB", 7, 1) + b"\xce"
    assert method_frame(3, 60, 80, struct.pack(">QB", 7, 1)) == f
    assert rawamqp.ack_frame(3, 7, True) == f
    assert method_frame(0, 10, 51) == method_frame(0, rawamqp.CONNECTION_CLOSE_OK) == \
        b"\x01\x00\x00\x00\x00\x00\x04\x00\x0a\x00\x33\xce"
    with pytest.raises(TypeError):
        method_frame(1, 60)


def test_heartbeat_and_header_frames():
    assert rawamqp.heartbeat_frame() == b"\x08\x00\x00\x00\x00\x00\x00\xce"
    assert content_header(1, 300) == b"\x02\x00\x01\x00\x00\x00\x0e\x00\x3c\x00\x00" + \
        struct.pack(">Q", 300) + b"\x00\x00\xce"
    assert rawamqp.frame(FRAME_BODY, 1, b"x", end=b"\xcd")[-1:] == b"\xcd"


@pytest.mark.parametrize(("size", "frame_max", "chunks"), [
    (0, 131072, []),
    (1, 131072, [1]),
    (10, 12, [4, 4, 2]),                 # frame_max counts the 8 octets of frame overhead
    (8, 12, [4, 4]),
    (131064, 131072, [131064]),          # exactly one full frame
    (131065, 131072, [131064, 1]),
    (5000, 0, [5000]),                   # frame_max 0: no limit
])
def test_body_frames_split_at_frame_max(size, frame_max, chunks):
    body = bytes(range(256)) * (size // 256 + 1)
    body = body[:size]
    frames = body_frames(5, body, frame_max)
    assert [len(f) - 8 for f in frames] == chunks
    got, end = split_frames(b"".join(frames))
    assert end == sum(len(f) for f in frames)
    assert all(ft == FRAME_BODY and ch == 5 for ft, ch, _ in got)
    assert b"".join(p for _, _, p in got) == body
    assert all(len(f) <= frame_max for f in frames if frame_max)


def test_body_frames_need_room():
    with pytest.raises(ValueError):
        body_frames(1, b"x", 8)


def test_encode_publish_layout():
    body = b"\x00" * 8 + b"payload" * 10
    data, body_off = encode_publish(1, "ex", "rk", body, frame_max=40, delivery_mode=2)
    assert data[body_off:body_off + 8] == body[:8]
    frames, end = split_frames(data)
    assert end == len(data)
    (t0, c0, m), (t1, c1, h), *bodies = frames
    assert (t0, c0, t1, c1) == (FRAME_METHOD, 1, FRAME_HEADER, 1)
    r = Reader(m)
    assert (r.short(), r.short()) == BASIC_PUBLISH
    assert (r.short(), r.shortstr(), r.shortstr(), r.bits(2)) == (0, "ex", "rk", [False, False])
    assert parse_basic_properties(h) == {"_body_size": len(body), "delivery_mode": 2}
    assert [len(p) for _, _, p in bodies] == [32, 32, 14]
    assert b"".join(p for _, _, p in bodies) == body


def test_split_frames_on_a_stream_cut_anywhere():
    stream = (method_frame(1, BASIC_ACK, struct.pack(">QB", 1, 0)) + rawamqp.heartbeat_frame()
              + content_header(1, 3) + rawamqp.body_frame(1, b"abc"))
    whole, end = split_frames(stream)
    assert end == len(stream) and [f[0] for f in whole] == [1, 8, 2, 3]
    for cut in range(len(stream) + 1):
        first, pos = split_frames(stream[:cut])
        rest, end = split_frames(stream[pos:])
        assert first + rest == whole and pos + end == len(stream)
    buf = bytearray(b"junk" + stream)
    assert split_frames(buf, 4) == (whole, len(buf))


def test_split_frames_checks_the_frame_end():
    with pytest.raises(FieldError):
        split_frames(rawamqp.frame(FRAME_BODY, 1, b"x", end=b"\xcd"))


def test_reader_over_bytearray_and_offsets():
    buf = bytearray(b"\xffskip" + struct.pack(">HIQ", 1, 2, 3) + b"\x03abc" + b"\x00\x00\x00\x02hi")
    r = Reader(buf, 5)
    assert (r.short(), r.long(), r.longlong(), r.shortstr(), r.longstr()) == (1, 2, 3, "abc", b"hi")
    assert r.pos == len(buf)
    with pytest.raises(ValueError):
        r.octet()
    assert rawamqp._Reader is Reader
