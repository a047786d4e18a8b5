"""AMQP 1.0 addresses and the message mapping to and from AMQP 0-9-1 properties."""
from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Message, symbol, ulong

from broker.amqp.fields import decode_properties, encode_properties
from broker.amqp10 import addresses, mapping


@pytest.mark.parametrize(("address", "expected"), [
    ("/exchanges/amq.topic/a.b", addresses.Target("amq.topic", "a.b")),
    ("/exchanges/amq.direct", addresses.Target("amq.direct", None)),
    ("/exchanges/amq.default/q", addresses.Target("", "q")),
    ("/exchanges/my%2Fex/k%20y", addresses.Target("my/ex", "k y")),
    ("/queues/q%2F1", addresses.Target("", "q/1", "q/1")),
    ("/exchange/amq.fanout/x", addresses.Target("amq.fanout", "x")),
    ("/topic/t.1", addresses.Target("amq.topic", "t.1")),
    ("topic://t.1", addresses.Target("amq.topic", "t.1")),
    ("/queue/q", addresses.Target("", "q", "q", True)),
    ("/amq/queue/q", addresses.Target("", "q", "q", False)),
    ("queue://q", addresses.Target("", "q", "q", True)),
    ("orders", addresses.Target("", "orders", "orders", True)),
])
def test_targets(address, expected):
    assert addresses.parse_target(address) == expected


@pytest.mark.parametrize("address", ["/queues/", "/queues/a/b", "/exchanges/", "/unknown/x",
                                     "/exchanges/x/k/extra"])
def test_bad_targets(address):
    with pytest.raises(addresses.AddressError):
        addresses.parse_target(address)


def test_sources():
    assert addresses.parse_source("/queues/q") == addresses.Source("q")
    assert addresses.parse_source("/queue/q") == addresses.Source("q", True)
    assert addresses.parse_source("/topic/a.*") == addresses.Source(None, False, "amq.topic", "a.*")
    assert addresses.parse_source("/exchange/amq.fanout") == addresses.Source(None, False,
                                                                          "amq.fanout", "")
    with pytest.raises(addresses.AddressError):
        addresses.parse_source("/exchanges/amq.topic/k")  # RabbitMQ 4 consumes queues only


def _round_trip_091(data: bytes) -> tuple[dict, bytes]:
    inc = mapping.decode(data)
    # through the 0-9-1 wire form, as a message published over 1.0 is stored and delivered
    props = decode_properties(encode_properties(inc.properties))
    return props, inc.body


def test_properties_to_091_and_back():
    mid = uuid.uuid4()
    m = Message(body=b"b", inferred=True, id=mid, correlation_id=ulong(42), durable=True,
                priority=9, ttl=1.5, content_type="text/plain", content_encoding="gzip",
                user_id=b"guest", reply_to="/queues/replies", subject="kind",
                creation_time=1700000000, group_id="g", group_sequence=0xFFFFFFFF,
                properties={"s": "v", "i": 7, "b": True, "f": 1.5, "raw": b"\x00\x01"},
                annotations={symbol("x-opt-thing"): "t", symbol("x-basic-app-id"): "app"})
    props, body = _round_trip_091(m.encode())
    assert body == b"b"
    assert props["delivery_mode"] == 2 and props["priority"] == 9
    assert props["expiration"] == "1500"
    assert props["message_id"] == str(mid)
    assert props["correlation_id"] == "42"
    assert props["reply_to"] == "replies"
    assert props["type"] == "kind" and props["app_id"] == "app"
    assert props["user_id"] == "guest"
    assert props["timestamp"] == 1700000000
    h = props["headers"]
    assert h["x-message-id-type"] == b"uuid" and h["x-correlation-id-type"] == b"ulong"
    assert h["JMSXGroupID"] == b"g" and h["JMSXGroupSeq"] == -1
    assert h["s"] == b"v" and h["i"] == 7 and h["b"] is True and h["raw"] == b"\x00\x01"

    back = Message()
    back.decode(mapping.encode(props, body, "", "q", False))
    assert back.id == mid and back.correlation_id == 42
    assert back.durable and back.priority == 9 and back.ttl == 1.5
    assert back.reply_to == "/queues/replies"
    assert back.subject == "kind" and back.group_id == "g" and back.group_sequence == 0xFFFFFFFF
    assert back.properties["s"] == "v" and back.properties["i"] == 7
    assert back.annotations[symbol("x-opt-thing")] == "t"
    assert back.annotations[symbol("x-basic-app-id")] == "app"
    assert back.annotations[symbol("x-routing-key")] == "q"
    assert "x-message-id-type" not in (back.properties or {})


