"""RabbitMQ 4's HTTP-over-AMQP management requests and answers, protocol side: what
``parse_request`` takes and refuses, the binding path segments, the answer's fields."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Message

from broker.amqp10 import management as http


def _req(**kw) -> bytes:
    fields = {"id": "m1", "address": "/queues/q%2F1", "subject": "PUT", "reply_to": "$me",
              "body": {"durable": True}, "inferred": False}
    fields.update(kw)
    return bytes(Message(**fields).encode())


def test_request_fields():
    r = http.parse_request(_req())
    assert (r.method, r.segments, r.message_id, r.body) == ("PUT", ["queues", "q%2F1"], "m1",
                                                            {"durable": True})
    assert http.name_of(r.segments[1]) == "q/1"
    r = http.parse_request(_req(address="/bindings?src=x&dstq=q&key=", subject="GET",
                                body=None))
    assert r.segments == ["bindings"] and r.query == {"src": "x", "dstq": "q", "key": ""}


@pytest.mark.parametrize("kw", [{"subject": None}, {"address": None},
                                {"reply_to": "/queues/elsewhere"}, {"address": "queues/q"}])
def test_unusable_requests(kw):
    with pytest.raises(http.RequestError) as info:
        http.parse_request(_req(**kw))
    assert info.value.status == "400"


def test_garbage_and_oversized_requests():
    for data in (b"\x00\x53\x77\xff", b"garbage", b"\x00" * (http.MAX_REQUEST + 1)):
        with pytest.raises(http.RequestError):
            http.parse_request(data)


def test_response_message():
    m = Message()
    m.decode(http.encode_response("m1", "201", {"name": "q"}))
    assert (m.subject, m.correlation_id, m.body, m.properties) == (
        "201", "m1", {"name": "q"}, {"http:response": "1.1"})


def test_binding_segments_round_trip():
    loc = http.binding_location("x 1", "queue", "q/2", "a.*", {})
    assert loc == "/bindings/src=x%201;dstq=q%2F2;key=a.%2A;args="
    assert http.parse_binding_segment(loc.split("/")[2]) == ("x 1", "queue", "q/2", "a.*", "")
    hashed = http.args_hash({"x-match": "all"})
    assert hashed and hashed == http.args_hash({"x-match": "all"})
    seg = http.binding_location("x", "exchange", "y", "", {"x-match": "all"}).split("/")[2]
    assert http.parse_binding_segment(seg) == ("x", "exchange", "y", "", hashed)
    for bad in ("src=x;dstz=q;key=;args=", "src=;dstq=q;key=;args=", "nonsense",
                "src=x;dstq=q;key=k;args=+/"):
        with pytest.raises(http.RequestError):
            http.parse_binding_segment(bad)


def test_plain_arguments():
    from proton import symbol, ulong
    assert http.plain({symbol("x-max-length"): ulong(5), "s": symbol("v")}) == {
        "x-max-length": 5, "s": "v"}
    assert type(http.plain({"n": ulong(5)})["n"]) is int
    with pytest.raises(http.RequestError):
        http.plain({"x": object()})


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_requests_only_raise_request_error(data):
    try:
        http.parse_request(data)
    except http.RequestError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_any_binding_segment_parses_or_is_a_400(seg):
    try:
        http.parse_binding_segment(seg)
    except http.RequestError as exc:
        assert exc.status == "400"


def test_answers_carry_arguments_amqp10_cannot_encode_as_they_are():
    """A queue's or binding's arguments from 0-9-1 (decimal, timestamp) or from the HTTP API's
    JSON (an integer beyond 64 bits) are in GET answers: proton's encoder refused them and
    the client's connection ended."""
    import datetime
    import decimal

    from proton import timestamp, ulong

    from broker.amqp.fields import Long, Timestamp
    when = datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC)
    m = Message()
    m.decode(http.encode_response("m1", "200", {
        "arguments": {"x-d": decimal.Decimal("1.50"), "x-t": when, "x-big": 10 ** 30,
                      "x-nested": {"l": [decimal.Decimal("-2"), 1, None, b"\x00"]},
                      "x-0-9-1-t": Timestamp(7), "x-0-9-1-l": Long(-3)},
        "message_count": ulong(3)}))
    args = m.body["arguments"]
    assert args["x-d"] == "1.50" and args["x-big"] == str(10 ** 30)
    assert args["x-t"] == timestamp(int(when.timestamp() * 1000))
    assert args["x-nested"]["l"][:3] == ["-2", 1, None]
    assert args["x-0-9-1-t"] == timestamp(7000) and args["x-0-9-1-l"] == -3
    assert m.body["message_count"] == 3 and type(m.body["message_count"]) is ulong
