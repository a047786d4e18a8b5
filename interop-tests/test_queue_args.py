"""Queue arguments: TTLs, expiry, length limits, overflow, dead lettering, priorities, SAC."""
from __future__ import annotations

import datetime
import struct
import time

import pika
import pika.exceptions
import pytest
from helpers import assert_channel_error, assert_empty, drain, get_one, wait_for

import rawamqp


def _q(ch, **args):
    return ch.queue_declare("", exclusive=True, arguments=args or None).method.queue


def _count(ch, q):
    return ch.queue_declare(q, passive=True).method.message_count


# ------------------------------------------------------------------ TTL
def test_queue_message_ttl(ch):
    q = _q(ch, **{"x-message-ttl": 100})
    ch.basic_publish("", q, b"short-lived")
    ch.basic_publish("", q, b"short-lived-2")
    # expired messages are never delivered (RabbitMQ may still count them briefly)
    assert_empty(ch, q, settle=0.4)
    wait_for(lambda: _count(ch, q) == 0, timeout=10, conn=ch.connection, msg="ttl expiry")


def test_queue_message_ttl_zero_without_consumer(ch):
    q = _q(ch, **{"x-message-ttl": 0})
    ch.basic_publish("", q, b"gone")
    assert_empty(ch, q)


def test_per_message_expiration(ch):
    q = _q(ch)
    ch.basic_publish("", q, b"expires", pika.BasicProperties(expiration="100"))
    ch.basic_publish("", q, b"stays")
    ch.connection.sleep(0.4)
    m, p, b = get_one(ch, q)
    assert b == b"stays"
    assert_empty(ch, q, settle=0)


def test_per_message_expiration_behind_long_lived_head(ch):
    q = _q(ch)
    ch.basic_publish("", q, b"head", pika.BasicProperties(expiration="60000"))
    ch.basic_publish("", q, b"expires", pika.BasicProperties(expiration="50"))
    ch.connection.sleep(0.3)
    assert get_one(ch, q)[2] == b"head"
    # the expired message must never be delivered, even though it was not at the head
    assert_empty(ch, q, settle=0)


def test_per_message_expiration_kept_on_delivery(ch):
    q = _q(ch)
    ch.basic_publish("", q, b"x", pika.BasicProperties(expiration="60000"))
    m, p, b = get_one(ch, q)
    assert p.expiration == "60000"


def test_lower_of_queue_and_message_ttl_wins(ch):
    q = _q(ch, **{"x-message-ttl": 60000})
    ch.basic_publish("", q, b"x", pika.BasicProperties(expiration="50"))
    ch.connection.sleep(0.3)
    assert_empty(ch, q, settle=0)


def test_invalid_expiration_property(conn):
    ch = conn.channel()
    q = _q(ch)
    ch.basic_publish("", q, b"x", pika.BasicProperties(expiration="soon"))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.queue_declare(q, passive=True)
    assert ei.value.reply_code == 406
    assert ei.value.reply_text.startswith("PRECONDITION_FAILED - invalid expiration 'soon'")


def test_queue_expires(conn, cleanup, uid):
    ch = conn.channel()
    q = cleanup.queue(uid)
    ch.queue_declare(q, arguments={"x-expires": 300})
    ch.queue_declare(q, passive=True)  # it is there now

    def gone():
        try:
            conn.channel().queue_declare(q, passive=True)
            return False
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code == 404
            return True

    t0 = time.monotonic()
    # NB: in RabbitMQ even a passive declare renews the lease, so poll slower than x-expires
    wait_for(gone, timeout=10, interval=0.7, conn=conn, msg="x-expires deletion")
    assert time.monotonic() - t0 >= 0.1


def test_queue_expires_not_while_consumed(conn, cleanup, uid):
    ch = conn.channel()
    q = cleanup.queue(uid)
    ch.queue_declare(q, arguments={"x-expires": 200})
    tag = ch.basic_consume(q, lambda *a: None)
    conn.sleep(0.6)
    ch.queue_declare(q, passive=True)  # consumer keeps it alive
    ch.basic_cancel(tag)


# ------------------------------------------------------------------ length limits
def test_max_length_drop_head(ch):
    q = _q(ch, **{"x-max-length": 2})
    ch.confirm_delivery()
    for b in (b"1", b"2", b"3"):
        ch.basic_publish("", q, b)
    assert [m[2] for m in drain(ch, q)] == [b"2", b"3"]


def test_max_length_zero(ch):
    q = _q(ch, **{"x-max-length": 0})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"1")
    assert_empty(ch, q, settle=0)


