"""Channel class and the error model (channel vs connection errors, reply codes)."""
from __future__ import annotations

import struct

import pika
import pika.exceptions
import pytest
from helpers import assert_channel_error, assert_connection_error, get_one

import rawamqp
from rawamqp import (
    BASIC_QOS,
    CHANNEL_CLOSE,
    CHANNEL_CLOSE_OK,
    CHANNEL_FLOW,
    CHANNEL_FLOW_OK,
    CHANNEL_OPEN,
    EXCHANGE_DECLARE,
    QUEUE_DECLARE,
    content_header,
    shortstr,
    table,
)


def test_channel_open_close_raw(raw_socket):
    r = raw_socket()
    r.handshake()
    r.channel_open(1)
    r.send_method(1, CHANNEL_CLOSE, struct.pack(">H", 200) + shortstr("bye") + struct.pack(">HH", 0, 0))
    r.expect(CHANNEL_CLOSE_OK, 1)
    # the channel number can be reused afterwards
    r.channel_open(1)
    r.queue_declare(1, "", exclusive=True)


def test_channel_flow_active_true(raw_conn):
    raw_conn.send_method(1, CHANNEL_FLOW, b"\x01")
    r = raw_conn.expect(CHANNEL_FLOW_OK, 1)
    assert r.octet() == 1


def test_channel_flow_active_false_not_implemented(raw_conn):
    # RabbitMQ 3.x does not support client-initiated flow stop: connection error 540
    raw_conn.send_method(1, CHANNEL_FLOW, b"\x00")
    code, text, cid, mid = raw_conn.expect_connection_close()
    assert (code, text, cid, mid) == (540, "NOT_IMPLEMENTED - active=false", 20, 20)


def test_many_channels_per_connection(conn):
    chans = [conn.channel() for _ in range(64)]
    numbers = {c.channel_number for c in chans}
    assert len(numbers) == 64
    q = chans[0].queue_declare("", exclusive=True).method.queue
    for i, c in enumerate(chans):
        c.basic_publish("", q, str(i).encode())
    from helpers import wait_for
    wait_for(lambda: chans[0].queue_declare(q, passive=True).method.message_count == 64, conn=conn,
             msg="64 messages")
    bodies = set()
    for c in chans:
        m, p, b = c.basic_get(q, auto_ack=True)
        bodies.add(int(b))
    assert bodies == set(range(64))
    for c in chans[::2]:
        c.close()
    for c in chans[1::2]:
        assert c.is_open
        c.queue_declare(q, passive=True)


def test_channel_error_closes_only_that_channel(conn, uid):
    ch1 = conn.channel()
    ch2 = conn.channel()
    q = ch2.queue_declare("", exclusive=True).method.queue
    assert_channel_error(404, f"NOT_FOUND - no queue '{uid}' in vhost '/'",
                         ch1.queue_declare, uid, passive=True)
    assert ch1.is_closed
    assert ch2.is_open and conn.is_open
    ch2.basic_publish("", q, b"ok")
    assert get_one(ch2, q)[2] == b"ok"
    ch3 = conn.channel()
    ch3.queue_declare(q, passive=True)


def test_channel_error_raw_then_other_channel_ok(raw_socket):
    r = raw_socket()
    r.handshake()
    r.channel_open(1)
    r.channel_open(2)
    r.send_method(1, QUEUE_DECLARE, struct.pack(">H", 0) + shortstr("itest-missing-q-raw") + b"\x01" + table({}))
    channel, code, text, cid, mid = r.expect_channel_close()
    assert (channel, code, cid, mid) == (1, 404, 50, 10)
    assert text == "NOT_FOUND - no queue 'itest-missing-q-raw' in vhost '/'"
    q, _, _ = r.queue_declare(2, "", exclusive=True)
    assert q.startswith("amq.gen-")


def test_connection_error_closes_whole_connection(conn):
    ch1 = conn.channel()
    ch2 = conn.channel()
    assert_connection_error(540, "NOT_IMPLEMENTED - prefetch_size!=0 (1)",
                            ch1.basic_qos, prefetch_size=1, prefetch_count=0)
    assert conn.is_closed
    assert ch2.is_closed


# -------------------------------------------------------------- reply codes
def test_403_access_refused_reserved_exchange_name(ch):
    assert_channel_error(403, "ACCESS_REFUSED - exchange name 'amq.itest-x' contains reserved prefix 'amq.*'",
                         ch.exchange_declare, "amq.itest-x", "direct")


