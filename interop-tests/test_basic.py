"""Basic class: publish/return, consume/cancel, get, ack/nack/reject, recover, qos."""
from __future__ import annotations

import struct

import pika
import pika.exceptions
import pytest
from helpers import (
    assert_channel_error,
    assert_connection_error,
    assert_empty,
    consume_n,
    drain,
    get_one,
    wait_for,
)

import rawamqp
from rawamqp import BASIC_CONSUME, BASIC_PUBLISH, body_frame, content_header, method_frame, shortstr, table


def _q(ch, **args):
    return ch.queue_declare("", exclusive=True, arguments=args or None).method.queue


def _fill(ch, q, n, prefix="m"):
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", q, f"{prefix}{i}".encode())


# ---------------------------------------------------------------- publish / return
def test_mandatory_unroutable_returns_312(conn, uid):
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda c, m, p, b: returned.append((m, p, b)))
    ch.basic_publish("amq.direct", uid, b"bounce", pika.BasicProperties(message_id="m1"), mandatory=True)
    wait_for(lambda: returned, conn=conn, msg="basic.return")
    m, p, b = returned[0]
    assert (m.reply_code, m.reply_text, m.exchange, m.routing_key) == (312, "NO_ROUTE", "amq.direct", uid)
    assert b == b"bounce" and p.message_id == "m1"


def test_mandatory_default_exchange_missing_queue(conn, uid):
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda c, m, p, b: returned.append(m))
    ch.basic_publish("", uid, b"x", mandatory=True)
    wait_for(lambda: returned, conn=conn, msg="basic.return")
    assert (returned[0].reply_code, returned[0].reply_text, returned[0].routing_key) == (312, "NO_ROUTE", uid)


def test_mandatory_routed_is_not_returned(conn):
    ch = conn.channel()
    q = _q(ch)
    returned = []
    ch.add_on_return_callback(lambda c, m, p, b: returned.append(m))
    ch.confirm_delivery()
    ch.basic_publish("", q, b"x", mandatory=True)
    conn.sleep(0.1)
    assert returned == []


def test_mandatory_return_with_confirms_raw(raw_conn):
    r = raw_conn
    r.confirm_select(1)
    r.publish(1, "", "itest-nowhere-raw", b"abc", mandatory=True)
    ch, cm, rd = r.read_method()
    assert cm == (60, 50)  # basic.return comes before the ack
    assert (rd.short(), rd.shortstr(), rd.shortstr(), rd.shortstr()) == (312, "NO_ROUTE", "", "itest-nowhere-raw")
    ftype, _, payload = r.read_frame()
    assert ftype == rawamqp.FRAME_HEADER and rawamqp.parse_basic_properties(payload)["_body_size"] == 3
    assert r.read_frame()[:3] == (rawamqp.FRAME_BODY, 1, b"abc")
    ch, cm, rd = r.read_method()
    assert cm == (60, 80)
    assert rd.longlong() == 1


def test_publish_immediate_not_implemented(raw_conn):
    raw_conn.send(method_frame(1, BASIC_PUBLISH, struct.pack(">H", 0) + shortstr("") + shortstr("x") + b"\x02")
                  + content_header(1, 1) + body_frame(1, b"x"))
    code, text, cid, mid = raw_conn.expect_connection_close()
    assert (code, text, cid, mid) == (540, "NOT_IMPLEMENTED - immediate=true", 60, 40)


def test_publish_empty_and_large_bodies(conn):
    ch = conn.channel()
    q = _q(ch)
    big = bytes(range(256)) * 4096  # 1 MiB, many frames
    ch.basic_publish("", q, b"")
    ch.basic_publish("", q, big)
    assert get_one(ch, q)[2] == b""
    assert get_one(ch, q)[2] == big