def test_max_length_bytes(ch):
    q = _q(ch, **{"x-max-length-bytes": 10})
    ch.confirm_delivery()
    for b in (b"aaaaa", b"bbbbb", b"ccccc"):
        ch.basic_publish("", q, b)
    assert [m[2] for m in drain(ch, q)] == [b"bbbbb", b"ccccc"]


def test_overflow_reject_publish_nacks(ch):
    q = _q(ch, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"first")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"second")
    assert [m[2] for m in drain(ch, q)] == [b"first"]
    ch.basic_publish("", q, b"third")  # room again
    assert [m[2] for m in drain(ch, q)] == [b"third"]


def test_overflow_reject_publish_without_confirms_drops(ch):
    q = _q(ch, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", q, b"first")
    ch.basic_publish("", q, b"second")
    ch.connection.sleep(0.2)
    assert [m[2] for m in drain(ch, q)] == [b"first"]


def test_overflow_drop_head_dead_letters_with_maxlen(ch, cleanup, uid):
    dlx = cleanup.exchange(uid)
    ch.exchange_declare(dlx, "fanout")
    dq = _q(ch)
    ch.queue_bind(dq, dlx)
    q = _q(ch, **{"x-max-length": 1, "x-dead-letter-exchange": dlx})
    ch.basic_publish("", q, b"old")
    ch.basic_publish("", q, b"new")
    m, p, b = get_one(ch, dq)
    assert b == b"old"
    assert p.headers["x-death"][0]["reason"] == "maxlen"
    assert p.headers["x-first-death-reason"] == "maxlen"
    assert [x[2] for x in drain(ch, q)] == [b"new"]


def test_overflow_reject_publish_dlx(ch, cleanup, uid):
    dlx = cleanup.exchange(uid)
    ch.exchange_declare(dlx, "fanout")
    dq = _q(ch)
    ch.queue_bind(dq, dlx)
    q = _q(ch, **{"x-max-length": 1, "x-overflow": "reject-publish-dlx", "x-dead-letter-exchange": dlx})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"kept")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"rejected")
    m, p, b = get_one(ch, dq)
    assert b == b"rejected"
    death = p.headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("maxlen", q, 1)
    assert [x[2] for x in drain(ch, q)] == [b"kept"]


# ------------------------------------------------------------------ dead lettering
def _dlx_setup(ch, cleanup, uid, **qargs):
    dlx = cleanup.exchange(uid + "-dlx")
    ch.exchange_declare(dlx, "topic")
    dq = _q(ch)
    ch.queue_bind(dq, dlx, "#")
    src = cleanup.queue(uid)
    ch.queue_declare(src, exclusive=True, arguments={"x-dead-letter-exchange": dlx, **qargs})
    return dlx, dq, src


def test_dead_letter_on_reject_x_death(ch, cleanup, uid):
    dlx, dq, src = _dlx_setup(ch, cleanup, uid)
    ch.basic_publish("", src, b"r", pika.BasicProperties(headers={"keep": "me"}, content_type="text/plain"))
    m, _, _ = get_one(ch, src, auto_ack=False)
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    ch.basic_reject(m.delivery_tag, requeue=False)
    m, p, b = get_one(ch, dq)
    after = datetime.datetime.now(datetime.UTC)
    assert (b, m.exchange, m.routing_key) == (b"r", dlx, src)
    assert p.content_type == "text/plain"
    h = p.headers
    assert h["keep"] == "me"
    (death,) = h["x-death"]
    assert set(death) == {"count", "reason", "queue", "time", "exchange", "routing-keys"}
    assert death["count"] == 1
    assert death["reason"] == "rejected"
    assert death["queue"] == src
    assert death["exchange"] == ""
    assert death["routing-keys"] == [src]
    assert isinstance(death["time"], datetime.datetime)
    assert before - datetime.timedelta(seconds=5) <= death["time"] <= after + datetime.timedelta(seconds=5)
    assert h["x-first-death-reason"] == "rejected"
    assert h["x-first-death-queue"] == src
    assert h["x-first-death-exchange"] == ""


def test_dead_letter_on_nack(ch, cleanup, uid):
    dlx, dq, src = _dlx_setup(ch, cleanup, uid)
    ch.basic_publish("", src, b"n")
    m, _, _ = get_one(ch, src, auto_ack=False)
    ch.basic_nack(m.delivery_tag, requeue=False)
    m, p, b = get_one(ch, dq)
    assert p.headers["x-death"][0]["reason"] == "rejected"