def test_403_access_refused_reserved_queue_name(ch):
    assert_channel_error(403, "ACCESS_REFUSED - queue name 'amq.itest-q' contains reserved prefix 'amq.*'",
                         ch.queue_declare, "amq.itest-q")


def test_404_not_found_queue(ch, uid):
    assert_channel_error(404, f"NOT_FOUND - no queue '{uid}' in vhost '/'", ch.queue_declare, uid, passive=True)


def test_404_not_found_exchange_on_publish_via_confirm(ch, uid):
    # publishing to a missing exchange is a channel error 404 (asynchronous)
    ch.basic_publish(uid, "rk", b"x")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.queue_declare("", exclusive=True)  # synchronous round trip surfaces the error
    assert ei.value.reply_code == 404
    assert ei.value.reply_text == f"NOT_FOUND - no exchange '{uid}' in vhost '/'"


def test_405_resource_locked_exclusive_queue(connect, uid):
    c1 = connect()
    c2 = connect()
    ch1 = c1.channel()
    ch1.queue_declare(uid, exclusive=True)
    ch2 = c2.channel()
    text = assert_channel_error(405, f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{uid}' in vhost '/'",
                                ch2.queue_declare, uid)
    assert "declared on another connection" in text


def test_406_precondition_failed_inequivalent(ch, uid):
    ch.queue_declare(uid, exclusive=True)
    assert_channel_error(
        406, f"PRECONDITION_FAILED - inequivalent arg 'auto_delete' for queue '{uid}' in vhost '/': "
             "received 'true' but current is 'false'",
        ch.queue_declare, uid, exclusive=True, auto_delete=True)


def test_406_unknown_delivery_tag(raw_conn):
    raw_conn.send_method(1, rawamqp.BASIC_ACK, struct.pack(">QB", 42, 0))
    channel, code, text, cid, mid = raw_conn.expect_channel_close()
    assert (channel, code, text, cid, mid) == (1, 406, "PRECONDITION_FAILED - unknown delivery tag 42", 60, 80)


def test_501_frame_error_bad_frame_end(raw_socket, assert_broker_alive):
    r = raw_socket()
    r.handshake()
    r.send(rawamqp.frame(1, 0, rawamqp.method_payload(CHANNEL_OPEN, shortstr("")), end=b"\x00"))
    code, text, cid, mid = r.expect_connection_close()
    assert code == 501
    assert text.startswith("FRAME_ERROR - type 1, all octets = <<0,20,0,10,0>>: {invalid_frame_end_marker,0}")
    r.read_until_closed(5)
    assert_broker_alive()


def test_502_syntax_errors_are_reported_as_501_frame_error(raw_conn):
    """RabbitMQ 3.x never sends 502 SYNTAX_ERROR: undecodable method arguments are 501 FRAME_ERROR."""
    args = struct.pack(">H", 0) + b"\xff" + b"abc"  # shortstr length beyond the payload
    raw_conn.send_method(1, QUEUE_DECLARE, args)
    code, text, cid, mid = raw_conn.expect_connection_close()
    assert (code, text, cid, mid) == (501, "FRAME_ERROR - cannot decode <<0,0,255,97,98,99>>", 50, 10)


@pytest.mark.parametrize("args,text", [
    (struct.pack(">H", 0) + shortstr("") + b"\x08" + table({}) + b"junkjunk",
     "FRAME_ERROR - cannot decode <<0,0,0,8,0,0,0,0,106,117,110,107,106,117,110,107>>"),
    (struct.pack(">H", 0) + shortstr("q") + b"\x00" + struct.pack(">I", 100) + b"\x01a",
     "FRAME_ERROR - cannot decode <<0,0,1,113,0,0,0,0,100,1,97>>"),
], ids=["trailing-bytes", "table-length-overflow"])
def test_501_undecodable_arguments(raw_conn, args, text):
    raw_conn.send_method(1, QUEUE_DECLARE, args)
    code, got_text, cid, mid = raw_conn.expect_connection_close()
    assert (code, got_text, cid, mid) == (501, text, 50, 10)


def test_501_malformed_utf8_shortstr(raw_conn):
    raw_conn.send_method(1, QUEUE_DECLARE, struct.pack(">H", 0) + shortstr(b"\xff\xfe") + b"\x08" + table({}))
    code, text, cid, mid = raw_conn.expect_connection_close()
    assert (code, text) == (501, "FRAME_ERROR - Malformed UTF-8 in shortstr")


