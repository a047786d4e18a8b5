"""The channel layer through a broker Session (sans-IO: bytes in, frames out), and a few
round trips through the real server running in-process."""
from __future__ import annotations

import pytest
import trio

from broker.amqp import spec
from broker.amqp.codec import method_frame

from .support import (
    TrioClient,
    channel_close,
    connection_close,
    methods,
    publish_frames,
)


def deliveries(written) -> list:
    return [w for w in written if isinstance(w.method, spec.Basic.Deliver)]


def test_publish_consume_ack(session_client, broker):
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "q")
    assert c.publish(1, b"hello", routing_key="q", content_type="text/plain",
                     headers={"k": "v"}) == []
    written = c.consume(1, "q", tag="ctag")
    [d] = deliveries(written)
    assert d.body == b"hello"
    assert d.method.consumer_tag == "ctag" and d.method.delivery_tag == 1
    assert not d.method.redelivered
    assert d.method.routing_key == "q" and d.method.exchange == ""
    assert d.properties["content_type"] == "text/plain"
    assert d.headers == {"k": b"v"}
    q = broker.vhosts["/"].queues["q"]
    assert q.unacked_count == 1
    assert c.call(1, spec.Basic.Ack(1, False)) == []
    assert q.unacked_count == 0 and q.message_count == 0


def test_prefetch_limits_unacked_and_ack_multiple_releases(session_client):
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "q")
    c.ok(1, spec.Basic.Qos(0, 2, False), spec.Basic.QosOk)
    for i in range(5):
        c.publish(1, str(i).encode(), routing_key="q")
    got = deliveries(c.consume(1, "q"))
    assert [d.body for d in got] == [b"0", b"1"]
    got = deliveries(c.call(1, spec.Basic.Ack(2, True)))
    assert [d.body for d in got] == [b"2", b"3"]
    assert [d.method.delivery_tag for d in got] == [3, 4]


def test_nack_requeue_redelivers_in_order(session_client):
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "q")
    for b in (b"a", b"b", b"c"):
        c.publish(1, b, routing_key="q")
    got = deliveries(c.consume(1, "q", tag="t"))
    assert [d.body for d in got] == [b"a", b"b", b"c"]
    c.call(1, spec.Basic.Cancel("t"))
    c.call(1, spec.Basic.Nack(0, True, True))  # everything back
    again = [c.ok(1, spec.Basic.Get(queue="q", no_ack=True)) for _ in range(3)]
    assert [m.redelivered for m in again] == [True, True, True]
    assert [m.message_count for m in again] == [2, 1, 0]


def test_basic_get(session_client):
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "q")
    assert isinstance(c.ok(1, spec.Basic.Get(queue="q")), spec.Basic.GetEmpty)
    c.publish(1, b"x", routing_key="q")
    [w] = c.call(1, spec.Basic.Get(queue="q"))
    assert isinstance(w.method, spec.Basic.GetOk) and w.body == b"x"
    assert w.method.delivery_tag == 1 and w.method.message_count == 0
    c.call(1, spec.Basic.Reject(1, True))
    [w] = c.call(1, spec.Basic.Get(queue="q", no_ack=True))
    assert w.method.redelivered and w.method.delivery_tag == 2


def test_unknown_delivery_tag_closes_the_channel_only(session_client):
    c = session_client()
    c.open_channel(1)
    c.open_channel(2)
    close = channel_close(c.call(1, spec.Basic.Ack(99, False)))
    assert close.reply_code == spec.PRECONDITION_FAILED
    assert close.reply_text == "PRECONDITION_FAILED - unknown delivery tag 99"
    assert (close.class_id, close.method_id) == (60, 80)
    assert c.conn.channel_is_open(2)
    c.declare_queue(2, "still-works")


def test_errors_from_the_vhost_become_channel_close(session_client):
    c = session_client()
    c.open_channel(1)
    close = channel_close(c.call(1, spec.Queue.Declare(queue="nope", passive=True)))
    assert close.reply_code == spec.NOT_FOUND
    assert close.reply_text == "NOT_FOUND - no queue 'nope' in vhost '/'"
    assert (close.class_id, close.method_id) == (50, 10)
    # the closed channel's number can be reused after close-ok
    assert c.call(1, spec.Channel.CloseOk()) == []
    c.open_channel(1)


def test_reusing_a_consumer_tag_closes_the_connection(session_client):
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "q")
    c.consume(1, "q", tag="same")
    close = connection_close(c.call(1, spec.Basic.Consume(queue="q", consumer_tag="same")))
    assert close.reply_code == spec.NOT_ALLOWED
    assert close.reply_text == "NOT_ALLOWED - attempt to reuse consumer tag 'same'"