def test_amqp_value_bodies():
    assert mapping.decode(Message(body="text").encode()).body == b"text"
    assert mapping.decode(Message(body=None).encode()).body == b""
    # a map has no 0-9-1 form: its AMQP encoding is the body
    assert mapping.decode(Message(body={"a": 1}).encode()).body[:1] in (b"\xc1", b"\xd1")


def test_undecodable_message_is_a_value_error():
    with pytest.raises(ValueError):
        mapping.decode(b"\x00Sp\xff\xff")


def test_redelivered_counts():
    m = Message()
    m.decode(mapping.redelivered(Message(body="x").encode()))
    assert m.delivery_count == 1 and not m.first_acquirer


_FIELDS = ("durable", "priority", "ttl", "id", "correlation_id", "user_id", "reply_to",
           "content_type", "content_encoding", "creation_time", "subject", "group_id",
           "group_sequence", "delivery_count", "first_acquirer", "properties", "annotations")


@pytest.mark.parametrize("props", [
    {},
    {"delivery_mode": 2},
    {"delivery_mode": 2, "priority": 3, "expiration": "1500", "message_id": "m1",
     "correlation_id": str(uuid.uuid4()), "content_type": "text/plain", "reply_to": "rq",
     "content_encoding": "gzip", "timestamp": 1700000000, "type": "t", "app_id": "a",
     "user_id": "guest",
     "headers": {"h": b"x", "n": 3, "x-opt-z": 1.5, "x-correlation-id-type": b"uuid",
                 "JMSXGroupID": b"g", "JMSXGroupSeq": -1, "big": 1 << 40,
                 "raw": bytearray(b"\x00"), "t": True, "neg": -5, "none": None}},
    {"message_id": "42", "headers": {"x-message-id-type": b"ulong", "nested": {"a": 1},
                                     "x-table": {"k": [1, "s"]}}},
])
@pytest.mark.parametrize("redelivered", [False, True])
def test_fast_encoder_matches_protons(props, redelivered):
    body = b"payload" * 50
    slow, fast = Message(), Message()
    slow.decode(mapping.encode(props, body, "ex", "rk", redelivered))
    fast.decode(mapping.encode_fast(props, body, "ex", "rk", redelivered))
    for field in _FIELDS:
        assert getattr(fast, field) == getattr(slow, field), field
    assert bytes(fast.body) == bytes(slow.body) == body


_MESSAGES = [
    Message(body=b"b", inferred=True),
    Message(body="text"),
    Message(body=None),
    Message(body=b"x" * 70000, inferred=True, durable=True, priority=9, ttl=2.5),
    Message(body="v", id=uuid.UUID(int=7), correlation_id=ulong(42), user_id=b"guest",
            reply_to="/queues/r%2F1", subject="s", content_type="text/plain",
            content_encoding="gzip", creation_time=1700000000.5, group_id="g",
            group_sequence=0xFFFFFFFF, address="/queues/q",
            properties={"s": "v", "i": 7, "neg": -70000, "big": 1 << 40, "b": True,
                        "f": 1.5, "raw": b"\x00\x01", "none": None},
            annotations={symbol("x-opt-a"): "t", symbol("x-basic-type"): "kind",
                         symbol("x-opt-map"): {"k": [1, 2]}}),
    Message(body={"a": 1}),  # amqp-value map: proton's path
    Message(body=b"b", inferred=True, id=b"bin-id", correlation_id="c"),
]


@pytest.mark.parametrize("m", _MESSAGES)
def test_direct_decoder_matches_protons(m):
    data = m.encode()
    assert mapping.decode(data) == mapping.decode_proton(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_messages_decode_or_raise_value_error(data):
    try:
        mapping.decode(data)
    except ValueError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=60))
def test_damaged_messages_decode_or_raise_value_error(tail):
    data = _MESSAGES[4].encode()
    try:
        mapping.decode(bytes(data[: len(data) // 2]) + tail)
    except ValueError:
        pass
