"""Any node serves any client: two TrioMQ nodes on a REAL etcd, driven by pika. A client on
one node publishes (with confirms) to and consumes from a queue mastered on the other, through
the node-to-node link; the queue-master locator places new queues; the link's login needs the
cluster secret."""
from __future__ import annotations

import time

import pika
import pytest

from .test_cluster_nodes import eventually, node, status


def _has_proxy(broker, name):
    def check():
        c = broker.connect()
        try:
            c.channel().queue_declare(name, durable=True, passive=True)
        finally:
            if c.is_open:
                c.close()
    return check


@pytest.mark.timeout(90)
def test_publish_and_consume_through_another_node(tmp_path, etcd, secret):
    a = node(tmp_path, etcd, "a", secret).start()
    b = node(tmp_path, etcd, "b", secret).start()
    try:
        ca = a.connect()
        cha = ca.channel()
        cha.queue_declare("qa", durable=True)
        cha.queue_bind("qa", "amq.direct", "k")
        eventually(_has_proxy(b, "qa"))
        time.sleep(0.3)  # the binding's record follows the queue's

        # b: publishes with confirms, persistent and transient, by name and through a binding
        cb = b.connect()
        chb = cb.channel()
        chb.confirm_delivery()
        for i in range(50):
            chb.basic_publish("", "qa", f"p{i}".encode(), pika.BasicProperties(delivery_mode=2),
                              mandatory=True)
        chb.basic_publish("", "qa", b"transient", mandatory=True)
        chb.basic_publish("amq.direct", "k", b"bound", pika.BasicProperties(
            delivery_mode=2, headers={"h": "v"}), mandatory=True)
        # confirmed by b only once a has them: they are on a now
        assert cha.queue_declare("qa", durable=True, passive=True).method.message_count == 52

        # b: consumes them (prefetch 10), acks; a's queue is empty afterwards
        chb.basic_qos(prefetch_count=10)
        got = []
        for method, props, body in chb.consume("qa", inactivity_timeout=5):
            assert method is not None, f"only {len(got)} delivered"
            got.append((method.exchange, method.routing_key, body, props.headers))
            chb.basic_ack(method.delivery_tag)
            if len(got) == 52:
                break
        chb.cancel()
        bodies = [g[2] for g in got]
        assert bodies[:50] == [f"p{i}".encode() for i in range(50)]
        # the forwarded message keeps its exchange, routing key and headers (no link header)
        assert got[-1] == ("amq.direct", "k", b"bound", {"h": "v"})
        assert got[50][:3] == ("", "qa", b"transient")
        eventually(lambda: cha.queue_declare("qa", durable=True, passive=True).method
                   .message_count == 0 or (_ for _ in ()).throw(AssertionError()))

        # unacked on b when the consumer's channel closes: redelivered (from a), flagged
        cha.basic_publish("", "qa", b"again", pika.BasicProperties(delivery_mode=2))
        ch2 = cb.channel()
        method, _, body = next(ch2.consume("qa", inactivity_timeout=5))
        assert body == b"again" and not method.redelivered
        ch2.close()
        ch3 = cb.channel()
        method, _, body = next(ch3.consume("qa", inactivity_timeout=5))
        assert body == b"again" and method.redelivered
        ch3.basic_ack(method.delivery_tag)
        ch3.cancel()

        # basic.get is not forwarded: 540 (a connection error) naming the master
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            cb.channel().basic_get("qa")
        assert closed.value.reply_code == 540 and "node 'a'" in closed.value.reply_text
        cb = b.connect()

        # the locator: min-masters places a new queue declared on a on b (it masters fewer)
        cha.queue_declare("placed", durable=True,
                          arguments={"x-queue-master-locator": "min-masters"})
        eventually(lambda: {q["name"]: q["master"] for q in status(etcd)["queues"]}
                   .get("placed") == "b" or (_ for _ in ()).throw(AssertionError()))
        cha.confirm_delivery()
        cha.basic_publish("", "placed", b"to b", pika.BasicProperties(delivery_mode=2),
                          mandatory=True)
        chb = cb.channel()
        assert chb.queue_declare("placed", durable=True, passive=True).method.message_count == 1
        cb.close()
        # kombu (confirm_publish) on a, and aio-pika on a, through the link to b's master
        from kombu import Connection
        from kombu import Queue as KQueue
        with Connection(f"amqp://guest:guest@127.0.0.1:{a.port}//",
                        transport_options={"confirm_publish": True}) as kc:
            kq = KQueue("placed", routing_key="placed", durable=True)
            producer = kc.Producer()
            for i in range(5):
                producer.publish({"n": i}, routing_key="placed", declare=[kq], delivery_mode=2,
                                 serializer="json")
            with kc.SimpleQueue(kq) as sq:
                got = [sq.get(timeout=5) for _ in range(6)]
                for m in got:
                    m.ack()
            assert got[0].body == b"to b" and [m.payload for m in got[1:]] == [
                {"n": i} for i in range(5)]

        import asyncio

        import aio_pika

        async def with_aio_pika():
            conn = await aio_pika.connect_robust(f"amqp://guest:guest@127.0.0.1:{a.port}/")
            async with conn:
                ch = await conn.channel(publisher_confirms=True)
                q = await ch.declare_queue("placed", durable=True)
                await ch.default_exchange.publish(aio_pika.Message(b"aio", delivery_mode=2),
                                                  routing_key="placed")
                async with q.iterator() as it:
                    async for message in it:
                        async with message.process():
                            return message.body
            return None
        assert asyncio.run(with_aio_pika()) == b"aio"

        # an unknown locator: 406 naming the argument
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ca.channel().queue_declare("bad", durable=True,
                                       arguments={"x-queue-master-locator": "nearest"})
        assert refused.value.reply_code == 406
        assert "x-queue-master-locator" in refused.value.reply_text

        # deleted through b: gone on its master a, and b's proxy goes with it
        cb = b.connect()
        cb.channel().queue_delete("qa")
        eventually(lambda: "qa" not in {q["name"] for q in status(etcd)["queues"]}
                   or (_ for _ in ()).throw(AssertionError()))
        cb.close()
        ca.close()
    finally:
        b.stop()
        a.stop()
