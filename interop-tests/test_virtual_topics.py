"""ActiveMQ's virtual topics and composite destinations with pika, on a TrioMQ subprocess
(restart included). TrioMQ only: RabbitMQ has neither (a publish to a missing exchange is
404 there, an unknown routing key unroutable)."""
from __future__ import annotations

import time

import pika
import pytest
from brokerproc import BrokerProc
from helpers import wait_for


@pytest.fixture(autouse=True)
def _triomq_only(external_broker):
    if external_broker:
        pytest.skip("virtual topics and composite destinations are TrioMQ's (ActiveMQ's)")


@pytest.fixture
def proc(tmp_path):
    p = BrokerProc(tmp_path / "data").start()
    yield p
    p.stop()


def test_virtual_topic_groups_and_restart(proc):
    conn = proc.connect()
    ch = conn.channel()
    got: dict[str, list] = {"a1": [], "a2": [], "b": []}
    # consumers of group A (two, load-balanced) and B: their queues appear on first use
    for tag, queue in (("a1", "Consumer.A.VirtualTopic.Orders"), ("a2", "Consumer.A.VirtualTopic.Orders"),
                       ("b", "Consumer.B.VirtualTopic.Orders")):
        ch.basic_consume(queue, lambda c, m, p, b, tag=tag: got[tag].append(b), auto_ack=True,
                         consumer_tag=tag)
    pub = conn.channel()
    pub.confirm_delivery()
    for i in range(10):
        pub.basic_publish("VirtualTopic.Orders", "", b"%d" % i,
                          pika.BasicProperties(delivery_mode=2))
    wait_for(lambda: len(got["a1"]) + len(got["a2"]) == 10 and len(got["b"]) == 10, conn=conn,
             msg="deliveries")
    assert len(got["a1"]) == len(got["a2"]) == 5  # round robin inside the group
    assert sorted(got["b"]) == sorted(b"%d" % i for i in range(10))
    conn.close()
    # the mapping is plain exchanges, queues and bindings, and durable
    proc.restart()
    conn = proc.connect()
    ch = conn.channel()
    ch.exchange_declare("VirtualTopic.Orders", passive=True)
    ch.queue_declare("Consumer.B.VirtualTopic.Orders", passive=True)
    ch.confirm_delivery()
    ch.basic_publish("", "VirtualTopic.Orders", b"after", pika.BasicProperties(delivery_mode=2))
    for queue in ("Consumer.A.VirtualTopic.Orders", "Consumer.B.VirtualTopic.Orders"):
        deadline = time.monotonic() + 5
        body = None
        while body is None and time.monotonic() < deadline:
            _m, _p, body = ch.basic_get(queue, auto_ack=True)
        assert body == b"after", queue
    conn.close()


def test_composite_destination(proc):
    conn = proc.connect()
    ch = conn.channel()
    ch.queue_declare("queue.a", durable=True)
    ch.exchange_declare("audit", "fanout", durable=True)
    ch.queue_declare("audit.log", durable=True)
    ch.queue_bind("audit.log", "audit")
    ch.confirm_delivery()
    ch.basic_publish("", "queue.a,queue.b,topic://audit", b"one", pika.BasicProperties(delivery_mode=2))
    ch.basic_publish("queue.a,queue.b,topic://audit", "", b"two", pika.BasicProperties(delivery_mode=2))
    for q in ("queue.a", "queue.b", "audit.log"):
        assert ch.queue_declare(q, passive=True).method.message_count == 2, q
    conn.close()
    proc.restart()
    conn = proc.connect()
    ch = conn.channel()
    ch.exchange_declare("queue.a,queue.b,topic://audit", passive=True)
    assert ch.queue_declare("queue.b", passive=True).method.message_count == 2
    conn.close()