def test_dead_letter_routing_key_and_cc(ch, cleanup, uid):
    dlx, dq, src = _dlx_setup(ch, cleanup, uid, **{"x-dead-letter-routing-key": "new.key"})
    ch.basic_publish("", src, b"x", pika.BasicProperties(headers={"CC": ["cc-key"]}))
    m, _, _ = get_one(ch, src, auto_ack=False)
    ch.basic_reject(m.delivery_tag, requeue=False)
    m, p, b = get_one(ch, dq)
    assert m.routing_key == "new.key"
    death = p.headers["x-death"][0]
    assert death["routing-keys"] == [src, "cc-key"]


def test_dead_letter_on_expiry_original_expiration(ch, cleanup, uid):
    dlx, dq, src = _dlx_setup(ch, cleanup, uid)
    ch.basic_publish("", src, b"e", pika.BasicProperties(expiration="50", headers={"h": 1}))
    m, p, b = get_one(ch, dq)
    assert p.expiration is None  # removed on dead-lettering ...
    h = p.headers
    (death,) = h["x-death"]
    assert death["reason"] == "expired"
    assert death["original-expiration"] == "50"  # ... and kept here
    assert death["queue"] == src and death["exchange"] == "" and death["routing-keys"] == [src]
    assert h["x-first-death-reason"] == "expired"
    assert h["h"] == 1


def test_dead_letter_on_queue_ttl(ch, cleanup, uid):
    dlx, dq, src = _dlx_setup(ch, cleanup, uid, **{"x-message-ttl": 50})
    ch.basic_publish("", src, b"qttl")
    m, p, b = get_one(ch, dq)
    death = p.headers["x-death"][0]
    assert death["reason"] == "expired"
    assert "original-expiration" not in death


