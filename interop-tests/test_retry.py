"""Retry with backoff before dead-lettering with pika and aio-pika.

Queue arguments x-retry-delays (ms levels), x-delivery-limit (quorum-queue
semantics) and x-retry-ordered; x-delivery-count on redeliveries; x-death
reasons 'rejected' and 'delivery_limit'. TrioMQ extensions: skipped against
--broker-url.
"""
from __future__ import annotations

import asyncio
import time

import pika
import pika.exceptions
import pytest


@pytest.fixture(autouse=True)
def _triomq_only(external_broker):
    if external_broker:
        pytest.skip("TrioMQ extension (x-retry-delays)")


def _setup(ch, uid, cleanup, **args):
    dlx = cleanup.exchange(uid + "-dlx")
    dlq = cleanup.queue(uid + "-dlq")
    q = cleanup.queue(uid + "-q")
    ch.exchange_declare(dlx, "fanout")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx, "")
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": dlx, **args})
    return q, dlq


def _consume(conn, ch, q, until, on_msg):
    """on_msg(method, props, body, t) -> 'ack' | 'reject' | 'nack-requeue'."""
    def cb(c, m, p, b):
        action = on_msg(m, p, b, time.time())
        if action == "ack":
            c.basic_ack(m.delivery_tag)
        elif action == "reject":
            c.basic_reject(m.delivery_tag, requeue=False)
        else:
            c.basic_nack(m.delivery_tag, requeue=True)
    tag = ch.basic_consume(q, cb)
    while time.time() < until:
        conn.process_data_events(time_limit=0.05)
    ch.basic_cancel(tag)


def test_retry_delays_then_dead_letter_rejected(conn, ch, uid, cleanup):
    q, dlq = _setup(ch, uid, cleanup, **{"x-retry-delays": [200, 400]})
    seen = []
    t0 = time.time()
    ch.basic_publish("", q, b"job")
    _consume(conn, ch, q, t0 + 1.6,
             lambda m, p, b, t: seen.append((t - t0, m.redelivered,
                                             (p.headers or {}).get("x-delivery-count"))) or "reject")
    assert len(seen) == 3, seen
    assert [s[2] for s in seen] == [None, 1, 2]
    assert [s[1] for s in seen] == [False, True, True]
    assert seen[1][0] - seen[0][0] >= 0.2 and seen[2][0] - seen[1][0] >= 0.4
    m, p, b = ch.basic_get(dlq, auto_ack=True)
    assert b == b"job"
    death = p.headers["x-death"][0]
    assert death["reason"] == "rejected" and death["queue"] == q
    assert p.headers["x-delivery-count"] == 2


def test_retry_applies_to_requeue_too(conn, ch, uid, cleanup):
    q, dlq = _setup(ch, uid, cleanup, **{"x-retry-delays": [300]})
    seen = []
    t0 = time.time()
    ch.basic_publish("", q, b"job")
    _consume(conn, ch, q, t0 + 1.2, lambda m, p, b, t: seen.append(t - t0) or "nack-requeue")
    assert len(seen) == 2 and seen[1] - seen[0] >= 0.3
    assert ch.basic_get(dlq, auto_ack=True)[2] == b"job"


def test_delivery_limit_dead_letters_with_reason(conn, ch, uid, cleanup):
    q, dlq = _setup(ch, uid, cleanup, **{"x-delivery-limit": 2})
    seen = []
    ch.basic_publish("", q, b"poison")
    _consume(conn, ch, q, time.time() + 1.0,
             lambda m, p, b, t: seen.append((p.headers or {}).get("x-delivery-count"))
             or "nack-requeue")
    assert seen == [None, 1, 2]  # returned more than 2 times -> dead-lettered
    m, p, b = ch.basic_get(dlq, auto_ack=True)
    assert b == b"poison"
    assert p.headers["x-death"][0]["reason"] == "delivery_limit"
    assert p.headers["x-first-death-reason"] == "delivery_limit"


def test_delivery_limit_beats_delay_levels(conn, ch, uid, cleanup):
    q, dlq = _setup(ch, uid, cleanup, **{"x-retry-delays": [50, 50, 50, 50], "x-delivery-limit": 1})
    n = []
    ch.basic_publish("", q, b"x")
    _consume(conn, ch, q, time.time() + 1.0, lambda m, p, b, t: n.append(1) or "reject")
    assert len(n) == 2
    assert ch.basic_get(dlq, auto_ack=True)[1].headers["x-death"][0]["reason"] == "delivery_limit"


