"""Direct reply-to (``amq.rabbitmq.reply-to``): RPC without a reply queue, as RabbitMQ has it.

The requester's channel consumes the pseudo-queue with no-ack, publishes requests with
``reply_to=amq.rabbitmq.reply-to``; the broker rewrites that to a name of its own, and a
reply published to the default exchange with that name goes straight to the consumer.
Checked with pika, aio-pika and kombu (the Java client: test_java_client.py), on both brokers.
"""
from __future__ import annotations

import asyncio
import time
import uuid

import pika
import pytest
from helpers import get_one

REPLY_TO = "amq.rabbitmq.reply-to"


def _wait(conn, pred, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"{what} not seen within {timeout}s"
        conn.process_data_events(0.05)


def _closed_with(fn):
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        fn()
    return ei.value.reply_code, ei.value.reply_text


def _requester(connect):
    conn = connect()
    ch = conn.channel()
    replies: list = []
    tag = ch.basic_consume(REPLY_TO, lambda c, m, p, b: replies.append((m, p, b)), auto_ack=True)
    return conn, ch, tag, replies


def _request(ch, queue, body, correlation_id):
    ch.basic_publish("", queue, body, pika.BasicProperties(reply_to=REPLY_TO,
                                                           correlation_id=correlation_id))


def test_capability_advertised(conn):
    assert conn._impl.server_properties["capabilities"].get("direct_reply_to") is True


def test_passive_declare_of_the_pseudo_queue(ch):
    # what frameworks (Spring AMQP's RabbitTemplate, async RPC clients) check at start-up
    ok = ch.queue_declare(REPLY_TO, passive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (REPLY_TO, 0, 1)


def test_pika_rpc_round_trip(connect, uid, cleanup):
    q = cleanup.queue(uid)
    server = connect().channel()
    server.queue_declare(q)
    conn, ch, tag, replies = _requester(connect)
    _request(ch, q, b"ping", "c-1")
    _, props, body = get_one(server, q)
    assert body == b"ping" and props.correlation_id == "c-1"
    name = props.reply_to
    assert name.startswith(REPLY_TO + ".") and len(name) > len(REPLY_TO) + 2
    # a live requester's reply name can be declared passively (0 messages, 1 consumer)
    ok = server.queue_declare(name, passive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 1)
    # the same channel's next request carries the same name
    _request(ch, q, b"ping2", "c-2")
    assert get_one(server, q)[1].reply_to == name
    server.basic_publish("", name, b"pong", pika.BasicProperties(correlation_id="c-1"))
    server.basic_publish("", name, b"pong2", pika.BasicProperties(correlation_id="c-2"))
    _wait(conn, lambda: len(replies) == 2, what="the replies")
    (m1, p1, b1), (m2, p2, b2) = replies
    assert (b1, p1.correlation_id, b2, p2.correlation_id) == (b"pong", "c-1", b"pong2", "c-2")
    assert (m1.consumer_tag, m1.exchange, m1.routing_key, m1.redelivered) == (tag, "", name, False)


def test_mandatory_reply_is_delivered_and_returned(connect, uid, cleanup):
    # The reply name is not a queue: a mandatory reply is always returned (NO_ROUTE), and
    # delivered too when the requester is live.
    q = cleanup.queue(uid)
    server_conn = connect()
    server = server_conn.channel()
    server.queue_declare(q)
    returned: list = []
    server.add_on_return_callback(lambda c, m, p, b: returned.append((m.reply_code, m.reply_text, b)))
    conn, ch, _, replies = _requester(connect)
    _request(ch, q, b"req", "1")
    name = get_one(server, q)[1].reply_to
    server.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        server.basic_publish("", name, b"answer", mandatory=True)
    _wait(conn, lambda: replies, what="the reply")
    assert replies[0][2] == b"answer"
    _wait(server_conn, lambda: returned, what="the return")
    assert returned == [(312, "NO_ROUTE", b"answer")]


def test_reply_to_a_requester_that_is_gone(connect, uid, cleanup):
    q = cleanup.queue(uid)
    server_conn = connect()
    server = server_conn.channel()
    server.queue_declare(q)
    conn, ch, _, _ = _requester(connect)
    _request(ch, q, b"req", "1")
    name = get_one(server, q)[1].reply_to
    conn.close()
    returned: list = []
    server.add_on_return_callback(lambda c, m, p, b: returned.append((m.reply_code, b)))
    server.basic_publish("", name, b"late")  # dropped, the channel stays open
    server.basic_publish("", name, b"late-mandatory", mandatory=True)
    _wait(server_conn, lambda: returned, what="the return")
    assert returned == [(312, b"late-mandatory")]
    code, text = _closed_with(lambda: server.queue_declare(name, passive=True))
    assert (code, text) == (404, f"NOT_FOUND - no queue '{name}' in vhost '/'")


def test_consume_must_be_no_ack(connect):
    ch = connect().channel()
    assert _closed_with(lambda: ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=False)) == (
        406, "PRECONDITION_FAILED - reply consumer cannot acknowledge")


def test_one_reply_consumer_per_channel(connect):
    ch = connect().channel()
    ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
    assert _closed_with(lambda: ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)) == (
        406, "PRECONDITION_FAILED - reply consumer already set")