def test_properties_round_trip(conn):
    ch = conn.channel()
    q = _q(ch)
    props = pika.BasicProperties(
        content_type="application/json", content_encoding="utf-8",
        headers={"s": "str", "i": 42, "neg": -7, "big": 2**40, "f": True, "nested": {"a": [1, "b"]}},
        delivery_mode=2, priority=3, correlation_id="corr", reply_to="rt", expiration="60000",
        message_id="mid", timestamp=1700000000, type="t", user_id="guest", app_id="app")
    ch.basic_publish("", q, b"{}", props)
    m, p, b = get_one(ch, q)
    for attr in ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id",
                 "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id"):
        assert getattr(p, attr) == getattr(props, attr), attr
    assert p.headers == props.headers


def test_user_id_mismatch_refused(conn):
    ch = conn.channel()
    q = _q(ch)
    ch.basic_publish("", q, b"x", pika.BasicProperties(user_id="not-guest"))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.queue_declare(q, passive=True)
    assert ei.value.reply_code == 406
    assert ei.value.reply_text == "PRECONDITION_FAILED - user_id property set to 'not-guest' but authenticated user was 'guest'"


# ---------------------------------------------------------------- consume
def test_consume_server_generated_tag_raw(raw_conn):
    q, _, _ = raw_conn.queue_declare(1, "", exclusive=True)
    tag = raw_conn.basic_consume(1, q, "")
    assert tag.startswith("amq.ctag-") and len(tag) > len("amq.ctag-") + 10
    tag2 = raw_conn.basic_consume(1, q, "")
    assert tag2 != tag


def test_consume_duplicate_tag_is_connection_error(raw_conn):
    q, _, _ = raw_conn.queue_declare(1, "", exclusive=True)
    raw_conn.basic_consume(1, q, "dup-tag")
    raw_conn.send_method(1, BASIC_CONSUME, struct.pack(">H", 0) + shortstr(q) + shortstr("dup-tag") + b"\x00" + table({}))
    code, text, cid, mid = raw_conn.expect_connection_close()
    assert (code, text, cid, mid) == (530, "NOT_ALLOWED - attempt to reuse consumer tag 'dup-tag'", 60, 20)


def test_consume_missing_queue(ch, uid):
    assert_channel_error(404, f"NOT_FOUND - no queue '{uid}' in vhost '/'", ch.basic_consume, uid, lambda *a: None)


def test_consume_delivers_in_order_with_tags(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 5)
    got = consume_n(conn, ch, q, 5, auto_ack=False)
    assert [b for _, _, b in got] == [f"m{i}".encode() for i in range(5)]
    assert [m.delivery_tag for m, _, _ in got] == [1, 2, 3, 4, 5]
    assert all(not m.redelivered and m.exchange == "" and m.routing_key == q for m, _, _ in got)
    ch.basic_ack(5, multiple=True)


def test_exclusive_consumer_blocks_second(conn):
    ch = conn.channel()
    q = _q(ch)
    ch.basic_consume(q, lambda *a: None, exclusive=True)
    ch2 = conn.channel()
    assert_channel_error(403, f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use",
                         ch2.basic_consume, q, lambda *a: None)


def test_exclusive_consume_when_consumer_exists(conn):
    ch = conn.channel()
    q = _q(ch)
    ch.basic_consume(q, lambda *a: None)
    ch2 = conn.channel()
    assert_channel_error(403, f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use",
                         ch2.basic_consume, q, lambda *a: None, exclusive=True)


def test_no_ack_consume(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 3)
    got = consume_n(conn, ch, q, 3, auto_ack=True)
    assert len(got) == 3
    ch.close()
    ch = conn.channel()
    assert_empty(ch, q)  # nothing to redeliver: messages were auto-acked


def test_unacked_requeued_on_channel_close(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 2)
    consume_n(conn, ch, q, 2, auto_ack=False)
    ch.close()
    ch = conn.channel()
    m, _, b = get_one(ch, q)
    assert b == b"m0" and m.redelivered


