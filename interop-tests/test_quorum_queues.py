"""Quorum queues (x-queue-type: quorum) on one node, and the stream type's refusals.

Every reply text was read from RabbitMQ 3.10 with pika (declare, then the channel-close
reply_text). Where RabbitMQ 4 changed the contract this broker follows 4.x and the test
tolerates 3.x: the default delivery limit of 20, a redeclare without ``x-queue-type``
being equivalent, a non-integer ``x-delivery-limit`` refused.
"""
from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest
from helpers import channel_error, connection_error, get_one, wait_for

Q = {"x-queue-type": "quorum"}


@pytest.fixture
def rabbit3(conn) -> bool:
    """The broker is a RabbitMQ 3.x (the reference on this machine is 3.10)."""
    props = conn._impl.server_properties  # pika keeps connection.start's table here
    product = props.get("product", b"")
    version = props.get("version", b"")
    product = product.decode() if isinstance(product, bytes) else str(product)
    version = version.decode() if isinstance(version, bytes) else str(version)
    return product == "RabbitMQ" and version.startswith("3.")


def _declare(ch, name, durable=True, exclusive=False, auto_delete=False, arguments=None):
    return ch.queue_declare(name, durable=durable, exclusive=exclusive, auto_delete=auto_delete,
                            arguments=arguments)


def test_declare_quorum_queue(ch, uid, cleanup):
    q = cleanup.queue(uid)
    ok = _declare(ch, q, arguments=Q)
    assert ok.method.queue == q
    assert _declare(ch, q, arguments=dict(Q)).method.message_count == 0
    ch.queue_declare(q, passive=True)
    ch.basic_publish("", q, b"hello", pika.BasicProperties(delivery_mode=2))
    _m, _p, body = get_one(ch, q)
    assert body == b"hello"


@pytest.mark.parametrize("label, kw, args, text", [
    ("exclusive", {"exclusive": True}, {}, "invalid property 'exclusive-owner' for queue '{q}' in vhost '/'"),
    ("exclusive, transient", {"exclusive": True, "durable": False}, {},
     "invalid property 'exclusive-owner' for queue '{q}' in vhost '/'"),
    ("auto-delete", {"auto_delete": True}, {}, "invalid property 'auto-delete' for queue '{q}' in vhost '/'"),
    ("auto-delete before transient", {"auto_delete": True, "durable": False}, {},
     "invalid property 'auto-delete' for queue '{q}' in vhost '/'"),
    ("transient", {"durable": False}, {}, "invalid property 'non-durable' for queue '{q}' in vhost '/'"),
    ("max-priority", {}, {"x-max-priority": 10},
     "invalid arg 'x-max-priority' for queue '{q}' in vhost '/' of queue type rabbit_quorum_queue"),
    ("max-priority beyond 255", {"exclusive": True}, {"x-max-priority": 500},
     "invalid arg 'x-max-priority' for queue '{q}' in vhost '/' of queue type rabbit_quorum_queue"),
    ("lazy", {}, {"x-queue-mode": "lazy"},
     "invalid arg 'x-queue-mode' for queue '{q}' in vhost '/' of queue type rabbit_quorum_queue"),
    ("master locator", {}, {"x-queue-master-locator": "min-masters"},
     "invalid arg 'x-queue-master-locator' for queue '{q}' in vhost '/' of queue type rabbit_quorum_queue"),
    ("dead-letter strategy", {}, {"x-dead-letter-strategy": "foo"},
     "invalid arg 'x-dead-letter-strategy' for queue '{q}' in vhost '/': invalid_dlx_strategy"),
    ("dead-letter strategy type", {}, {"x-dead-letter-strategy": 5},
     "invalid arg 'x-dead-letter-strategy' for queue '{q}' in vhost '/': {{unacceptable_type,signedint}}"),
    ("overflow", {}, {"x-overflow": "foo"},
     "invalid arg 'x-overflow' for queue '{q}' in vhost '/': invalid_overflow"),
    ("value before the property", {"exclusive": True}, {"x-overflow": "foo"},
     "invalid arg 'x-overflow' for queue '{q}' in vhost '/': invalid_overflow"),
    ("group size", {}, {"x-quorum-initial-group-size": 0},
     "invalid arg 'x-quorum-initial-group-size' for queue '{q}' in vhost '/': {{value_zero,0}}"),
    ("group size type", {}, {"x-quorum-initial-group-size": "x"},
     "invalid arg 'x-quorum-initial-group-size' for queue '{q}' in vhost '/': "
     "\"expected integer, got longstr\""),
    ("leader locator", {}, {"x-queue-leader-locator": "foo"},
     "invalid arg 'x-queue-leader-locator' for queue '{q}' in vhost '/': invalid_queue_locator_arg"),
])
def test_quorum_refusals(conn, uid, label, kw, args, text):
    code, reply = channel_error(_declare, conn.channel(), uid, arguments={**Q, **args}, **kw)
    assert (code, reply) == (406, "PRECONDITION_FAILED - " + text.format(q=uid)), label


