"""Stream queues over AMQP 0-9-1 with pika and aio-pika, against TrioMQ and the machine's
RabbitMQ 3.10 (the ``target`` parameter; RabbitMQ's cases skip when it is not reachable).

Every code and text was read from RabbitMQ 3.10 with pika. Filters (3.13) and restarts
run on TrioMQ only.
"""
from __future__ import annotations

import datetime
import time

import pika
import pika.exceptions
import pytest
from brokerproc import BrokerProc
from helpers import channel_error, connection_error
from reference import rabbitmq_api

S = {"x-queue-type": "stream"}


@pytest.fixture(params=["triomq", "rabbitmq"])
def target(request, amqp_params, external_broker):
    """(pika connection parameters, name) of the broker under test."""
    if request.param == "triomq" and external_broker:
        pytest.skip("compares the TrioMQ this suite starts with the machine's RabbitMQ")
    if request.param == "rabbitmq":
        if external_broker:
            pytest.skip("the suite already runs against an external broker")
        api = rabbitmq_api()
        if api is None:
            pytest.skip("the machine's RabbitMQ is not reachable")
        api.close()
        params = pika.ConnectionParameters("127.0.0.1", 5672,
                                           credentials=pika.PlainCredentials("guest", "guest"),
                                           connection_attempts=1, socket_timeout=10)
        return params, "rabbitmq"
    return amqp_params.pika_params(), "triomq"


@pytest.fixture
def open_conn(target):
    conns = []

    def make():
        c = pika.BlockingConnection(target[0])
        conns.append(c)
        return c
    yield make
    for c in conns:
        try:
            if c.is_open:
                c.close()
        except Exception:
            pass


@pytest.fixture
def stream(open_conn, uid):
    """A fresh stream queue's name (deleted at the end)."""
    ch = open_conn().channel()
    ch.queue_delete(uid)
    ch.queue_declare(uid, durable=True, arguments=S)
    yield uid
    try:
        c = open_conn()
        c.channel().queue_delete(uid)
    except Exception:
        pass


def _publish(ch, q, bodies, headers=None):
    ch.confirm_delivery()
    for i, body in enumerate(bodies):
        h = dict(headers[i]) if headers else None
        ch.basic_publish("", q, body, pika.BasicProperties(headers=h, delivery_mode=2))


def _consume(conn, ch, q, n, offset=None, prefetch=100, ack=True, extra=None, settle=0.0):
    """Up to ``n`` deliveries (waits for n, then ``settle`` seconds more for surplus)."""
    ch.basic_qos(prefetch_count=prefetch)
    got = []

    def cb(c, m, p, b):
        got.append((m, p, b))
        if ack:
            c.basic_ack(m.delivery_tag)
    args = dict(extra or {})
    if offset is not None:
        args["x-stream-offset"] = offset
    tag = ch.basic_consume(q, cb, arguments=args)
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    end = time.monotonic() + settle
    while time.monotonic() < end:
        conn.process_data_events(time_limit=0.05)
    ch.basic_cancel(tag)
    return got


def _bodies(got):
    return [b for _m, _p, b in got]


def test_publish_confirm_and_replay(open_conn, stream, target):
    c = open_conn()
    ch = c.channel()
    _publish(ch, stream, [b"m%d" % i for i in range(10)], [{"i": i} for i in range(10)])
    if target[1] == "triomq":  # RabbitMQ's count follows its stats, some time later
        assert ch.queue_declare(stream, passive=True).method.message_count == 10
    for _ in range(2):  # reading removes nothing: a second consumer sees the same
        got = _consume(c, ch, stream, 10, "first")
        assert _bodies(got) == [b"m%d" % i for i in range(10)]
        assert [p.headers["x-stream-offset"] for _m, p, _b in got] == list(range(10))
        assert [p.headers["i"] for _m, p, _b in got] == list(range(10))
        assert not any(m.redelivered for m, _p, _b in got)
        assert {(m.exchange, m.routing_key) for m, _p, _b in got} == {("", stream)}