def test_cancel_stops_delivery(conn):
    ch = conn.channel()
    q = _q(ch)
    got = []
    tag = ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
    ch.basic_publish("", q, b"1")
    wait_for(lambda: got, conn=conn)
    ch.basic_cancel(tag)
    ch.basic_publish("", q, b"2")
    conn.sleep(0.2)
    assert got == [b"1"]
    assert get_one(ch, q)[2] == b"2"


def test_cancel_unknown_tag_is_ok_raw(raw_conn):
    raw_conn.send_method(1, (60, 30), shortstr("no-such-tag") + b"\x00")
    r = raw_conn.expect((60, 31), 1)
    assert r.shortstr() == "no-such-tag"


def test_broker_cancel_on_queue_delete_pika(conn, cleanup, uid):
    ch = conn.channel()
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume(q, lambda *a: None)
    conn.channel().queue_delete(q)
    wait_for(lambda: cancelled, conn=conn, msg="broker basic.cancel")
    assert cancelled == [tag]


def test_broker_cancel_on_queue_delete_raw(raw_conn, uid):
    r = raw_conn
    r.queue_declare(1, uid, exclusive=True)
    r.basic_consume(1, uid, "my-tag")
    r.channel_open(2)
    r.send_method(2, (50, 40), struct.pack(">H", 0) + shortstr(uid) + b"\x00")
    seen = {}
    while len(seen) < 2:
        ch, cm, rd = r.read_method()
        if cm == (60, 30):
            seen["cancel"] = (ch, rd.shortstr(), rd.octet())
        elif cm == (50, 41):
            seen["delete-ok"] = ch
    assert seen["cancel"] == (1, "my-tag", 1)  # nowait=true


def test_queue_delete_on_consuming_channel_sends_delete_ok_then_cancel(raw_conn, uid):
    """RabbitMQ answers queue.delete-ok first, then notifies its own consumer with basic.cancel
    (py-amqp/kombu rely on this order: a cancel before delete-ok raises ConsumerCancelled)."""
    r = raw_conn
    r.queue_declare(1, uid, exclusive=True)
    r.basic_consume(1, uid, "own-tag")
    r.send_method(1, (50, 40), struct.pack(">H", 0) + shortstr(uid) + b"\x00")
    ch, cm, rd = r.read_method()
    assert (ch, cm) == (1, (50, 41))
    ch, cm, rd = r.read_method()
    assert (ch, cm) == (1, (60, 30))
    assert rd.shortstr() == "own-tag"


def test_no_broker_cancel_without_client_capability(raw_socket, uid):
    """RabbitMQ only sends basic.cancel to clients advertising consumer_cancel_notify."""
    r = raw_socket()
    r.start()
    r.start_ok(client_properties={"product": "old-client", "capabilities": {}})
    r.read_tune()
    r.tune_ok()
    r.open()
    r.expect(rawamqp.CONNECTION_OPEN_OK, 0)
    r.channel_open(1)
    r.queue_declare(1, uid, exclusive=True)
    r.basic_consume(1, uid, "tag")
    r.send_method(1, (50, 40), struct.pack(">H", 0) + shortstr(uid) + b"\x00")
    ch, cm, rd = r.read_method()
    assert cm == (50, 41)
    with pytest.raises(TimeoutError):
        r.read_method(timeout=0.5)


def test_consumer_priority_x_priority(conn):
    ch = conn.channel()
    q = _q(ch)
    got = {"low": [], "high": []}
    ch.basic_consume(q, lambda c, m, p, b: got["low"].append(b), auto_ack=True, arguments={"x-priority": 1})
    ch.basic_consume(q, lambda c, m, p, b: got["high"].append(b), auto_ack=True, arguments={"x-priority": 10})
    for i in range(6):
        ch.basic_publish("", q, str(i).encode())
    wait_for(lambda: len(got["low"]) + len(got["high"]) == 6, conn=conn)
    assert len(got["high"]) == 6 and got["low"] == []