@pytest.mark.parametrize("args, text", [
    ({"x-queue-type": "foo"}, "invalid arg 'x-queue-type' for queue '{q}' in vhost '/': "
                              "\"unsupported queue type 'foo'\""),
    ({"x-queue-type": 5}, "invalid arg 'x-queue-type' for queue '{q}' in vhost '/': "
                          "{{unacceptable_type,signedint}}"),
    ({"x-dead-letter-strategy": "at-least-once"},
     "invalid arg 'x-dead-letter-strategy' for queue '{q}' in vhost '/' of queue type "
     "rabbit_classic_queue"),
    ({"x-quorum-initial-group-size": 3},
     "invalid arg 'x-quorum-initial-group-size' for queue '{q}' in vhost '/' of queue type "
     "rabbit_classic_queue"),
    ({"x-max-in-memory-length": 3},
     "invalid arg 'x-max-in-memory-length' for queue '{q}' in vhost '/' of queue type "
     "rabbit_classic_queue"),
])
def test_classic_and_unknown_type_refusals(conn, uid, args, text):
    code, reply = channel_error(_declare, conn.channel(), uid, durable=False, arguments=args)
    assert (code, reply) == (406, "PRECONDITION_FAILED - " + text.format(q=uid))


@pytest.mark.parametrize("kw, args, text", [
    ({"durable": False}, {}, "invalid property 'non-durable' for queue '{q}' in vhost '/'"),
    ({"exclusive": True}, {}, "invalid property 'exclusive-owner' for queue '{q}' in vhost '/'"),
    ({"auto_delete": True}, {}, "invalid property 'auto-delete' for queue '{q}' in vhost '/'"),
    ({}, {"x-max-priority": 10},
     "invalid arg 'x-max-priority' for queue '{q}' in vhost '/' of queue type rabbit_stream_queue"),
])
def test_stream_refusals(conn, uid, kw, args, text):
    """Streams are recognised: their declare checks answer as RabbitMQ's do."""
    code, reply = channel_error(_declare, conn.channel(), uid,
                                arguments={"x-queue-type": "stream", **args}, **kw)
    assert (code, reply) == (406, "PRECONDITION_FAILED - " + text.format(q=uid))