def test_exclusive_consumer(session_client):
    a, b = session_client(), session_client()
    a.open_channel(1)
    b.open_channel(1)
    a.declare_queue(1, "q")
    a.consume(1, "q", exclusive=True)
    close = channel_close(b.call(1, spec.Basic.Consume(queue="q")))
    assert close.reply_code == spec.ACCESS_REFUSED
    assert "in exclusive use" in close.reply_text


def test_exclusive_queue_of_another_connection_is_locked(session_client, broker):
    a, b = session_client(), session_client()
    a.open_channel(1)
    b.open_channel(1)
    a.declare_queue(1, "ex", exclusive=True)
    close = channel_close(b.call(1, spec.Basic.Get(queue="ex")))
    assert close.reply_code == spec.RESOURCE_LOCKED
    a.close_connection()
    a.drop()  # the edge calls connection_lost once the socket ends
    assert "ex" not in broker.vhosts["/"].queues


def test_closing_a_channel_requeues_its_unacked(session_client, broker):
    c = session_client()
    c.open_channel(1)
    c.open_channel(2)
    c.declare_queue(1, "q")
    c.publish(1, b"m", routing_key="q")
    assert len(deliveries(c.consume(1, "q"))) == 1
    written = c.call(1, spec.Channel.Close(200, "bye", 0, 0))
    assert methods(written) == [spec.Channel.CloseOk()]
    q = broker.vhosts["/"].queues["q"]
    assert q.message_count == 1 and q.consumer_count == 0
    [w] = c.call(2, spec.Basic.Get(queue="q", no_ack=True))
    assert w.method.redelivered and w.body == b"m"


def test_dropped_connection_requeues_to_another_consumer(session_client):
    a, b = session_client(), session_client()
    a.open_channel(1)
    b.open_channel(1)
    a.declare_queue(1, "q")
    a.consume(1, "q", tag="a")
    b.consume(1, "q", tag="b")
    # round robin starts with the first consumer: the publisher's own
    assert [d.body for d in deliveries(a.publish(1, b"1", routing_key="q"))] == [b"1"]
    assert b.output() == []
    a.drop()
    [d] = deliveries(b.output())
    assert d.body == b"1" and d.method.redelivered


def test_mandatory_unroutable_is_returned(session_client):
    c = session_client()
    c.open_channel(1)
    [ret] = c.publish(1, b"lost", exchange="amq.direct", routing_key="nobody", mandatory=True)
    assert isinstance(ret.method, spec.Basic.Return)
    assert (ret.method.reply_code, ret.method.reply_text) == (312, "NO_ROUTE")
    assert ret.body == b"lost"
    assert c.publish(1, b"lost", exchange="amq.direct", routing_key="nobody") == []


def test_publish_errors(session_client):
    c = session_client()
    c.open_channel(1)
    close = channel_close(c.publish(1, b"x", exchange="missing"))
    assert close.reply_code == spec.NOT_FOUND
    assert close.reply_text == "NOT_FOUND - no exchange 'missing' in vhost '/'"
    c.call(1, spec.Channel.CloseOk())
    c.open_channel(1)
    c.ok(1, spec.Exchange.Declare(exchange="int", type="fanout", internal=True),
         spec.Exchange.DeclareOk)
    close = channel_close(c.publish(1, b"x", exchange="int"))
    assert close.reply_code == spec.ACCESS_REFUSED
    c.call(1, spec.Channel.CloseOk())
    c.open_channel(1)
    close = channel_close(c.publish(1, b"x", routing_key="q", expiration="soon"))
    assert close.reply_code == spec.PRECONDITION_FAILED
    assert "invalid expiration 'soon'" in close.reply_text
    c.call(1, spec.Channel.CloseOk())
    c.open_channel(1)
    close = channel_close(c.publish(1, b"x", routing_key="q", user_id="mallory"))
    assert close.reply_code == spec.PRECONDITION_FAILED
    assert "user_id property set to 'mallory' but authenticated user was 'guest'" in close.reply_text


def test_publisher_confirms_one_ack_per_batch(session_client):
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "q")
    c.ok(1, spec.Confirm.Select(), spec.Confirm.SelectOk)
    frames = b"".join(publish_frames(1, b"m", "", "q") for _ in range(3))
    assert methods(c.send(frames)) == [spec.Basic.Ack(3, True)]
    assert methods(c.publish(1, b"m", "", "unrouted")) == [spec.Basic.Ack(4, False)]


def test_confirms_nack_when_the_queue_refuses(session_client):
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "q", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    c.ok(1, spec.Confirm.Select(), spec.Confirm.SelectOk)
    assert methods(c.publish(1, b"1", routing_key="q")) == [spec.Basic.Ack(1, False)]
    assert methods(c.publish(1, b"2", routing_key="q")) == [spec.Basic.Nack(2, False, False)]


