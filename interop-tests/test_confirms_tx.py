"""Publisher confirms and transactions."""
from __future__ import annotations

import struct

import pika
import pika.exceptions
import pytest
from helpers import assert_channel_error, assert_empty, drain, get_one

import rawamqp
from rawamqp import BASIC_PUBLISH, body_frame, content_header, method_frame, shortstr


def _q(ch, **args):
    return ch.queue_declare("", exclusive=True, arguments=args or None).method.queue


def _raw_publish_bytes(q, n, body=b"abc"):
    one = (method_frame(1, BASIC_PUBLISH, struct.pack(">H", 0) + shortstr("") + shortstr(q) + b"\x00")
           + content_header(1, len(body)) + body_frame(1, body))
    return one * n


def _read_acks(r, last_tag):
    acks = []
    while not acks or acks[-1][1] < last_tag:
        ch, cm, rd = r.read_method()
        assert cm in ((60, 80), (60, 120)), cm
        acks.append(("ack" if cm == (60, 80) else "nack", rd.longlong(), rd.octet()))
    return acks


def _covered(acks):
    seen, prev = set(), 0
    for _kind, tag, multiple in acks:
        assert tag > prev, f"confirm tags must increase: {acks}"
        if multiple:
            seen.update(range(prev + 1, tag + 1))
        else:
            seen.add(tag)
        prev = tag
    return seen


def test_confirm_select_and_sequential_tags_raw(raw_conn):
    r = raw_conn
    q, _, _ = r.queue_declare(1, "", exclusive=True)
    r.confirm_select(1)
    for i in range(1, 4):
        r.publish(1, "", q, b"x")
        ch, cm, rd = r.read_method()
        assert (ch, cm) == (1, (60, 80))
        assert (rd.longlong(), rd.octet()) == (i, 0)


def test_confirm_multiple_acks_when_pipelining_raw(raw_conn):
    r = raw_conn
    q, _, _ = r.queue_declare(1, "", exclusive=True)
    r.confirm_select(1)
    n = 500
    r.send(_raw_publish_bytes(q, n))
    acks = _read_acks(r, n)
    assert all(kind == "ack" for kind, _, _ in acks)
    assert _covered(acks) == set(range(1, n + 1))
    assert any(m for _, _, m in acks), "expected at least one multiple=true ack for 500 pipelined publishes"
    assert r.queue_declare(1, q, passive=True)[1] == n


def test_confirm_select_nowait_raw(raw_conn):
    r = raw_conn
    q, _, _ = r.queue_declare(1, "", exclusive=True)
    r.send_method(1, rawamqp.CONFIRM_SELECT, b"\x01")  # nowait: no select-ok
    r.publish(1, "", q, b"x")
    ch, cm, rd = r.read_method()
    assert cm == (60, 80) and rd.longlong() == 1