def test_properties_come_back(open_conn, stream):
    c = open_conn()
    ch = c.channel()
    ch.confirm_delivery()
    props = pika.BasicProperties(content_type="text/plain", message_id="mid", correlation_id="c",
                                 reply_to="r", priority=3, timestamp=12345, type="t",
                                 app_id="a", delivery_mode=2, headers={"x": "y"})
    ch.basic_publish("", stream, b"full", props)
    (_m, p, b), = _consume(c, ch, stream, 1, "first")
    assert b == b"full"
    assert (p.content_type, p.message_id, p.correlation_id, p.reply_to, p.priority, p.timestamp,
            p.type, p.app_id, p.delivery_mode) == ("text/plain", "mid", "c", "r", 3, 12345, "t",
                                                   "a", 2)
    assert p.headers == {"x": "y", "x-stream-offset": 0}


@pytest.mark.parametrize("offset, first", [
    ("first", 0), ("last", 5), (3, 3), (-1, 0), ("1h", 0),
])
def test_offset_specs(open_conn, stream, offset, first):
    c = open_conn()
    ch = c.channel()
    _publish(ch, stream, [b"a%d" % i for i in range(5)])
    _publish(ch, stream, [b"b"])  # a chunk of its own on both brokers: "last" starts there
    got = _consume(c, ch, stream, 6 - first, offset)
    assert [p.headers["x-stream-offset"] for _m, p, _b in got] == list(range(first, 6))


def test_timestamp_offset(open_conn, stream):
    c = open_conn()
    ch = c.channel()
    _publish(ch, stream, [b"x", b"y"])
    past = datetime.datetime.now() - datetime.timedelta(hours=1)
    assert _bodies(_consume(c, ch, stream, 2, past)) == [b"x", b"y"]
    future = datetime.datetime.now() + datetime.timedelta(hours=1)
    assert _consume(c, ch, stream, 0, future, settle=0.3) == []


def test_next_is_default_and_sees_new_messages(open_conn, stream):
    c = open_conn()
    ch = c.channel()
    _publish(ch, stream, [b"old"])
    ch.basic_qos(prefetch_count=10)
    got = []
    ch.basic_consume(stream, lambda c_, m, p, b: (got.append(b), c_.basic_ack(m.delivery_tag)))
    c.process_data_events(time_limit=0.3)
    pub = open_conn().channel()
    _publish(pub, stream, [b"new1", b"new2"])
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        c.process_data_events(time_limit=0.05)
    assert got == [b"new1", b"new2"]