def test_x_death_count_increments_and_reorders(ch, cleanup, uid):
    q1 = cleanup.queue(uid + "-1")
    q2 = cleanup.queue(uid + "-2")
    ch.queue_declare(q1, exclusive=True, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": q2})
    ch.queue_declare(q2, exclusive=True, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": q1})
    ch.basic_publish("", q1, b"ping-pong")
    for q in (q1, q2, q1):
        m, _, _ = get_one(ch, q, auto_ack=False)
        ch.basic_reject(m.delivery_tag, requeue=False)
    m, p, b = get_one(ch, q2)
    deaths = p.headers["x-death"]
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [(q1, "rejected", 2), (q2, "rejected", 1)]
    assert p.headers["x-first-death-queue"] == q1
    assert p.headers["x-first-death-reason"] == "rejected"


def test_dead_letter_to_missing_exchange_drops(ch, uid):
    q = _q(ch, **{"x-dead-letter-exchange": uid + "-missing"})
    ch.basic_publish("", q, b"x")
    m, _, _ = get_one(ch, q, auto_ack=False)
    ch.basic_reject(m.delivery_tag, requeue=False)
    assert_empty(ch, q)


def test_x_death_field_types_raw(raw_conn, uid, cleanup):
    """The exact AMQP field types RabbitMQ uses in x-death."""
    r = raw_conn
    dead = cleanup.queue(uid + "-dead")
    r.queue_declare(1, dead, exclusive=True)
    src = cleanup.queue(uid)
    r.queue_declare(1, src, exclusive=True, args={"x-dead-letter-exchange": "",
                                                  "x-dead-letter-routing-key": dead,
                                                  "x-message-ttl": 20})
    r.publish(1, "", src, b"typed")
    deadline = time.monotonic() + 10
    while True:
        r.send_method(1, rawamqp.BASIC_GET, struct.pack(">H", 0) + rawamqp.shortstr(dead) + b"\x01")
        ch, cm, rd = r.read_method()
        if cm == rawamqp.BASIC_GET_OK:
            break
        assert cm == rawamqp.BASIC_GET_EMPTY
        assert time.monotonic() < deadline
        time.sleep(0.05)
    ftype, chan, payload = r.read_frame()
    assert ftype == rawamqp.FRAME_HEADER
    props = rawamqp.parse_basic_properties(payload, typed=True)
    h = props["headers"]
    assert h["x-first-death-reason"] == ("S", "expired")
    assert h["x-first-death-queue"] == ("S", src)
    assert h["x-first-death-exchange"] == ("S", "")
    t, deaths = h["x-death"]
    assert t == "A" and len(deaths) == 1
    t, death = deaths[0]
    assert t == "F"
    assert death["count"] == ("l", 1)
    assert death["reason"] == ("S", "expired")
    assert death["queue"] == ("S", src)
    assert death["exchange"] == ("S", "")
    assert death["routing-keys"] == ("A", [("S", src)])
    assert death["time"][0] == "T"
    assert abs(death["time"][1] - time.time()) < 60


# ------------------------------------------------------------------ priorities
def test_max_priority_ordering(ch):
    q = _q(ch, **{"x-max-priority": 10})
    ch.confirm_delivery()
    for prio, body in [(1, b"p1"), (None, b"p0"), (9, b"p9"), (10, b"p10"), (5, b"p5"), (200, b"p200"), (9, b"p9b")]:
        ch.basic_publish("", q, body, pika.BasicProperties(priority=prio))
    got = [m[2] for m in drain(ch, q)]
    # priorities above the maximum count as the maximum; FIFO within a priority
    assert got == [b"p10", b"p200", b"p9", b"p9b", b"p5", b"p1", b"p0"]


def test_no_priority_queue_is_fifo(ch):
    q = _q(ch)
    ch.confirm_delivery()
    for prio, body in [(1, b"a"), (9, b"b"), (5, b"c")]:
        ch.basic_publish("", q, body, pika.BasicProperties(priority=prio))
    assert [m[2] for m in drain(ch, q)] == [b"a", b"b", b"c"]


# ------------------------------------------------------------------ single active consumer
def test_single_active_consumer(conn):
    ch = conn.channel()
    q = _q(ch, **{"x-single-active-consumer": True})
    got = {"a": [], "b": []}
    ta = ch.basic_consume(q, lambda c, m, p, b: got["a"].append(b), auto_ack=True)
    tb = ch.basic_consume(q, lambda c, m, p, b: got["b"].append(b), auto_ack=True)
    for i in range(4):
        ch.basic_publish("", q, str(i).encode())
    wait_for(lambda: len(got["a"]) + len(got["b"]) == 4, conn=conn, msg="4 deliveries")
    assert got["a"] == [b"0", b"1", b"2", b"3"] and got["b"] == []
    ch.basic_cancel(ta)
    ch.basic_publish("", q, b"after-cancel")
    wait_for(lambda: got["b"] == [b"after-cancel"], conn=conn, msg="failover to second consumer")
    ch.basic_cancel(tb)


def test_single_active_consumer_equivalence(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid, exclusive=True, arguments={"x-single-active-consumer": True})
    assert_channel_error(
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-single-active-consumer' for queue '{uid}' in vhost '/'",
        ch.queue_declare, uid, exclusive=True, arguments={"x-single-active-consumer": False})


# ------------------------------------------------------------------ invalid arguments
INVALID_ARGS = [
    ({"x-max-length": -1}, "invalid arg 'x-max-length' for queue '{q}' in vhost '/': {{value_negative,-1}}"),
    ({"x-max-length-bytes": -1}, "invalid arg 'x-max-length-bytes' for queue '{q}' in vhost '/': {{value_negative,-1}}"),
    ({"x-message-ttl": "abc"}, "invalid arg 'x-message-ttl' for queue '{q}' in vhost '/': \"expected integer, got longstr\""),
    ({"x-message-ttl": -1}, "invalid arg 'x-message-ttl' for queue '{q}' in vhost '/': {{value_negative,-1}}"),
    ({"x-expires": 0}, "invalid arg 'x-expires' for queue '{q}' in vhost '/': {{value_zero,0}}"),
    ({"x-expires": "x"}, "invalid arg 'x-expires' for queue '{q}' in vhost '/': \"expected integer, got longstr\""),
    ({"x-overflow": "bogus"}, "invalid arg 'x-overflow' for queue '{q}' in vhost '/': invalid_overflow"),
    ({"x-max-priority": 256}, "invalid arg 'x-max-priority' for queue '{q}' in vhost '/': {{max_value_exceeded,256}}"),
    ({"x-max-priority": -1}, "invalid arg 'x-max-priority' for queue '{q}' in vhost '/': {{value_negative,-1}}"),
    ({"x-dead-letter-exchange": 5}, "invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue '{q}' in vhost '/'"),
    ({"x-dead-letter-routing-key": "k"}, "invalid arg 'x-dead-letter-routing-key' for queue '{q}' in vhost '/': routing_key_but_no_dlx_defined"),
    ({"x-single-active-consumer": "yes"}, "invalid arg 'x-single-active-consumer' for queue '{q}' in vhost '/': {{unacceptable_type,longstr}}"),
]


@pytest.mark.parametrize("args,text", INVALID_ARGS, ids=[next(iter(a)) + "=" + str(next(iter(a.values()))) for a, _ in INVALID_ARGS])
def test_invalid_queue_argument(ch, uid, args, text):
    assert_channel_error(406, "PRECONDITION_FAILED - " + text.format(q=uid),
                         ch.queue_declare, uid, exclusive=True, arguments=args)


def test_unknown_x_argument_is_accepted(ch, uid):
    ch.queue_declare(uid, exclusive=True, arguments={"x-itest-unknown": 1, "plain": "v"})
