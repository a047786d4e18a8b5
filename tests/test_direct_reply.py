"""Direct reply-to through a Session (sans-IO): the pseudo-queue, the reply name, replies
straight to the consumer, and the registry emptied when the requester goes."""
from __future__ import annotations

from broker.amqp import spec
from broker.direct_reply import REPLY_PREFIX, REPLY_QUEUE, DirectReply, node_of

from .support import channel_close, connection_close, methods


def deliveries(written) -> list:
    return [w for w in written if isinstance(w.method, spec.Basic.Deliver)]


def _requester(c, channel=1):
    c.open_channel(channel)
    [ok] = methods(c.consume(channel, REPLY_QUEUE, tag="replies", no_ack=True))
    assert ok.consumer_tag == "replies"


def _reply_name(broker, c, server):
    c.publish(1, b"req", routing_key="rpc", reply_to=REPLY_QUEUE, correlation_id="7")
    got = server.ok(1, spec.Basic.Get(queue="rpc", no_ack=True), spec.Basic.GetOk)
    assert got
    return next(iter(broker.direct_reply.consumers))


def test_reply_goes_straight_to_the_consumer(broker, session_client):
    server = session_client()
    server.open_channel(1)
    server.declare_queue(1, "rpc")
    c = session_client()
    _requester(c)
    c.publish(1, b"req", routing_key="rpc", reply_to=REPLY_QUEUE, correlation_id="7")
    [got] = server.call(1, spec.Basic.Get(queue="rpc", no_ack=True))
    name = got.properties["reply_to"]
    assert name.startswith(REPLY_PREFIX) and name in broker.direct_reply.consumers
    assert got.properties["correlation_id"] == "7"
    # a queued delivery first: the reply takes the channel's next tag without using it up
    c.declare_queue(1, "other")
    server.publish(1, b"x", routing_key="other")
    [d0] = deliveries(c.consume(1, "other", tag="o"))
    assert server.publish(1, b"pong", routing_key=name, correlation_id="7") == []
    [d] = deliveries(c.output())
    assert d.body == b"pong" and d.properties["correlation_id"] == "7"
    assert (d.method.consumer_tag, d.method.exchange, d.method.routing_key) == ("replies", "", name)
    assert d.method.delivery_tag == d0.method.delivery_tag + 1
    server.publish(1, b"y", routing_key="other")
    [d1] = deliveries(c.output())
    assert d1.method.delivery_tag == d.method.delivery_tag  # RabbitMQ's: not taken
    assert broker.vhosts["/"].queues.get(name) is None  # no queue involved


def test_mandatory_reply_returned_even_when_delivered(broker, session_client):
    server = session_client()
    server.open_channel(1)
    server.declare_queue(1, "rpc")
    c = session_client()
    _requester(c)
    name = _reply_name(broker, c, server)
    written = server.publish(1, b"pong", routing_key=name, mandatory=True)
    [ret] = methods(written, spec.Basic.Return)
    assert (ret.reply_code, ret.reply_text, ret.routing_key) == (312, "NO_ROUTE", name)
    assert len(deliveries(c.output())) == 1


def test_requester_gone_unregisters(broker, session_client):
    server = session_client()
    server.open_channel(1)
    server.declare_queue(1, "rpc")
    c = session_client()
    _requester(c)
    name = _reply_name(broker, c, server)
    c.drop()
    assert broker.direct_reply.consumers == {}
    assert server.publish(1, b"late", routing_key=name) == []  # dropped, channel open
    close = channel_close(server.call(1, spec.Queue.Declare(queue=name, passive=True)))
    assert close.reply_code == 404


def test_cancel_unregisters_and_a_new_consume_gets_a_new_name(broker, session_client):
    server = session_client()
    server.open_channel(1)
    server.declare_queue(1, "rpc")
    c = session_client()
    _requester(c)
    first = _reply_name(broker, c, server)
    assert methods(c.call(1, spec.Basic.Cancel("replies"))) == [spec.Basic.CancelOk("replies")]
    assert broker.direct_reply.consumers == {}
    c.consume(1, REPLY_QUEUE, tag="again", no_ack=True)
    assert _reply_name(broker, c, server) != first


def test_consumer_tag_reuse(session_client):
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "q")
    c.consume(1, "q", tag="t")
    close = connection_close(c.call(1, spec.Basic.Consume(queue=REPLY_QUEUE, consumer_tag="t",
                                                          no_ack=True)))
    assert (close.reply_code, close.reply_text) == (530, "NOT_ALLOWED - attempt to reuse consumer tag 't'")


def test_transactional_request_is_rewritten_at_publish(broker, session_client):
    server = session_client()
    server.open_channel(1)
    server.declare_queue(1, "rpc")
    c = session_client()
    _requester(c)
    c.ok(1, spec.Tx.Select(), spec.Tx.SelectOk)
    c.publish(1, b"req", routing_key="rpc", reply_to=REPLY_QUEUE)
    c.ok(1, spec.Tx.Commit(), spec.Tx.CommitOk)
    [got] = server.call(1, spec.Basic.Get(queue="rpc", no_ack=True))
    assert got.properties["reply_to"] in broker.direct_reply.consumers


def test_reply_names():
    here = DirectReply("rabbit@a.example")
    assert here.node == "rabbit@a.example"
    other = DirectReply("b")
    other.forward = lambda node, vhost, message: None
    name = f"{REPLY_PREFIX}{'Yg'}.key"  # the node 'b', base64
    assert node_of(name) == "b"
    assert node_of(REPLY_PREFIX + "nodot") is None and node_of("amq.gen-x.y") is None
    assert other.exists(name) is False  # its own node: only live consumers exist
    assert here.exists(name) is False  # no forward: alone, nothing remote exists
    here.forward = other.forward
    assert here.exists(name) is True