def test_acks_return_credit(open_conn, stream):
    """A prefetch of 2: two deliveries, then two more after a multiple ack."""
    c = open_conn()
    ch = c.channel()
    _publish(ch, stream, [b"%d" % i for i in range(6)])
    ch.basic_qos(prefetch_count=2)
    tags = []
    ch.basic_consume(stream, lambda c_, m, p, b: tags.append(m.delivery_tag),
                     arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 30
    while len(tags) < 2 and time.monotonic() < deadline:
        c.process_data_events(time_limit=0.05)
    c.process_data_events(time_limit=0.3)
    assert len(tags) == 2
    ch.basic_ack(tags[-1], multiple=True)
    while len(tags) < 4 and time.monotonic() < deadline:
        c.process_data_events(time_limit=0.05)
    c.process_data_events(time_limit=0.3)
    assert len(tags) == 4


@pytest.mark.parametrize("kw, args, text", [
    ({"durable": False}, {}, "invalid property 'non-durable' for queue '{q}' in vhost '/'"),
    ({"exclusive": True}, {}, "invalid property 'exclusive-owner' for queue '{q}' in vhost '/'"),
    ({"auto_delete": True}, {}, "invalid property 'auto-delete' for queue '{q}' in vhost '/'"),
    ({}, {"x-max-age": "10X"}, "invalid arg 'x-max-age' for queue '{q}' in vhost '/': invalid_max_age"),
    ({}, {"x-max-age": "0D"}, "invalid arg 'x-max-age' for queue '{q}' in vhost '/': invalid_max_age"),
    ({}, {"x-max-age": 10},
     "invalid arg 'x-max-age' for queue '{q}' in vhost '/': {{unacceptable_type,signedint}}"),
    ({}, {"x-stream-max-segment-size-bytes": -1},
     "invalid arg 'x-stream-max-segment-size-bytes' for queue '{q}' in vhost '/': {{value_negative,-1}}"),
    ({}, {"x-max-length-bytes": -1},
     "invalid arg 'x-max-length-bytes' for queue '{q}' in vhost '/': {{value_negative,-1}}"),
    ({}, {"x-max-length": 5},
     "invalid arg 'x-max-length' for queue '{q}' in vhost '/' of queue type rabbit_stream_queue"),
    ({}, {"x-single-active-consumer": True},
     "invalid arg 'x-single-active-consumer' for queue '{q}' in vhost '/' of queue type "
     "rabbit_stream_queue"),
])
def test_declare_refusals(open_conn, uid, kw, args, text):
    ch = open_conn().channel()
    code, reply = channel_error(ch.queue_declare, uid, **{"durable": True, **kw},
                                arguments={**S, **args})
    assert (code, reply) == (406, "PRECONDITION_FAILED - " + text.format(q=uid))


def test_declare_with_retention_and_redeclare(open_conn, stream, uid):
    ch = open_conn().channel()
    name = uid + "-r"
    ch.queue_declare(name, durable=True, arguments={**S, "x-max-age": "7D",
                                                    "x-max-length-bytes": 10_000_000,
                                                    "x-stream-max-segment-size-bytes": 1_000_000})
    try:
        ch.queue_declare(name, durable=True, arguments={**S, "x-max-age": "7D",
                                                        "x-max-length-bytes": 10_000_000,
                                                        "x-stream-max-segment-size-bytes": 1_000_000})
    finally:
        ch.queue_delete(name)
    code, reply = channel_error(ch.queue_declare, stream, durable=True,
                                arguments={**S, "x-max-age": "1D"})
    assert (code, reply) == (406, f"PRECONDITION_FAILED - inequivalent arg 'x-max-age' for queue "
                                  f"'{stream}' in vhost '/': received the value '1D' of type "
                                  f"'longstr' but current is none")


def test_consume_refusals(open_conn, stream):
    res = f"queue '{stream}' in vhost '/'"
    ch = open_conn().channel()
    code, reply = channel_error(ch.basic_consume, stream, lambda *a: None)
    assert (code, reply) == (406, f"PRECONDITION_FAILED - consumer prefetch count is not set for "
                                  f"'{res}'")
    c = open_conn()
    ch = c.channel()
    ch.basic_qos(prefetch_count=10)
    code, reply = connection_error(ch.basic_consume, stream, lambda *a: None, auto_ack=True)
    assert (code, reply) == (540, f"NOT_IMPLEMENTED - automatic acknowledgement not supported by "
                                  f"stream queues {res}")
    ch = open_conn().channel()
    code, reply = connection_error(ch.basic_get, stream)
    assert (code, reply) == (540, f"NOT_IMPLEMENTED - basic.get not supported by stream queues {res}")
    ch = open_conn().channel()
    code, reply = connection_error(ch.queue_purge, stream)
    assert (code, reply) == (540, f"NOT_IMPLEMENTED - queue.purge not supported by stream queues {res}")
    c = open_conn()
    ch = c.channel()
    ch.basic_qos(prefetch_count=10)

    def bad_offset():
        ch.basic_consume(stream, lambda *a: None, arguments={"x-stream-offset": "bogus"})
        c.process_data_events(time_limit=1)
    code, reply = connection_error(bad_offset)
    assert (code, reply) == (541, "INTERNAL_ERROR")


@pytest.mark.parametrize("how", ["nack", "nack-norequeue", "reject"])
def test_nack_and_reject_refused(open_conn, stream, how):
    c = open_conn()
    ch = c.channel()
    _publish(ch, stream, [b"1"])
    ch.basic_qos(prefetch_count=10)
    tags = []
    ch.basic_consume(stream, lambda c_, m, p, b: tags.append(m.delivery_tag),
                     arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 30
    while not tags and time.monotonic() < deadline:
        c.process_data_events(time_limit=0.05)

    def negative():
        if how == "reject":
            ch.basic_reject(tags[0], requeue=True)
        else:
            ch.basic_nack(tags[0], requeue=how == "nack")
        c.process_data_events(time_limit=2)
    code, reply = connection_error(negative)
    assert (code, reply) == (540, f"NOT_IMPLEMENTED - basic.nack and basic.reject not supported "
                                  f"by stream queues queue '{stream}' in vhost '/'")


def test_delete_reports_zero(open_conn, uid):
    ch = open_conn().channel()
    ch.queue_declare(uid, durable=True, arguments=S)
    _publish(ch, uid, [b"1", b"2"])
    assert ch.queue_delete(uid).method.message_count == 0
    ch.queue_declare(uid, durable=True, arguments=S)  # a new stream of that name is empty
    c = open_conn()
    assert _consume(c, c.channel(), uid, 0, "first", settle=0.3) == []
    ch.queue_delete(uid)


def test_routed_through_an_exchange(open_conn, stream, uid):
    c = open_conn()
    ch = c.channel()
    x = uid + "-x"
    ch.exchange_declare(x, "fanout")
    try:
        ch.queue_bind(stream, x)
        ch.confirm_delivery()
        ch.basic_publish(x, "rk", b"via")
        (m, _p, b), = _consume(c, ch, stream, 1, "first")
        assert (m.exchange, m.routing_key, b) == (x, "rk", b"via")
    finally:
        ch.exchange_delete(x)


def test_one_publish_to_a_stream_and_a_durable_queue(open_conn, stream, uid):
    """The confirm waits for both the log and the classic store; both hold the message."""
    c = open_conn()
    ch = c.channel()
    x, q = uid + "-fx", uid + "-cq"
    ch.exchange_declare(x, "fanout")
    ch.queue_declare(q, durable=True)
    try:
        ch.queue_bind(stream, x)
        ch.queue_bind(q, x)
        ch.confirm_delivery()
        for i in range(20):
            ch.basic_publish(x, "", b"both%d" % i, pika.BasicProperties(delivery_mode=2))
        assert ch.queue_declare(q, passive=True).method.message_count == 20
        got = _consume(c, ch, stream, 20, "first")
        assert _bodies(got) == [b"both%d" % i for i in range(20)]
    finally:
        ch.exchange_delete(x)
        ch.queue_delete(q)


def test_large_prefetch_past_the_output_buffer(open_conn, stream):
    """6 MB of deliveries for a prefetch of 10,000: delivery pauses at the connection's
    output high-water mark and resumes as the client reads, until every message came."""
    c = open_conn()
    ch = c.channel()
    body = b"z" * 2000
    for i in range(3000):
        ch.basic_publish("", stream, b"%05d" % i + body)
    got = _consume(c, ch, stream, 3000, "first", prefetch=10000)
    assert [b[:5] for b in _bodies(got)] == [b"%05d" % i for i in range(3000)]


def test_transaction_publishes(open_conn, stream):
    c = open_conn()
    ch = c.channel()
    ch.tx_select()
    ch.basic_publish("", stream, b"t1")
    ch.basic_publish("", stream, b"t2")
    ch.tx_commit()
    c2 = open_conn()
    assert _bodies(_consume(c2, c2.channel(), stream, 2, "first")) == [b"t1", b"t2"]


def test_aio_pika_consume(target, stream):
    aio_pika = pytest.importorskip("aio_pika")
    import asyncio
    params = target[0]

    async def main():
        conn = await aio_pika.connect_robust(host=params.host, port=params.port,
                                             login="guest", password="guest",
                                             virtualhost=params.virtual_host)
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            for i in range(3):
                await ch.default_exchange.publish(aio_pika.Message(b"a%d" % i), routing_key=stream)
            await ch.set_qos(prefetch_count=10)
            q = await ch.get_queue(stream, ensure=False)
            got = []
            async with q.iterator(arguments={"x-stream-offset": "first"}) as it:
                async for message in it:
                    got.append((message.body, message.headers["x-stream-offset"]))
                    await message.ack()
                    if len(got) == 3:
                        break
            return got
    assert asyncio.run(asyncio.wait_for(main(), 60)) == [(b"a0", 0), (b"a1", 1), (b"a2", 2)]


# ---- TrioMQ only: 3.13's filters, restarts ----

@pytest.fixture
def triomq_only(target):
    if target[1] != "triomq":
        pytest.skip("RabbitMQ 3.10 has no stream filters")


def test_filter_values(open_conn, stream, triomq_only):
    c = open_conn()
    ch = c.channel()
    values = ["red", "blue", None, "red", "green", None]
    _publish(ch, stream, [b"%d" % i for i in range(6)],
             [{"x-stream-filter-value": v} if v else {} for v in values])
    got = _consume(c, ch, stream, 2, "first", extra={"x-stream-filter": "red"}, settle=0.3)
    assert _bodies(got) == [b"0", b"3"]
    got = _consume(c, ch, stream, 2, "first", extra={"x-stream-filter": ["blue", "green"]},
                   settle=0.3)
    assert _bodies(got) == [b"1", b"4"]
    got = _consume(c, ch, stream, 4, "first", settle=0.3,
                   extra={"x-stream-filter": "red", "x-stream-match-unfiltered": True})
    assert _bodies(got) == [b"0", b"2", b"3", b"5"]
    assert got[0][1].headers["x-stream-filter-value"] == "red"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hard", [False, True], ids=["restart", "kill-9"])
def test_survives_restart(tmp_path, hard):
    b = BrokerProc(tmp_path / "data").start()
    try:
        c = b.connect()
        ch = c.channel()
        ch.queue_declare("st", durable=True, arguments={**S, "x-max-age": "7D"})
        _publish(ch, "st", [b"p%d" % i for i in range(100)])  # every one confirmed
        c.close()
        b.restart(hard=hard)
        c = b.connect()
        ch = c.channel()
        assert ch.queue_declare("st", passive=True).method.message_count == 100
        got = _consume(c, ch, "st", 100, "first")
        assert _bodies(got) == [b"p%d" % i for i in range(100)]
        _publish(ch, "st", [b"after"])
        (_m, p, b_), = _consume(c, ch, "st", 1, "last")
        assert (b_, p.headers["x-stream-offset"]) == (b"after", 100)
        c.close()
    finally:
        b.stop()


@pytest.mark.timeout(300)
def test_kill_9_while_publishing_keeps_every_confirmed_message(tmp_path):
    """A publisher with 500 unconfirmed in flight; the broker is killed (SIGKILL) from the
    confirm callback once 3,000 are confirmed. After the restart the stream holds at least
    every confirmed message, in publish order, and takes publishes at the next offset."""
    import os
    import signal
    b = BrokerProc(tmp_path / "data").start()
    try:
        c = b.connect()
        c.channel().queue_declare("kst", durable=True, arguments=S)
        c.close()
        conn = pika.SelectConnection(pika.ConnectionParameters("127.0.0.1", b.port))
        state = {"sent": 0, "acked": 0, "ch": None, "killed": False}

        def pump():
            ch = state["ch"]
            while not state["killed"] and state["sent"] - state["acked"] < 500:
                ch.basic_publish("", "kst", b"%08d" % state["sent"])
                state["sent"] += 1

        def on_confirm(frame):
            m = frame.method
            assert isinstance(m, pika.spec.Basic.Ack)
            state["acked"] = m.delivery_tag if m.multiple else state["acked"] + 1
            if state["acked"] >= 3000 and not state["killed"]:
                state["killed"] = True
                os.kill(b.proc.pid, signal.SIGKILL)
            elif not state["killed"]:
                pump()

        def on_channel(ch):
            state["ch"] = ch
            ch.confirm_delivery(on_confirm, callback=lambda _f: pump())

        conn.add_on_open_callback(lambda c_: c_.channel(on_open_callback=on_channel))
        conn.add_on_close_callback(lambda *_a: conn.ioloop.stop())
        conn.add_on_open_error_callback(lambda *_a: conn.ioloop.stop())
        conn.ioloop.start()
        assert state["killed"]
        confirmed = state["acked"]
        b.proc.wait(30)
        b.start()
        c = b.connect()
        ch = c.channel()
        # Consume exactly what is stored: a surplus still in pika's buffer at basic_cancel
        # is rejected by pika, which a stream refuses (540, as RabbitMQ).
        stored = ch.queue_declare("kst", passive=True).method.message_count
        assert stored >= confirmed
        got = _consume(c, ch, "kst", stored, "first")
        assert len(got) == stored
        assert [int(body) for body in _bodies(got)] == list(range(len(got)))
        _publish(ch, "kst", [b"after"])
        (_m, p, body), = _consume(c, ch, "kst", 1, "last")
        assert (body, p.headers["x-stream-offset"]) == (b"after", stored)
        c.close()
    finally:
        b.stop()