def test_consumer_priority_falls_back_when_high_is_blocked(conn):
    ch = conn.channel()
    q = _q(ch)
    ch.basic_qos(prefetch_count=1)
    got = {"low": [], "high": []}
    ch.basic_consume(q, lambda c, m, p, b: got["low"].append(m), auto_ack=False, arguments={"x-priority": -5})
    ch.basic_consume(q, lambda c, m, p, b: got["high"].append(m), auto_ack=False, arguments={"x-priority": 5})
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    wait_for(lambda: len(got["low"]) + len(got["high"]) == 2, conn=conn)
    conn.sleep(0.2)
    assert len(got["high"]) == 1 and len(got["low"]) == 1


def test_round_robin_between_equal_consumers(conn):
    ch = conn.channel()
    q = _q(ch)
    got = {"a": [], "b": []}
    ch.basic_consume(q, lambda c, m, p, b: got["a"].append(b), auto_ack=True)
    ch.basic_consume(q, lambda c, m, p, b: got["b"].append(b), auto_ack=True)
    for i in range(10):
        ch.basic_publish("", q, str(i).encode())
    wait_for(lambda: len(got["a"]) + len(got["b"]) == 10, conn=conn)
    assert len(got["a"]) == 5 and len(got["b"]) == 5


# ---------------------------------------------------------------- get
def test_get_and_get_empty(ch):
    q = _q(ch)
    m, p, b = ch.basic_get(q, auto_ack=True)
    assert m is None  # get-empty
    _fill(ch, q, 3)
    m, p, b = ch.basic_get(q, auto_ack=True)
    assert b == b"m0" and m.message_count == 2 and not m.redelivered
    assert (m.exchange, m.routing_key) == ("", q)


def test_get_empty_raw(raw_conn):
    q, _, _ = raw_conn.queue_declare(1, "", exclusive=True)
    raw_conn.send_method(1, rawamqp.BASIC_GET, struct.pack(">H", 0) + shortstr(q) + b"\x01")
    r = raw_conn.expect(rawamqp.BASIC_GET_EMPTY, 1)
    assert r.shortstr() == ""  # cluster-id, always empty


# ---------------------------------------------------------------- ack / nack / reject
def test_ack_single_and_multiple(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 5)
    tags = [get_one(ch, q, auto_ack=False)[0].delivery_tag for _ in range(5)]
    assert tags == [1, 2, 3, 4, 5]
    ch.basic_ack(2)
    ch.basic_ack(4, multiple=True)  # acks 1, 3, 4
    ch.close()
    ch = conn.channel()
    assert [b for _, _, b in drain(ch, q)] == [b"m4"]


def test_ack_zero_multiple_acks_all(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 3)
    for _ in range(3):
        get_one(ch, q, auto_ack=False)
    ch.basic_ack(0, multiple=True)
    ch.close()
    ch = conn.channel()
    assert_empty(ch, q)


def test_ack_unknown_tag_406(conn):
    ch = conn.channel()
    _q(ch)
    ch.basic_ack(7)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.queue_declare("", exclusive=True)
    assert (ei.value.reply_code, ei.value.reply_text) == (406, "PRECONDITION_FAILED - unknown delivery tag 7")


def test_double_ack_406(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 1)
    m, _, _ = get_one(ch, q, auto_ack=False)
    ch.basic_ack(m.delivery_tag)
    ch.basic_ack(m.delivery_tag)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.queue_declare(q, passive=True)
    assert (ei.value.reply_code, ei.value.reply_text) == (406, f"PRECONDITION_FAILED - unknown delivery tag {m.delivery_tag}")


def test_ack_of_autoacked_message_406(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 1)
    m, _, _ = get_one(ch, q, auto_ack=True)
    ch.basic_ack(m.delivery_tag)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.queue_declare(q, passive=True)
    assert (ei.value.reply_code, ei.value.reply_text) == (406, "PRECONDITION_FAILED - unknown delivery tag 1")