def test_success_after_retry_is_not_dead_lettered(conn, ch, uid, cleanup):
    q, dlq = _setup(ch, uid, cleanup, **{"x-retry-delays": [100]})
    n = []
    ch.basic_publish("", q, b"x")
    _consume(conn, ch, q, time.time() + 0.8,
             lambda m, p, b, t: n.append(1) or ("reject" if len(n) == 1 else "ack"))
    assert len(n) == 2
    assert ch.basic_get(dlq, auto_ack=True)[0] is None
    assert ch.queue_declare(q, passive=True).method.message_count == 0


@pytest.mark.parametrize("ordered", [False, True])
def test_ordered_retry_blocks_the_queue(conn, ch, uid, cleanup, ordered):
    args = {"x-retry-delays": [400]}
    if ordered:
        args["x-retry-ordered"] = True
    q, dlq = _setup(ch, uid, cleanup, **args)
    ch.basic_qos(prefetch_count=1)
    for body in (b"A", b"B", b"C"):
        ch.basic_publish("", q, body)
    order = []
    t0 = time.time()

    def on_msg(m, p, b, t):
        order.append(b)
        return "reject" if (b == b"A" and order.count(b"A") == 1) else "ack"

    _consume(conn, ch, q, t0 + 1.2, on_msg)
    if ordered:
        assert order == [b"A", b"A", b"B", b"C"]
    else:
        assert order == [b"A", b"B", b"C", b"A"]


@pytest.mark.parametrize("args", [{"x-retry-delays": "100"}, {"x-retry-delays": [100, -1]},
                                  {"x-retry-delays": []}, {"x-delivery-limit": "x"},
                                  {"x-retry-ordered": "yes"}])
def test_bad_retry_arguments(conn, uid, args):
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_declare(uid, arguments=args)
    assert exc.value.reply_code == 406
    assert next(iter(args)) in exc.value.reply_text


def test_retry_aio_pika(amqp_params, uid):
    import aio_pika

    async def run():
        conn = await aio_pika.connect_robust(amqp_params.url)
        async with conn:
            ch = await conn.channel()
            dlx = await ch.declare_exchange(uid + "-dlx", aio_pika.ExchangeType.FANOUT,
                                            auto_delete=True)
            dlq = await ch.declare_queue(uid + "-dlq", auto_delete=True)
            await dlq.bind(dlx)
            q = await ch.declare_queue(uid, auto_delete=True, arguments={
                "x-retry-delays": [100, 200], "x-dead-letter-exchange": uid + "-dlx"})
            await ch.default_exchange.publish(aio_pika.Message(b"hello"), routing_key=uid)
            counts = []
            async with q.iterator() as it:
                async for msg in it:
                    counts.append(msg.headers.get("x-delivery-count"))
                    await msg.reject(requeue=False)
                    if len(counts) == 3:
                        break
            for _ in range(50):
                dead = await dlq.get(no_ack=True, fail=False)
                if dead is not None:
                    return counts, dead
                await asyncio.sleep(0.05)
            return counts, None

    counts, dead = asyncio.run(asyncio.wait_for(run(), 20))
    assert counts == [None, 1, 2]
    assert dead is not None and dead.body == b"hello"
    assert dead.headers["x-death"][0]["reason"] == "rejected"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["restart", "kill9"])
def test_message_waiting_for_retry_survives_restart(tmp_path, how):
    """A persistent message waiting for its retry timer is in the store: after a restart
    (clean, or kill -9) it is delivered again at once."""
    from test_scheduler import BrokerProc, store_available

    why = store_available("journal")
    if why:
        pytest.skip(why)
    b = BrokerProc(tmp_path / "data").start()
    try:
        conn = b.connect()
        ch = conn.channel()
        ch.queue_declare("rq", durable=True, arguments={"x-retry-delays": [60000]})
        ch.confirm_delivery()
        ch.basic_publish("", "rq", b"job", pika.BasicProperties(delivery_mode=2))
        m, p, body = ch.basic_get("rq")
        ch.basic_reject(m.delivery_tag, requeue=False)  # now waits 60 s for its retry
        conn.sleep(0.3)
        assert ch.basic_get("rq")[0] is None
        conn.close()
        b.kill9() if how == "kill9" else b.stop()
        b.start()
        conn = b.connect()
        ch = conn.channel()
        deadline = time.time() + 5
        while True:
            m, p, body = ch.basic_get("rq", auto_ack=True)
            if m is not None:
                break
            assert time.time() < deadline, "message waiting for retry was lost"
            conn.sleep(0.1)
        assert body == b"job" and m.redelivered
        conn.close()
    finally:
        b.stop()