def test_request_needs_a_reply_consumer(connect, uid, cleanup):
    q = cleanup.queue(uid)
    conn = connect()
    ch = conn.channel()
    ch.queue_declare(q)
    expected = (406, "PRECONDITION_FAILED - fast reply consumer does not exist")
    assert _closed_with(lambda: (_request(ch, q, b"x", "1"), ch.queue_declare(q))) == expected
    # nor after the reply consumer was cancelled
    ch = conn.channel()
    tag = ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
    ch.basic_cancel(tag)
    assert _closed_with(lambda: (_request(ch, q, b"x", "1"), ch.queue_declare(q))) == expected


def test_basic_get_on_the_pseudo_queue_is_not_found(ch):
    assert _closed_with(lambda: ch.basic_get(REPLY_TO)) == (
        404, f"NOT_FOUND - no queue '{REPLY_TO}' in vhost '/'")


def test_aio_pika_rpc(amqp_params, uid, cleanup):
    import aio_pika

    q_name = cleanup.queue(uid)

    async def main():
        conn = await aio_pika.connect(amqp_params.url)
        async with conn:
            server_ch = await conn.channel()
            queue = await server_ch.declare_queue(q_name)

            async def serve(message):
                async with message.process():
                    await server_ch.default_exchange.publish(
                        aio_pika.Message(message.body.upper(),
                                         correlation_id=message.correlation_id),
                        routing_key=message.reply_to)

            await queue.consume(serve)
            ch = await conn.channel()
            # as async RPC frameworks do at start-up: a passive declare, then a no-ack consume
            reply_queue = await ch.declare_queue(REPLY_TO, passive=True)
            futures: dict[str, asyncio.Future] = {}

            async def on_reply(message):
                futures.pop(message.correlation_id).set_result(message)

            await reply_queue.consume(on_reply, no_ack=True)
            loop = asyncio.get_running_loop()
            for i in range(20):
                cid = str(uuid.uuid4())
                futures[cid] = loop.create_future()
                fut = futures[cid]
                await ch.default_exchange.publish(
                    aio_pika.Message(f"req-{i}".encode(), reply_to=REPLY_TO, correlation_id=cid),
                    routing_key=q_name)
                reply = await asyncio.wait_for(fut, 10)
                assert reply.body == f"REQ-{i}".encode() and reply.correlation_id == cid
                assert reply.routing_key.startswith(REPLY_TO + ".")

    asyncio.run(main())


def test_kombu_rpc(amqp_params, uid, cleanup):

    from kombu import Connection, Consumer, Producer, Queue

    q_name = cleanup.queue(uid)
    with Connection(amqp_params.url, connect_timeout=10) as requester, \
            Connection(amqp_params.url, connect_timeout=10) as server:
        server_q = Queue(q_name, exchange="", routing_key=q_name, channel=server.default_channel)
        server_q.declare()
        replies: list = []
        reply_q = Queue(REPLY_TO, no_ack=True, no_declare=True)
        with Consumer(requester.default_channel, queues=[reply_q], no_ack=True,
                      callbacks=[lambda body, message: replies.append((body, message))]):
            producer = Producer(requester.default_channel)
            producer.publish({"n": 1}, exchange="", routing_key=q_name, reply_to=REPLY_TO,
                             correlation_id="k-1", serializer="json")
            deadline = time.monotonic() + 10
            request = None
            while request is None:
                assert time.monotonic() < deadline, "the request did not arrive"
                request = server_q.get(no_ack=True)
                if request is None:
                    time.sleep(0.02)
            reply_to = request.properties["reply_to"]
            assert reply_to.startswith(REPLY_TO + ".")
            Producer(server.default_channel).publish(
                {"n": request.payload["n"] + 1}, exchange="", routing_key=reply_to,
                correlation_id=request.properties["correlation_id"], serializer="json")
            while not replies:
                assert time.monotonic() < deadline, "the reply did not arrive"
                try:
                    requester.drain_events(timeout=0.2)
                except TimeoutError:
                    pass
        body, message = replies[0]
        assert body == {"n": 2} and message.properties["correlation_id"] == "k-1"