def test_confirm_unroutable_is_acked(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("amq.direct", "itest-no-binding", b"x")  # not mandatory: acked, dropped


def test_confirm_mandatory_unroutable_pika(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError) as ei:
        ch.basic_publish("amq.direct", "itest-no-binding", b"x", mandatory=True)
    (ret,) = ei.value.messages
    assert (ret.method.reply_code, ret.method.reply_text) == (312, "NO_ROUTE")


def test_confirm_select_twice_is_ok(raw_conn):
    raw_conn.confirm_select(1)
    raw_conn.confirm_select(1)


def test_confirm_nack_on_reject_publish_raw(raw_conn):
    r = raw_conn
    q, _, _ = r.queue_declare(1, "", exclusive=True, args={"x-max-length": 2, "x-overflow": "reject-publish"})
    r.confirm_select(1)
    r.send(_raw_publish_bytes(q, 5))
    acks = _read_acks(r, 5)
    status = {}
    prev = 0
    for kind, tag, multiple in acks:
        for t in (range(prev + 1, tag + 1) if multiple else [tag]):
            status[t] = kind
        prev = tag
    assert status == {1: "ack", 2: "ack", 3: "nack", 4: "nack", 5: "nack"}


def test_aio_pika_confirms_pipelined(amqp_params):
    import asyncio

    import aio_pika

    async def main():
        conn = await aio_pika.connect(amqp_params.url)
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue("", exclusive=True)
            results = await asyncio.gather(*[
                ch.default_exchange.publish(aio_pika.Message(str(i).encode()), routing_key=q.name)
                for i in range(200)])
            assert len(results) == 200
            for res in results:
                assert res.__class__.__name__ == "Ack", res  # pamqp Basic.Ack frame
            decl = await ch.declare_queue(q.name, passive=True)
            assert decl.declaration_result.message_count == 200

    asyncio.run(asyncio.wait_for(main(), 30))


# ---------------------------------------------------------------- transactions
def test_tx_commit_publishes(conn):
    ch = conn.channel()
    q = _q(ch)
    other = conn.channel()
    ch.tx_select()
    ch.basic_publish("", q, b"t1")
    ch.basic_publish("", q, b"t2")
    conn.sleep(0.2)
    assert other.queue_declare(q, passive=True).method.message_count == 0  # not before commit
    ch.tx_commit()
    assert [b for _, _, b in drain(other, q)] == [b"t1", b"t2"]


def test_tx_rollback_discards_publishes(conn):
    ch = conn.channel()
    q = _q(ch)
    ch.tx_select()
    ch.basic_publish("", q, b"never")
    ch.tx_rollback()
    ch.basic_publish("", q, b"after")
    ch.tx_commit()
    assert [b for _, _, b in drain(conn.channel(), q)] == [b"after"]
    ch.tx_commit()  # empty commit is fine
    assert_empty(conn.channel(), q)


def test_tx_rollback_publish_never_delivered_to_consumer(conn):
    ch = conn.channel()
    q = _q(ch)
    got = []
    cch = conn.channel()
    cch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
    ch.tx_select()
    ch.basic_publish("", q, b"rolled-back")
    ch.tx_rollback()
    conn.sleep(0.3)
    assert got == []


def test_tx_channel_close_discards_uncommitted(conn):
    ch = conn.channel()
    q = _q(ch)
    ch.tx_select()
    ch.basic_publish("", q, b"uncommitted")
    ch.close()
    assert_empty(conn.channel(), q)


def test_tx_acks_commit_and_rollback(conn):
    pub = conn.channel()
    q = _q(pub)
    pub.confirm_delivery()
    for b in (b"a", b"b"):
        pub.basic_publish("", q, b)
    ch = conn.channel()
    ch.tx_select()
    ma = get_one(ch, q, auto_ack=False)[0]
    mb = get_one(ch, q, auto_ack=False)[0]
    ch.basic_ack(ma.delivery_tag)
    ch.tx_rollback()
    # rolled back ack: message a is still unacked (not requeued by the rollback)
    assert pub.queue_declare(q, passive=True).method.message_count == 0
    ch.basic_ack(mb.delivery_tag)
    ch.tx_commit()
    ch.close()  # a was never acked -> requeued
    got = drain(pub, q)
    assert [(b, m.redelivered) for m, _, b in got] == [(b"a", True)]


def test_tx_reject_requeue_applied_on_commit(conn):
    pub = conn.channel()
    q = _q(pub)
    pub.confirm_delivery()
    pub.basic_publish("", q, b"r")
    ch = conn.channel()
    ch.tx_select()
    m = get_one(ch, q, auto_ack=False)[0]
    ch.basic_reject(m.delivery_tag, requeue=True)
    conn.sleep(0.2)
    assert pub.queue_declare(q, passive=True).method.message_count == 0  # not yet
    ch.tx_commit()
    m2, _, b = get_one(pub, q)
    assert b == b"r" and m2.redelivered


def test_tx_rollback_without_select(ch):
    assert_channel_error(406, "PRECONDITION_FAILED - channel is not transactional", ch.tx_rollback)


def test_tx_select_twice_ok(ch):
    ch.tx_select()
    ch.tx_select()
    ch.tx_commit()