def test_ack_on_other_channel_406(conn):
    ch1 = conn.channel()
    q = _q(ch1)
    _fill(ch1, q, 1)
    m, _, _ = get_one(ch1, q, auto_ack=False)
    ch2 = conn.channel()
    ch2.basic_ack(m.delivery_tag)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch2.queue_declare(q, passive=True)
    assert ei.value.reply_code == 406
    assert ch1.is_open


def test_reject_requeue_sets_redelivered(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 1)
    m, _, _ = get_one(ch, q, auto_ack=False)
    assert not m.redelivered
    ch.basic_reject(m.delivery_tag, requeue=True)
    m2, _, b = get_one(ch, q, auto_ack=False)
    assert b == b"m0" and m2.redelivered and m2.delivery_tag == 2


def test_reject_no_requeue_discards(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 1)
    m, _, _ = get_one(ch, q, auto_ack=False)
    ch.basic_reject(m.delivery_tag, requeue=False)
    assert_empty(ch, q)


def test_nack_multiple_requeue(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 4)
    for _ in range(4):
        get_one(ch, q, auto_ack=False)
    ch.basic_nack(3, multiple=True, requeue=True)  # 1..3 back, 4 still unacked
    got = drain(ch, q, auto_ack=True)
    assert [(b, m.redelivered) for m, _, b in got] == [(b"m0", True), (b"m1", True), (b"m2", True)]
    ch.basic_nack(4, multiple=False, requeue=False)
    assert_empty(ch, q)


def test_requeued_messages_keep_original_position(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 4)  # m0..m3
    m0 = get_one(ch, q, auto_ack=False)[0]
    m1 = get_one(ch, q, auto_ack=False)[0]
    ch.basic_reject(m1.delivery_tag, requeue=True)
    ch.basic_reject(m0.delivery_tag, requeue=True)
    got = drain(ch, q, auto_ack=True)
    assert [(b, m.redelivered) for m, _, b in got] == [
        (b"m0", True), (b"m1", True), (b"m2", False), (b"m3", False)]


def test_requeue_on_consumer_with_nack(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 2)
    seen = []

    def cb(c, m, p, b):
        seen.append((b, m.redelivered))
        if not m.redelivered:
            c.basic_nack(m.delivery_tag, requeue=True)
        else:
            c.basic_ack(m.delivery_tag)

    ch.basic_consume(q, cb)
    wait_for(lambda: sum(1 for s in seen if s[1]) == 2, conn=conn)
    assert (b"m0", False) in seen and (b"m0", True) in seen and (b"m1", True) in seen


def test_recover_requeue_true(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 2)
    get_one(ch, q, auto_ack=False)
    get_one(ch, q, auto_ack=False)
    ch.basic_recover(requeue=True)
    got = drain(ch, q)
    assert [(b, m.redelivered) for m, _, b in got] == [(b"m0", True), (b"m1", True)]


def test_recover_requeue_false_not_implemented(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 1)
    get_one(ch, q, auto_ack=False)
    assert_connection_error(540, "NOT_IMPLEMENTED - requeue=false", ch.basic_recover, requeue=False)


def test_recover_redelivers_to_consumer(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 1)
    seen = []
    ch.basic_consume(q, lambda c, m, p, b: seen.append((b, m.redelivered)), auto_ack=False)
    wait_for(lambda: len(seen) == 1, conn=conn)
    ch.basic_recover(requeue=True)
    wait_for(lambda: len(seen) == 2, conn=conn)
    assert seen == [(b"m0", False), (b"m0", True)]