def test_redeclare_equivalence(connect, uid, cleanup, rabbit3):
    ch = connect().channel()
    q = cleanup.queue(uid)
    _declare(ch, q, arguments={**Q, "x-delivery-limit": 5})
    code, reply = channel_error(_declare, ch, q, arguments={**Q, "x-delivery-limit": 6})
    assert (code, reply) == (406, f"PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for "
                                  f"queue '{q}' in vhost '/': received '6' but current is '5'")
    ch = connect().channel()
    code, reply = channel_error(_declare, ch, q, arguments={"x-queue-type": "classic",
                                                            "x-delivery-limit": 5})
    assert (code, reply) == (406, f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for "
                                  f"queue '{q}' in vhost '/': received 'classic' but current is "
                                  f"'quorum'")
    ch = connect().channel()
    code, reply = channel_error(_declare, ch, q, durable=False, arguments=Q)
    assert (code, reply) == (406, f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue "
                                  f"'{q}' in vhost '/': received 'false' but current is 'true'")
    ch = connect().channel()
    if rabbit3:  # 3.x: a redeclare without the type is inequivalent; 4.x: it is the queue's own
        code, reply = channel_error(_declare, ch, q, arguments={"x-delivery-limit": 5})
        assert code == 406 and "inequivalent arg 'x-queue-type'" in reply
    else:
        _declare(ch, q, arguments={"x-delivery-limit": 5})


def test_classic_redeclared_as_quorum(connect, uid, cleanup):
    ch = connect().channel()
    q = cleanup.queue(uid)
    _declare(ch, q)
    _declare(ch, q, arguments={"x-queue-type": "classic"})  # none is classic
    code, reply = channel_error(_declare, ch, q, arguments=Q)
    assert (code, reply) == (406, f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for "
                                  f"queue '{q}' in vhost '/': received the value 'quorum' of type "
                                  f"'longstr' but current is none")


def test_non_integer_delivery_limit(conn, uid, cleanup, rabbit3):
    ch = conn.channel()
    q = cleanup.queue(uid)
    if rabbit3:  # 3.10 takes any value and ignores it
        _declare(ch, q, arguments={**Q, "x-delivery-limit": "x"})
        return
    code, reply = channel_error(_declare, ch, q, arguments={**Q, "x-delivery-limit": "x"})
    assert (code, reply) == (406, f"PRECONDITION_FAILED - invalid arg 'x-delivery-limit' for queue "
                                  f"'{q}' in vhost '/': \"expected integer, got longstr\"")


def _dlx_pair(ch, uid, cleanup, source_args):
    dlx = cleanup.exchange(uid + "-dlx")
    target = cleanup.queue(uid + "-dead")
    source = cleanup.queue(uid)
    ch.exchange_declare(dlx, "fanout", durable=True)
    _declare(ch, target)
    ch.queue_bind(target, dlx)
    _declare(ch, source, arguments={**Q, "x-dead-letter-exchange": dlx, **source_args})
    return source, target


def _requeue_until_gone(ch, q, limit=100):
    """Take the message and nack it with requeue until it is no longer in ``q``;
    returns the x-delivery-count headers seen (None where absent)."""
    counts = []
    for _ in range(limit):
        deadline = time.monotonic() + 5
        while True:
            m, p, _b = ch.basic_get(q, auto_ack=False)
            if m is not None or time.monotonic() > deadline:
                break
            ch.connection.sleep(0.02)
        if m is None:
            return counts
        counts.append((p.headers or {}).get("x-delivery-count"))
        ch.basic_nack(m.delivery_tag, requeue=True)
    raise AssertionError("the message was never dead-lettered")


def test_delivery_limit_and_delivery_count(ch, uid, cleanup):
    source, target = _dlx_pair(ch, uid, cleanup, {"x-delivery-limit": 2})
    ch.basic_publish("", source, b"poison", pika.BasicProperties(delivery_mode=2))
    counts = _requeue_until_gone(ch, source)
    assert counts[0] in (None, 0)  # RabbitMQ 3.10's basic.get writes 0 on a first delivery
    assert counts[1:] == [1, 2]
    _m, props, body = get_one(ch, target)
    assert body == b"poison"
    death = props.headers["x-death"][0]
    assert death["reason"] == "delivery_limit" and death["queue"] == source


def test_default_delivery_limit_is_20(ch, uid, cleanup, rabbit3):
    if rabbit3:
        pytest.skip("RabbitMQ 3.x has no default delivery limit (4.x: 20)")
    source, target = _dlx_pair(ch, uid, cleanup, {})
    ch.basic_publish("", source, b"poison")
    counts = _requeue_until_gone(ch, source)
    assert counts[1:] == list(range(1, 21))
    assert get_one(ch, target)[2] == b"poison"


