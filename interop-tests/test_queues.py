"""Queue class: declare/passive/durable/exclusive/auto-delete, bind, purge, delete."""
from __future__ import annotations

import pika
import pika.exceptions
from helpers import assert_channel_error, assert_empty, get_one, wait_for


def test_server_named_queue(ch):
    ok = ch.queue_declare("", exclusive=True)
    assert ok.method.queue.startswith("amq.gen-")
    assert len(ok.method.queue) > len("amq.gen-") + 10
    assert ok.method.message_count == 0 and ok.method.consumer_count == 0
    ok2 = ch.queue_declare("", exclusive=True)
    assert ok2.method.queue != ok.method.queue


def test_declare_ok_counts(ch, uid):
    q = ch.queue_declare(uid, exclusive=True).method.queue
    for _i in range(3):
        ch.basic_publish("", q, b"x")
    wait_for(lambda: ch.queue_declare(q, passive=True).method.message_count == 3, conn=ch.connection)
    ch.basic_consume(q, lambda *a: None, auto_ack=False)
    ok = ch.queue_declare(q, passive=True)
    assert ok.method.consumer_count == 1
    # ready messages that were delivered to the consumer are no longer counted
    wait_for(lambda: ch.queue_declare(q, passive=True).method.message_count == 0, conn=ch.connection)


def test_passive_missing_queue(ch, uid):
    assert_channel_error(404, f"NOT_FOUND - no queue '{uid}' in vhost '/'", ch.queue_declare, uid, passive=True)


def test_passive_ignores_other_flags(ch, uid):
    ch.queue_declare(uid, exclusive=True)
    ch.queue_declare(uid, passive=True, durable=True, auto_delete=True)


def test_durable_queue_equivalence(conn, cleanup, uid):
    ch = conn.channel()
    q = cleanup.queue(uid)
    ch.queue_declare(q, durable=True)
    ch.queue_declare(q, durable=True)
    assert_channel_error(
        406, f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue '{uid}' in vhost '/': "
             "received 'false' but current is 'true'",
        ch.queue_declare, q, durable=False)
    ch = conn.channel()
    assert_channel_error(
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{uid}' in vhost '/': "
             "received the value '5' of type 'signedint' but current is none",
        ch.queue_declare, q, durable=True, arguments={"x-max-length": 5})


def test_argument_equivalence(conn, cleanup, uid):
    ch = conn.channel()
    q = cleanup.queue(uid)
    ch.queue_declare(q, arguments={"x-message-ttl": 1000})
    ch.queue_declare(q, arguments={"x-message-ttl": 1000})
    assert_channel_error(
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '{uid}' in vhost '/': "
             "received '2000' but current is '1000'",
        ch.queue_declare, q, arguments={"x-message-ttl": 2000})
    ch = conn.channel()
    assert_channel_error(
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '{uid}' in vhost '/': "
             "received none but current is the value '1000' of type 'signedint'",
        ch.queue_declare, q)


def test_exclusive_queue_locked_for_other_connection(connect, uid):
    c1, c2 = connect(), connect()
    ch1, ch2 = c1.channel(), c2.channel()
    ch1.queue_declare(uid, exclusive=True)
    prefix = f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{uid}' in vhost '/'"
    assert_channel_error(405, prefix, ch2.queue_declare, uid, passive=True)
    ch2 = c2.channel()
    assert_channel_error(405, prefix, ch2.basic_consume, uid, lambda *a: None)
    ch2 = c2.channel()
    assert_channel_error(405, prefix, ch2.queue_delete, uid)
    ch2 = c2.channel()
    assert_channel_error(405, prefix, ch2.queue_purge, uid)
    ch2 = c2.channel()
    assert_channel_error(405, prefix, ch2.queue_bind, uid, "amq.fanout")
    ch2 = c2.channel()
    assert_channel_error(405, prefix, ch2.basic_get, uid)
    # publishing to it from another connection is allowed
    ch2 = c2.channel()
    ch2.basic_publish("", uid, b"from-c2")
    assert get_one(ch1, uid)[2] == b"from-c2"


def test_exclusive_queue_deleted_when_connection_closes(connect, uid):
    c1, c2 = connect(), connect()
    c1.channel().queue_declare(uid, exclusive=True)
    c1.close()
    c2.channel()

    def gone():
        try:
            c2.channel().queue_declare(uid, passive=True)
            return False
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code == 404
            return True

    wait_for(gone, conn=c2, msg="exclusive queue deletion")