# ---------------------------------------------------------------- qos
def _collect_unacked(conn, ch, q, n_consumers, expected_total, settle=0.4):
    """Start consumers; wait until expected_total deliveries, then settle to catch extra ones."""
    got = [[] for _ in range(n_consumers)]
    for i in range(n_consumers):
        ch.basic_consume(q, lambda c, m, p, b, i=i: got[i].append(m), auto_ack=False)
    wait_for(lambda: sum(map(len, got)) >= expected_total, conn=conn, msg=f"{expected_total} deliveries")
    conn.sleep(settle)
    return got


def test_qos_prefetch_per_consumer(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 10)
    ch.basic_qos(prefetch_count=2)  # global=false: per consumer (RabbitMQ semantics)
    got = _collect_unacked(conn, ch, q, 2, 4)
    assert [len(g) for g in got] == [2, 2]
    ch.basic_ack(got[0][-1].delivery_tag)  # frees one slot of consumer 0
    wait_for(lambda: len(got[0]) == 3, conn=conn)
    conn.sleep(0.2)
    assert [len(g) for g in got] == [3, 2]


def test_qos_prefetch_global_is_per_channel(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 10)
    ch.basic_qos(prefetch_count=3, global_qos=True)  # shared by all consumers on the channel
    got = _collect_unacked(conn, ch, q, 2, 3)
    assert sum(map(len, got)) == 3


def test_qos_zero_is_unlimited(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 20)
    ch.basic_qos(prefetch_count=0)
    got = _collect_unacked(conn, ch, q, 1, 20)
    assert len(got[0]) == 20


def test_qos_does_not_limit_get(conn):
    ch = conn.channel()
    q = _q(ch)
    _fill(ch, q, 3)
    ch.basic_qos(prefetch_count=1)
    for _ in range(3):
        get_one(ch, q, auto_ack=False)


def test_server_generated_consumer_tag_format(raw_conn):
    import re
    q, _, _ = raw_conn.queue_declare(1, "", exclusive=True)
    for _ in range(3):
        tag = raw_conn.basic_consume(1, q, "")
        assert re.fullmatch(r"amq\.ctag-[A-Za-z0-9_-]{22}", tag), tag


def test_no_local_is_ignored(raw_conn):
    """RabbitMQ ignores basic.consume no-local: a connection receives its own publishes."""
    q, _, _ = raw_conn.queue_declare(1, "", exclusive=True)
    raw_conn.send_method(1, BASIC_CONSUME, struct.pack(">H", 0) + shortstr(q) + shortstr("nl") + b"\x03" + table({}))
    raw_conn.expect(rawamqp.BASIC_CONSUME_OK, 1)
    raw_conn.publish(1, "", q, b"self")
    ch, cm, rd = raw_conn.read_method()
    assert cm == rawamqp.BASIC_DELIVER
    assert rd.shortstr() == "nl"


def test_deliveries_respect_negotiated_frame_max(raw_socket, connect):
    """With frame_max 4096 every frame the server sends has a payload of at most 4088 bytes."""
    r = raw_socket()
    r.handshake(frame_max=4096)
    r.channel_open(1)
    q, _, _ = r.queue_declare(1, "", exclusive=True)
    r.basic_consume(1, q, "fm", no_ack=True)
    body = bytes(range(256)) * 40  # 10240 bytes
    pub = connect().channel()
    pub.basic_publish("", q, body, pika.BasicProperties(headers={"h": "x" * 100}))
    ch, cm, rd = r.read_method()
    assert cm == rawamqp.BASIC_DELIVER
    ftype, _, payload = r.read_frame()
    assert ftype == rawamqp.FRAME_HEADER
    assert rawamqp.parse_basic_properties(payload)["_body_size"] == len(body)
    got = b""
    sizes = []
    while len(got) < len(body):
        ftype, _, payload = r.read_frame()
        assert ftype == rawamqp.FRAME_BODY
        sizes.append(len(payload))
        got += payload
    assert got == body
    assert max(sizes) <= 4096 - 8, sizes
    assert sizes == [4088, 4088, 2064]
