"""AMQP 0-9-1 consumers of a stream on a follower's node read that node's copy (real etcd,
three real nodes, pika), as RabbitMQ reads locally on replicas: not a consumer on the
leader, deliveries with their offsets, new chunks as the copy commits them, on through a
failover; what a stream refuses is refused on the follower's node too."""
from __future__ import annotations

import pika
import pytest

from .test_cluster_nodes import eventually
from .test_mirroring_more import start_together
from .test_stream_replication import STREAM, api_stream, logged, stream_node

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.mark.timeout(180)
def test_amqp_consumers_on_a_followers_node_read_its_copy(tmp_path, etcd, secret):
    a, b, c = (stream_node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    try:
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("s", durable=True, arguments=STREAM)
        for f in (b, c):
            eventually(lambda f=f: logged(f, "replicating from node 'a'"), timeout=30)
        ch.confirm_delivery()
        for i in range(500):
            ch.basic_publish("", "s", b"m%03d" % i, PERSISTENT)

        def copied() -> None:
            assert (api_stream(a, "s").get("log_index") or {}).get("c") == 499
        eventually(copied, timeout=30)

        reader = c.connect()
        rch = reader.channel()
        rch.basic_qos(prefetch_count=10)  # credit: 10 at a time, acks return it
        deliveries = rch.consume("s", arguments={"x-stream-offset": 100},
                                 inactivity_timeout=30)
        got = []
        for method, props, body in deliveries:
            assert method is not None, len(got)
            assert props.headers["x-stream-offset"] == 100 + len(got)
            got.append(body)
            rch.basic_ack(method.delivery_tag)
            if len(got) == 400:
                break
        assert got == [b"m%03d" % i for i in range(100, 500)]
        # the leader serves no consumer: the reads were c's own
        leader_view = api_stream(a, "s")
        assert leader_view["consumers"] == 0, leader_view
        # what is published next reaches the reader as c's copy commits it
        for i in range(500, 510):
            ch.basic_publish("", "s", b"m%03d" % i, PERSISTENT)
        for method, _props, body in deliveries:
            assert method is not None, len(got)
            got.append(body)
            rch.basic_ack(method.delivery_tag)
            if len(got) == 410:
                break
        assert got[-10:] == [b"m%03d" % i for i in range(500, 510)]
        conn.close()

        # the leader killed: b (equal logs: by name) takes over, c copies from it; c's
        # reader is not cancelled, it goes on from c's copy where it was
        a.kill()
        eventually(lambda: logged(b, "leader on this node now"), timeout=60)
        eventually(lambda: logged(c, "replicating from node 'b'"), timeout=60)
        conn = b.connect()
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(510, 520):
            ch.basic_publish("", "s", b"m%03d" % i, PERSISTENT)
        for method, _props, body in deliveries:
            assert method is not None, len(got)
            got.append(body)
            rch.basic_ack(method.delivery_tag)
            if len(got) == 420:
                break
        assert got == [b"m%03d" % i for i in range(100, 520)]
        rch.cancel()

        # no prefetch: refused as the stream queue refuses it (RabbitMQ: 406)
        ch2 = reader.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch2.basic_consume("s", lambda *args: None, arguments={"x-stream-offset": "first"})
            reader.process_data_events(time_limit=10)
        assert refused.value.reply_code == 406, refused.value
        reader.close()
        conn.close()
    finally:
        for broker in (a, b, c):
            broker.stop()