def test_exclusive_queue_durable_flag_not_checked(ch, uid):
    # RabbitMQ 3.x skips the 'durable' equivalence check for exclusive queues
    ch.queue_declare(uid, exclusive=True, durable=True)
    ch.queue_declare(uid, exclusive=True, durable=False)


def test_exclusive_queue_survives_channel_close(conn, uid):
    ch1 = conn.channel()
    ch1.queue_declare(uid, exclusive=True)
    ch1.close()
    conn.channel().queue_declare(uid, passive=True)


def test_auto_delete_queue_deleted_when_last_consumer_cancels(conn, cleanup, uid):
    ch = conn.channel()
    q = cleanup.queue(uid)
    ch.queue_declare(q, auto_delete=True)
    t1 = ch.basic_consume(q, lambda *a: None)
    t2 = ch.basic_consume(q, lambda *a: None)
    ch.basic_cancel(t1)
    ch.queue_declare(q, passive=True)  # one consumer left
    ch.basic_cancel(t2)

    def gone():
        try:
            conn.channel().queue_declare(q, passive=True)
            return False
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code == 404
            return True

    wait_for(gone, conn=conn, msg="auto-delete queue deletion")


def test_auto_delete_queue_without_consumers_stays(ch, cleanup, uid):
    q = cleanup.queue(uid)
    ch.queue_declare(q, auto_delete=True)
    ch.connection.sleep(0.2)
    ch.queue_declare(q, passive=True)


def test_auto_delete_queue_deleted_when_consumer_channel_closes(connect, cleanup, uid):
    c1 = connect()
    q = cleanup.queue(uid)
    ch = c1.channel()
    ch.queue_declare(q, auto_delete=True)
    ch.basic_consume(q, lambda *a: None)
    ch.close()
    c2 = connect()

    def gone():
        try:
            c2.channel().queue_declare(q, passive=True)
            return False
        except pika.exceptions.ChannelClosedByBroker as e:
            return e.reply_code == 404

    wait_for(gone, conn=c2, msg="auto-delete queue deletion")


def test_bind_unbind(ch, cleanup, uid):
    ex = cleanup.exchange(uid)
    ch.exchange_declare(ex, "direct")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, ex, "k1")
    ch.queue_bind(q, ex, "k1")  # idempotent
    ch.basic_publish(ex, "k1", b"one")
    assert get_one(ch, q)[2] == b"one"
    assert_empty(ch, q)
    ch.queue_unbind(q, ex, "k1")
    ch.basic_publish(ex, "k1", b"two")
    assert_empty(ch, q)


def test_bind_without_routing_key_uses_queue_name(ch, cleanup, uid):
    # pika sends routing_key=None as ""; AMQP says empty key + direct = bind by ""
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.direct", "")
    ch.basic_publish("amq.direct", "", b"empty-key")
    assert get_one(ch, q)[2] == b"empty-key"


