"""Virtual topics and composite destinations (broker/routing/) through a broker Session:
created on first use, visible as ordinary exchanges, queues and bindings."""
from __future__ import annotations

from broker.amqp import spec

from ..support import channel_close, methods


def deliveries(written) -> list:
    return [w for w in written if isinstance(w.method, spec.Basic.Deliver)]


def test_virtual_topic_groups(session_client, broker):
    vhost = broker.vhosts["/"]
    c = session_client()
    c.open_channel(1)
    # group A's queue exists from its first use: a consume on a queue nobody declared
    c.consume(1, "Consumer.A.VirtualTopic.Orders", tag="a1")
    c.consume(1, "Consumer.A.VirtualTopic.Orders", tag="a2")
    c.declare_queue(1, "Consumer.B.VirtualTopic.Orders", durable=True)
    x = vhost.exchanges["VirtualTopic.Orders"]
    assert x.type_name == "fanout" and x.durable
    assert {b.destination.name for b in x.bindings.values()} == {
        "Consumer.A.VirtualTopic.Orders", "Consumer.B.VirtualTopic.Orders"}
    # published as the exchange and as a routing key of the default exchange
    got = deliveries(c.publish(1, b"1", exchange="VirtualTopic.Orders", routing_key="any"))
    got += deliveries(c.publish(1, b"2", routing_key="VirtualTopic.Orders"))
    # group A load-balances between its two consumers; group B keeps both for later
    assert sorted((d.method.consumer_tag, d.body) for d in got) == [("a1", b"1"), ("a2", b"2")]
    assert vhost.queues["Consumer.B.VirtualTopic.Orders"].message_count == 2


def test_virtual_topic_publish_before_consumers(session_client, broker):
    c = session_client()
    c.open_channel(1)
    assert c.publish(1, b"lost", exchange="VirtualTopic.Events") == []  # no group yet
    assert "VirtualTopic.Events" in broker.vhosts["/"].exchanges
    c.declare_queue(1, "Consumer.X.VirtualTopic.Events", durable=True)
    c.publish(1, b"kept", exchange="VirtualTopic.Events")
    assert broker.vhosts["/"].queues["Consumer.X.VirtualTopic.Events"].message_count == 1


def test_composite_destination(session_client, broker):
    vhost = broker.vhosts["/"]
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "queue.a", durable=True)
    c.ok(1, spec.Exchange.Declare(exchange="audit", type="fanout", durable=True),
         spec.Exchange.DeclareOk)
    c.declare_queue(1, "audit-log")
    c.ok(1, spec.Queue.Bind(queue="audit-log", exchange="audit"), spec.Queue.BindOk)
    # routing key to the default exchange: queue.b is created on first use, topic:// is an exchange
    c.publish(1, b"one", routing_key="queue.a,queue.b,topic://audit")
    # the composite name as the exchange of basic.publish
    c.publish(1, b"two", exchange="queue.a,queue.b,topic://audit")
    for name in ("queue.a", "queue.b", "audit-log"):
        assert vhost.queues[name].message_count == 2, name
    x = vhost.exchanges["queue.a,queue.b,topic://audit"]
    assert x.type_name == "fanout" and x.durable
    assert sorted(b.destination.name for b in x.bindings.values()) == ["audit", "queue.a", "queue.b"]


def test_composite_bad_names(session_client, broker):
    c = session_client()
    c.open_channel(1)
    close = channel_close(c.publish(1, b"x", exchange="a,topic://missing"))
    assert close.reply_code == 404 and "exchange 'missing'" in close.reply_text
    c.open_channel(2)
    assert channel_close(c.publish(2, b"x", exchange="a,,b")).reply_code == 404
    c.open_channel(3)
    # an unroutable composite routing key is just unroutable (mandatory: returned)
    written = c.publish(3, b"x", routing_key="b,amq.nope", mandatory=True)
    assert methods(written, spec.Basic.Return)
    assert "b" not in broker.vhosts["/"].queues


def test_ordinary_names_unchanged(session_client, broker):
    c = session_client()
    c.open_channel(1)
    close = channel_close(c.call(1, spec.Queue.Declare(queue="Consumer.A.nothing", passive=True)))
    assert close.reply_code == 404
    c.open_channel(2)
    assert channel_close(c.publish(2, b"x", exchange="no-such")).reply_code == 404