def test_tx_commit_and_rollback(session_client, broker):
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "q")
    q = broker.vhosts["/"].queues["q"]
    c.ok(1, spec.Tx.Select(), spec.Tx.SelectOk)
    c.publish(1, b"1", routing_key="q")
    assert q.message_count == 0
    c.ok(1, spec.Tx.Rollback(), spec.Tx.RollbackOk)
    c.ok(1, spec.Tx.Commit(), spec.Tx.CommitOk)
    assert q.message_count == 0
    c.publish(1, b"2", routing_key="q")
    c.ok(1, spec.Tx.Commit(), spec.Tx.CommitOk)
    assert q.message_count == 1
    close = channel_close(c.call(1, spec.Confirm.Select()))
    assert close.reply_code == spec.PRECONDITION_FAILED
    assert "cannot switch from tx to confirm mode" in close.reply_text


def test_queue_delete_cancels_consumers_after_delete_ok(session_client):
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "q")
    c.consume(1, "q", tag="t")
    written = methods(c.call(1, spec.Queue.Delete(queue="q")))
    assert written == [spec.Queue.DeleteOk(0), spec.Basic.Cancel("t", True)]


def test_no_cancel_notification_without_the_capability(session_client):
    a = session_client(capabilities={})
    b = session_client()
    a.open_channel(1)
    b.open_channel(1)
    a.declare_queue(1, "q")
    a.consume(1, "q", tag="t")
    b.ok(1, spec.Queue.Delete(queue="q"), spec.Queue.DeleteOk)
    assert a.output() == []


def test_queue_declare_ok_counts_and_last_queue(session_client):
    c = session_client()
    c.open_channel(1)
    ok = c.declare_queue(1, "")
    assert ok.queue.startswith("amq.gen-") and (ok.message_count, ok.consumer_count) == (0, 0)
    c.publish(1, b"m", routing_key=ok.queue)
    # an empty queue name means the channel's last declared queue
    assert c.ok(1, spec.Queue.Purge(queue=""), spec.Queue.PurgeOk).message_count == 1
    c.consume(1, "")
    again = c.declare_queue(1, ok.queue, passive=True)
    assert (again.message_count, again.consumer_count) == (0, 1)


def test_empty_queue_name_without_a_declared_queue(session_client):
    c = session_client()
    c.open_channel(1)
    close = channel_close(c.call(1, spec.Basic.Get(queue="")))
    assert close.reply_code == spec.NOT_FOUND
    assert close.reply_text == "NOT_FOUND - no previously declared queue"


# ---- through the real server, in-process --------------------------------------------------------
async def test_round_trip_through_the_server(inprocess_broker):
    pub = await TrioClient.connect(inprocess_broker.port)
    sub = await TrioClient.connect(inprocess_broker.port)
    for client in (pub, sub):
        await client.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    await sub.call(1, spec.Queue.Declare(queue="rt"), spec.Queue.DeclareOk)
    await sub.call(1, spec.Basic.Consume(queue="rt", consumer_tag="c", no_ack=True),
                   spec.Basic.ConsumeOk)
    await pub.call(1, spec.Confirm.Select(), spec.Confirm.SelectOk)
    body = bytes(range(256)) * 1200  # larger than one frame
    await pub.publish(1, body, routing_key="rt", message_id="m1")
    assert (await pub.expect(spec.Basic.Ack)).method.delivery_tag == 1
    got = await sub.expect(spec.Basic.Deliver)
    assert got.body == body and got.properties["message_id"] == "m1"
    await pub.call(0, spec.Connection.Close(200, "bye", 0, 0), spec.Connection.CloseOk)
    await pub.aclose()
    await sub.aclose()


async def test_dropped_socket_releases_exclusive_queue(inprocess_broker):
    c = await TrioClient.connect(inprocess_broker.port)
    await c.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    await c.call(1, spec.Queue.Declare(queue="mine", exclusive=True), spec.Queue.DeclareOk)
    vhost = inprocess_broker.broker.vhosts["/"]
    deleted = trio.Event()
    vhost.on_queue_deleted.append(lambda q, consumers: deleted.set())
    assert "mine" in vhost.queues
    await c.aclose()
    with trio.fail_after(5):
        await deleted.wait()
    assert "mine" not in vhost.queues


async def test_shutdown_closes_connections_with_320(inprocess_broker, nursery):
    c = await TrioClient.connect(inprocess_broker.port)
    await c.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    nursery.start_soon(inprocess_broker.server.shutdown)
    close = (await c.expect(spec.Connection.Close)).method
    assert close.reply_code == 320
    assert close.reply_text == ("CONNECTION_FORCED - broker forced connection closure with "
                                "reason 'shutdown'")
    await c.send(method_frame(0, spec.Connection.CloseOk()))
    assert await c.eof()
    with pytest.raises(OSError):  # the listener is closed
        await trio.open_tcp_stream("127.0.0.1", inprocess_broker.port)