def test_publish_routing_key_not_utf8_is_accepted_and_returned_as_sent(raw_conn):
    """basic.publish is the one method whose shortstr RabbitMQ does not check for UTF-8: an
    unroutable mandatory publish comes back with the very bytes of its routing key."""
    raw_conn.publish(1, "amq.direct", b"k\xff\xfe", b"x", mandatory=True)
    ch, cm, r = raw_conn.read_method()
    assert cm == (60, 50)
    assert (r.short(), r.take(r.octet()), r.take(r.octet()), r.take(r.octet())) == (
        312, b"NO_ROUTE", b"amq.direct", b"k\xff\xfe")


def test_503_command_invalid_unknown_exchange_type(raw_conn, uid):
    # A type name no broker has seen: RabbitMQ says "invalid exchange type" instead when the
    # name happens to be an atom its VM already knows (e.g. 'bogus' once plugins are loaded).
    xtype = f"bogus-{uid}"
    raw_conn.send_method(1, EXCHANGE_DECLARE, struct.pack(">H", 0) + shortstr(uid) + shortstr(xtype)
                         + b"\x00" + table({}))
    code, text, cid, mid = raw_conn.expect_connection_close()
    assert (code, text, cid, mid) == (503, f"COMMAND_INVALID - unknown exchange type '{xtype}'", 40, 10)


def test_503_unknown_exchange_type_pika(conn, uid):
    ch = conn.channel()
    assert_connection_error(503, "COMMAND_INVALID - unknown exchange type 'x-itest-bogus'",
                            ch.exchange_declare, uid, "x-itest-bogus")


def test_504_channel_error_method_on_unopened_channel(raw_socket):
    r = raw_socket()
    r.handshake()
    r.send_method(5, QUEUE_DECLARE, struct.pack(">H", 0) + shortstr("") + b"\x00" + table({}))
    code, text, cid, mid = r.expect_connection_close()
    assert (code, text, cid, mid) == (504, "CHANNEL_ERROR - expected 'channel.open'", 50, 10)


def test_504_second_channel_open(raw_conn):
    raw_conn.send_method(1, CHANNEL_OPEN, shortstr(""))
    code, text, cid, mid = raw_conn.expect_connection_close()
    assert (code, text, cid, mid) == (504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)


def test_504_channel_method_on_channel_zero(raw_socket):
    r = raw_socket()
    r.handshake()
    r.send_method(0, QUEUE_DECLARE, struct.pack(">H", 0) + shortstr("") + b"\x00" + table({}))
    code, text, cid, mid = r.expect_connection_close()
    assert (code, text, cid, mid) == (504, "CHANNEL_ERROR - unexpected method in connection state running", 50, 10)


def test_505_content_header_without_method(raw_conn):
    raw_conn.send(content_header(1, 5))
    code, text, cid, mid = raw_conn.expect_connection_close()
    assert (code, text) == (505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead")


def test_505_body_without_method(raw_conn):
    raw_conn.send(rawamqp.body_frame(1, b"abc"))
    code, text, cid, mid = raw_conn.expect_connection_close()
    assert (code, text) == (505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead")


def test_505_heartbeat_on_non_zero_channel(raw_conn):
    raw_conn.send(rawamqp.frame(rawamqp.FRAME_HEARTBEAT, 1, b""))
    code, text, cid, mid = raw_conn.expect_connection_close()
    assert (code, text) == (505, "UNEXPECTED_FRAME - type 8, all octets = <<>>")


def test_530_not_allowed_vhost(raw_socket):
    r = raw_socket()
    r.start()
    r.start_ok()
    r.read_tune()
    r.tune_ok()
    r.open("itest-missing-vhost")
    code, text, cid, mid = r.expect_connection_close()
    assert (code, text, cid, mid) == (530, "NOT_ALLOWED - vhost itest-missing-vhost not found", 10, 40)


def test_540_not_implemented_prefetch_size(raw_conn):
    raw_conn.send_method(1, BASIC_QOS, struct.pack(">IHB", 10, 0, 0))
    code, text, cid, mid = raw_conn.expect_connection_close()
    assert (code, text, cid, mid) == (540, "NOT_IMPLEMENTED - prefetch_size!=0 (10)", 60, 10)


@pytest.mark.skip(reason="541 INTERNAL_ERROR has no client-side trigger on a healthy RabbitMQ")
def test_541_internal_error():
    pass


def test_406_tx_commit_without_select(ch):
    assert_channel_error(406, "PRECONDITION_FAILED - channel is not transactional", ch.tx_commit)


def test_406_confirm_after_tx(ch):
    ch.tx_select()
    assert_channel_error(406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode", ch.confirm_delivery)


def test_406_tx_after_confirm(ch):
    ch.confirm_delivery()
    assert_channel_error(406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode", ch.tx_select)