def test_negative_delivery_limit_is_none(ch, uid, cleanup, rabbit3):
    if rabbit3:
        pytest.skip("RabbitMQ 3.x takes a negative limit literally (4.x: no limit)")
    source, _target = _dlx_pair(ch, uid, cleanup, {"x-delivery-limit": -1})
    ch.basic_publish("", source, b"m")
    for i in range(25):
        m, p, _b = get_one(ch, source, auto_ack=False)
        assert (p.headers or {}).get("x-delivery-count") in ((i,) if i else (None, 0))
        ch.basic_nack(m.delivery_tag, requeue=True)


def test_at_least_once_dead_lettering(ch, uid, cleanup):
    source, target = _dlx_pair(ch, uid, cleanup, {"x-dead-letter-strategy": "at-least-once",
                                                   "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", source, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    for _ in range(5):
        m, _p, _b = get_one(ch, source, auto_ack=False)
        ch.basic_reject(m.delivery_tag, requeue=False)
    got = sorted(get_one(ch, target)[2] for _ in range(5))
    assert got == [b"0", b"1", b"2", b"3", b"4"]
    wait_for(lambda: ch.queue_declare(source, passive=True).method.message_count == 0,
             conn=ch.connection, msg="source empty")


def test_at_least_once_keeps_unroutable_dead_letters(ch, uid, cleanup, external_broker):
    """No queue bound to the DLX yet: the dead letter stays with its source and arrives
    once a queue is bound (RabbitMQ retries too, but on a timer of minutes)."""
    if external_broker:
        pytest.skip("RabbitMQ's dead-letter worker retries unroutable messages after minutes")
    dlx = cleanup.exchange(uid + "-dlx")
    target = cleanup.queue(uid + "-dead")
    source = cleanup.queue(uid)
    ch.exchange_declare(dlx, "fanout", durable=True)
    _declare(ch, source, arguments={**Q, "x-dead-letter-exchange": dlx, "x-overflow": "reject-publish",
                                    "x-dead-letter-strategy": "at-least-once"})
    ch.basic_publish("", source, b"kept")
    m, _p, _b = get_one(ch, source, auto_ack=False)
    ch.basic_reject(m.delivery_tag, requeue=False)
    _declare(ch, target)
    ch.queue_bind(target, dlx)
    assert get_one(ch, target, timeout=20)[2] == b"kept"


def test_at_most_once_without_reject_publish(ch, uid, cleanup):
    """at-least-once needs reject-publish; without it, dead letters go at most once."""
    dlx = cleanup.exchange(uid + "-dlx")
    source = cleanup.queue(uid)
    ch.exchange_declare(dlx, "fanout", durable=True)
    _declare(ch, source, arguments={**Q, "x-dead-letter-exchange": dlx,
                                    "x-dead-letter-strategy": "at-least-once"})
    ch.basic_publish("", source, b"dropped")
    m, _p, _b = get_one(ch, source, auto_ack=False)
    ch.basic_reject(m.delivery_tag, requeue=False)
    target = cleanup.queue(uid + "-dead")
    _declare(ch, target)
    ch.queue_bind(target, dlx)
    ch.connection.sleep(1.5)
    assert ch.basic_get(target, auto_ack=True)[0] is None


def test_reject_publish_overflow(ch, uid, cleanup):
    q = cleanup.queue(uid)
    _declare(ch, q, arguments={**Q, "x-max-length": 1, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"1")
    nacked = 0
    for i in range(2, 6):  # RabbitMQ's quorum queue may let one more in before it rejects
        try:
            ch.basic_publish("", q, str(i).encode())
        except pika.exceptions.NackError:
            nacked += 1
    assert nacked >= 3
    assert ch.queue_declare(q, passive=True).method.message_count <= 2
    assert get_one(ch, q)[2] == b"1"


def test_drop_head_overflow(ch, uid, cleanup):
    q = cleanup.queue(uid)
    _declare(ch, q, arguments={**Q, "x-max-length": 1})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"1")
    ch.basic_publish("", q, b"2")
    assert get_one(ch, q)[2] == b"2"


def test_global_qos_refused(connect, uid, cleanup):
    c = connect()
    q = cleanup.queue(uid)
    _declare(c.channel(), q, arguments=Q)
    ch = c.channel()
    ch.basic_qos(prefetch_count=5, global_qos=True)
    code, reply = connection_error(ch.basic_consume, q, lambda *a: None)
    assert (code, reply) == (540, f"NOT_IMPLEMENTED - queue '{q}' in vhost '/' does not support "
                                  f"global qos")


def test_per_consumer_qos(ch, uid, cleanup):
    q = cleanup.queue(uid)
    _declare(ch, q, arguments=Q)
    ch.basic_qos(prefetch_count=2)
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(m.delivery_tag))
    wait_for(lambda: len(got) == 2, conn=ch.connection, msg="two deliveries")
    ch.connection.sleep(0.3)
    assert len(got) == 2  # prefetch 2 holds the rest
    ch.basic_ack(got[-1], multiple=True)
    wait_for(lambda: len(got) == 4, conn=ch.connection, msg="two more")


def test_long_ttls(conn, uid, cleanup):
    """Celery's delay queues ask for TTLs up to 2^27 s; RabbitMQ's limit is ten years."""
    ch = conn.channel()
    q = cleanup.queue(uid)
    _declare(ch, q, arguments={**Q, "x-message-ttl": 2**27 * 1000, "x-expires": 315360000000})
    ch.basic_publish("", q, b"x", pika.BasicProperties(expiration="315360000000"))
    assert get_one(ch, q)[2] == b"x"
    for arg in ("x-message-ttl", "x-expires"):
        code, reply = channel_error(_declare, conn.channel(), uid + "-big",
                                    arguments={**Q, arg: 315360000001})
        assert (code, reply) == (406, f"PRECONDITION_FAILED - invalid arg '{arg}' for queue "
                                      f"'{uid}-big' in vhost '/': {{value_too_large,315360000001}}")
    ch = conn.channel()
    code, reply = channel_error(
        lambda: (ch.basic_publish("", q, b"x", pika.BasicProperties(expiration="315360000001")),
                 ch.queue_declare(q, passive=True)))
    assert (code, reply) == (406, "PRECONDITION_FAILED - invalid expiration '315360000001': "
                                  "{value_too_large,315360000001}")


def test_quorum_queue_survives_in_the_listing(ch, uid, cleanup):
    """Sanity: single active consumer and a TTL work on a quorum queue as on a classic."""
    q = cleanup.queue(uid)
    _declare(ch, q, arguments={**Q, "x-single-active-consumer": True, "x-message-ttl": 60000})
    got_a, got_b = [], []
    ch.basic_consume(q, lambda c, m, p, b: got_a.append(b), auto_ack=True)
    ch.basic_consume(q, lambda c, m, p, b: got_b.append(b), auto_ack=True)
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    wait_for(lambda: len(got_a) + len(got_b) == 3, conn=ch.connection, msg="3 deliveries")
    assert got_b == [] and got_a == [b"0", b"1", b"2"]


def test_later_global_qos_does_not_limit_a_quorum_consumer(ch, uid, cleanup):
    """basic.qos(global=true) after the consume is accepted; the quorum queue's consumer
    stays out of the channel's limit (RabbitMQ 3.10: all 5 delivered)."""
    q = cleanup.queue(uid)
    _declare(ch, q, arguments=Q)
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(m.delivery_tag))
    ch.basic_qos(prefetch_count=1, global_qos=True)
    for _ in range(5):
        ch.basic_publish("", q, b"x")
    wait_for(lambda: len(got) == 5, conn=ch.connection, msg="all five delivered")