def test_purge_returns_count(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.confirm_delivery()
    for _i in range(7):
        ch.basic_publish("", q, b"p")
    ok = ch.queue_purge(q)
    assert ok.method.message_count == 7
    assert_empty(ch, q)
    assert ch.queue_purge(q).method.message_count == 0


def test_purge_does_not_touch_unacked(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    m, _, _ = ch.basic_get(q, auto_ack=False)
    assert ch.queue_purge(q).method.message_count == 2
    ch.basic_nack(m.delivery_tag, requeue=True)
    m2, _, b = get_one(ch, q)
    assert b == b"0" and m2.redelivered


def test_delete_returns_message_count(ch, cleanup, uid):
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    ch.confirm_delivery()
    for _i in range(4):
        ch.basic_publish("", q, b"d")
    ok = ch.queue_delete(q)
    assert ok.method.message_count == 4
    assert_channel_error(404, f"NOT_FOUND - no queue '{uid}' in vhost '/'", ch.queue_declare, q, passive=True)


def test_delete_missing_queue_is_ok(ch, uid):
    ok = ch.queue_delete(uid)
    assert ok.method.message_count == 0


def test_delete_if_unused(conn, cleanup, uid):
    ch = conn.channel()
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    ch.basic_consume(q, lambda *a: None)
    ch2 = conn.channel()
    assert_channel_error(406, f"PRECONDITION_FAILED - queue '{uid}' in vhost '/' in use",
                         ch2.queue_delete, q, if_unused=True)


def test_delete_if_empty(conn, cleanup, uid):
    ch = conn.channel()
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"x")
    assert_channel_error(406, f"PRECONDITION_FAILED - queue '{uid}' in vhost '/' not empty",
                         ch.queue_delete, q, if_empty=True)
    ch = conn.channel()
    ch.queue_purge(q)
    ch.queue_delete(q, if_empty=True, if_unused=True)
    assert_channel_error(404, f"NOT_FOUND - no queue '{uid}' in vhost '/'", ch.queue_declare, q, passive=True)


def test_delete_queue_removes_bindings(ch, cleanup, uid):
    ex = cleanup.exchange(uid + "-x")
    q = cleanup.queue(uid)
    ch.exchange_declare(ex, "fanout")
    ch.queue_declare(q)
    ch.queue_bind(q, ex)
    ch.queue_delete(q)
    ch.queue_declare(q)  # re-created: must not inherit the old binding
    ch.basic_publish(ex, "", b"x")
    assert_empty(ch, q)


def test_queue_name_too_long_is_rejected_by_pika_or_broker(ch):
    # 255 is the maximum shortstr length: a 255-char name is fine
    name = "itest-" + "q" * 249
    assert len(name) == 255
    assert ch.queue_declare(name, exclusive=True).method.queue == name


# ---------------------------------------------------------------- raw-level details
import re  # noqa: E402
import struct  # noqa: E402

import rawamqp  # noqa: E402
from rawamqp import BASIC_GET, shortstr, table  # noqa: E402


def test_server_named_queue_format(raw_conn):
    # "amq.gen-" + 22 characters of URL-safe base64 (16 random bytes, no padding)
    for _ in range(5):
        q, _, _ = raw_conn.queue_declare(1, "", exclusive=True)
        assert re.fullmatch(r"amq\.gen-[A-Za-z0-9_-]{22}", q), q


def test_empty_queue_name_means_last_declared_queue(raw_conn):
    r = raw_conn
    q, _, _ = r.queue_declare(1, "", exclusive=True)
    r.send_method(1, (50, 20), struct.pack(">H", 0) + shortstr("") + shortstr("amq.fanout") + shortstr("")
                  + b"\x00" + table({}))
    r.expect((50, 21), 1)
    r.publish(1, "amq.fanout", "", b"to-last-queue")
    deadline = rawamqp.time.monotonic() + 10
    while True:
        r.send_method(1, BASIC_GET, struct.pack(">H", 0) + shortstr("") + b"\x01")
        ch, cm, rd = r.read_method()
        if cm == rawamqp.BASIC_GET_OK:
            break
        assert rawamqp.time.monotonic() < deadline
    assert (rd.longlong(), rd.octet(), rd.shortstr(), rd.shortstr()) == (1, 0, "amq.fanout", "")
    assert r.read_frame()[0] == rawamqp.FRAME_HEADER
    assert r.read_frame()[:3] == (rawamqp.FRAME_BODY, 1, b"to-last-queue")
    r.send_method(1, (50, 40), struct.pack(">H", 0) + shortstr("") + b"\x00")  # deletes the last queue
    ok = r.expect((50, 41), 1)
    assert ok.long() == 0
    r.send_method(1, rawamqp.QUEUE_DECLARE, struct.pack(">H", 0) + shortstr(q) + b"\x01" + table({}))
    channel, code, text, cid, mid = r.expect_channel_close()
    assert (code, text) == (404, f"NOT_FOUND - no queue '{q}' in vhost '/'")


def test_empty_queue_name_without_previous_declare(raw_conn):
    raw_conn.send_method(1, BASIC_GET, struct.pack(">H", 0) + shortstr("") + b"\x01")
    channel, code, text, cid, mid = raw_conn.expect_channel_close()
    assert (channel, code, text, cid, mid) == (1, 404, "NOT_FOUND - no previously declared queue", 60, 70)


def test_passive_declare_of_empty_name(raw_conn):
    raw_conn.send_method(1, rawamqp.QUEUE_DECLARE, struct.pack(">H", 0) + shortstr("") + b"\x01" + table({}))
    channel, code, text, cid, mid = raw_conn.expect_channel_close()
    assert (channel, code, text, cid, mid) == (1, 404, "NOT_FOUND - no queue '' in vhost '/'", 50, 10)


def test_nowait_declare_then_use(raw_conn, uid):
    r = raw_conn
    r.queue_declare(1, uid, exclusive=True, nowait=True)  # no declare-ok is sent
    name, count, consumers = r.queue_declare(1, uid, passive=True)
    assert (name, count, consumers) == (uid, 0, 0)
